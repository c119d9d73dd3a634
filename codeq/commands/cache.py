from __future__ import annotations

import shutil
from pathlib import Path

import typer

from codeq.commands.common import config_with


def command(
    clear: bool = typer.Option(
        False,
        "--clear",
        help="Remove the merged policies (each is merged again from its adapters when a stage "
        "needs it).",
    ),
) -> None:
    """List what policy.cache_dir holds, with sizes: the merged policies (a base model with
    promoted adapters folded in, one folder per set of weights, shared by every run and round)
    and the models dequantized from GGUF files."""
    from codeq.train.lineage import MERGED_DIR, folder_bytes, human_size

    cache = Path(config_with().policy.cache_dir).expanduser()
    merged = cache / MERGED_DIR
    folders = sorted(p for p in merged.iterdir() if p.is_dir()) if merged.is_dir() else []
    sizes = {folder: folder_bytes(folder) for folder in folders}
    total = human_size(sum(sizes.values()))
    count = f"{len(folders)} merged polic{'y' if len(folders) == 1 else 'ies'}"
    if clear:
        shutil.rmtree(merged, ignore_errors=True)
        typer.echo(f"removed {count} ({total}) from {merged}")
        return
    typer.echo(f"merged policies in {merged}:")
    for folder in folders:
        typer.echo(f"  {human_size(sizes[folder]):>9}  {folder.name}  {_lineage_of(folder)}")
    typer.echo(f"  {count}, {total}; `codeq cache --clear` removes them")
    others = (
        sorted(p for p in cache.iterdir() if p.is_dir() and p != merged) if cache.is_dir() else []
    )
    if others:
        typer.echo(f"models dequantized from GGUF files and other entries in {cache}:")
        for folder in others:
            typer.echo(f"  {human_size(folder_bytes(folder)):>9}  {folder.name}")


def _lineage_of(folder: Path) -> str:
    from codeq.schemas import Lineage
    from codeq.train.lineage import LINEAGE_FILE

    try:
        return Lineage.model_validate_json((folder / LINEAGE_FILE).read_text()).describe()
    except (OSError, ValueError):
        return "(unfinished: no LINEAGE.json)"
