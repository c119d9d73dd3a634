from __future__ import annotations

from pathlib import Path

import typer

from codeq.commands.common import config_with


def command(
    adapter: Path = typer.Argument(..., help="Adapter folder from `codeq train` (OUT/adapter)."),
    out: Path | None = typer.Option(
        None, "--out", "-o", help="Output folder (default work_dir/merged)."
    ),
    model: str | None = typer.Option(
        None, help="Base model (policy.model): HF id, folder, .gguf, smollm2."
    ),
) -> None:
    """Merge a LoRA adapter into its base model (safetensors folder for the next round)."""
    from codeq.train import merge_adapter, resolve_model_source

    config = config_with({"policy": {"model": model}})
    out_dir = out or Path(config.work_dir) / "merged"
    merged = merge_adapter(resolve_model_source(config.policy), adapter, out_dir, config)
    typer.echo(str(merged))
