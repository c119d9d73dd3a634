from __future__ import annotations

from codeq.commands.common import not_built_yet


def command() -> None:
    raise not_built_yet("promote", "jobs")
