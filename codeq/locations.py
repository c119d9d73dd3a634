"""Names the user types for a model (`--model`) or a task source (`--source`): a local path, a
short alias ('smollm2', 'builtin') or a Hugging Face hub id. A name that is none of them is a
typo, and says so at once with a did-you-mean instead of being looked up on the hub (which, on a
machine without network access, retries for half a minute and then reads as a transient error).
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

# huggingface_hub's repo id rule: [namespace/]name of word characters, '-' and '.', neither
# starting with '.' or '-' nor holding '..' or '--'.
_HUB_ID = re.compile(r"(?:[\w.-]+/)?[\w.-]{1,96}")


def is_hub_id(name: str, *, namespace_required: bool = False) -> bool:
    """Whether `name` is spelt like a hub id (it may still not exist)."""
    return (
        bool(_HUB_ID.fullmatch(name))
        and not name.startswith((".", "-"))
        and ".." not in name
        and "--" not in name
        and (not namespace_required or "/" in name)
    )


@dataclass(frozen=True)
class Typo:
    """A name that is no existing path and no hub id either: a near miss of an alias ('alias')
    or a path that does not exist ('path'), and what it may have meant."""

    kind: str
    suggestion: str | None = None

    def did_you_mean(self) -> str:
        return f"did you mean {self.suggestion}? " if self.suggestion else ""


def near_alias(name: str, aliases: Sequence[str]) -> str | None:
    """The alias `name` is a near miss of ('smolm2' -> 'smollm2', 'Builtin' -> 'builtin')."""
    if not aliases or name in aliases:
        return None
    lowered = {alias.lower(): alias for alias in aliases}
    close = difflib.get_close_matches(name.lower(), list(lowered), n=1, cutoff=0.75)
    return lowered[close[0]] if close else None


def typo_of(
    name: str, aliases: Sequence[str] = (), *, namespace_required: bool = False
) -> Typo | None:
    """`name` (not an existing path) as a typo, or None when it may be a hub id: a near miss of
    an alias, or a name no hub id is spelt like (`./x`, `../x`, `/x`, `~/x`, `a/b/c`). A name
    spelt like a hub id is left to the hub (`data/debugbnch` may be a dataset): what it may have
    meant locally is `local_suggestion`'s, once the hub says no or cannot be reached."""
    alias = near_alias(name, aliases)
    if alias is not None:
        return Typo("alias", alias)
    if not is_hub_id(name, namespace_required=namespace_required):
        return Typo("path", local_suggestion(name))
    return None


def local_suggestion(name: str) -> str | None:
    """An existing path `name` may have meant: one edit away in the deepest folder of it that
    exists, else a folder of the same last part nearby."""
    return closest_path(name) or same_name_nearby(name)


def closest_path(name: str) -> str | None:
    """An existing path one step from `name`: in the deepest folder of `name` that exists, the
    entry closest to the next part ('data/debugbnch' -> 'data/debugbench')."""
    path = Path(name).expanduser()
    parts = path.parts
    for depth in range(len(parts) - 1, -1, -1):
        parent = Path(*parts[:depth]) if depth else Path(".")
        if not parent.is_dir():
            continue
        try:
            entries = sorted(entry.name for entry in parent.iterdir())
        except OSError:
            return None
        close = difflib.get_close_matches(parts[depth], entries, n=1, cutoff=0.7)
        if not close:
            return None
        found = parent / close[0]
        whole = found.joinpath(*parts[depth + 1 :])
        return _shown(whole, name) if whole.exists() else _shown(found, name) + "/"
    return None


def same_name_nearby(name: str, start: Path | None = None) -> str | None:
    """A folder named like `name`'s last part next to the working directory or one level up
    (`data/debugbench` -> `../shared/debugbench`): what a mistyped relative path often meant."""
    base = Path(name).name
    cwd = start or Path.cwd()
    if not base or base.startswith("."):
        return None
    for root in (cwd, cwd.parent):
        candidates = [root, *_folders(root)]
        for folder in candidates:
            found = folder / base
            if found.is_dir() and found != (cwd / name):
                return os.path.relpath(found, cwd)
    return None


def _folders(root: Path) -> list[Path]:
    try:
        return sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    except OSError:
        return []


def _shown(found: Path, typed: str) -> str:
    """`found` written the way the user wrote `typed` (relative stays relative, ~ stays ~)."""
    if typed.startswith("~"):
        home = Path.home()
        try:
            return "~/" + str(found.relative_to(home))
        except ValueError:
            return str(found)
    return str(found)
