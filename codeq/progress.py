"""Progress bars for long work (collect, evaluate, train): one helper so every stage's progress
reads the same on a terminal and in a Job's log."""

from __future__ import annotations

import sys
from typing import Any


def progress_bar(total: int, desc: str, unit: str = "task", enabled: bool = True) -> Any:
    """A tqdm bar on stderr with rate and ETA. On a terminal it redraws in place; in a log file
    (a Kubernetes Job) it writes a plain line at most every 30 seconds."""
    from tqdm import tqdm

    interactive = sys.stderr.isatty()
    return tqdm(
        total=total,
        desc=desc,
        unit=unit,
        file=sys.stderr,
        disable=not enabled,
        mininterval=0.5 if interactive else 30.0,
        ascii=not interactive,
        dynamic_ncols=interactive,
    )
