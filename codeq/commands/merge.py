from __future__ import annotations

from pathlib import Path

import typer

from codeq.commands.common import config_with, model_option, out_dir, out_option


def command(
    adapter: Path = typer.Argument(
        ..., help="Adapter folder from `codeq train` (its OUT/adapter).", metavar="ADAPTER"
    ),
    out: Path | None = out_option("merged", "the merged model (safetensors)"),
    model: str | None = model_option(),
) -> None:
    """Merge a LoRA adapter into its base model (safetensors folder for the next round)."""
    from codeq.policy.source import resolve_model_source
    from codeq.train import merge_adapter

    config = config_with({"policy": {"model": model}})
    base = resolve_model_source(config.policy.model, config.policy.cache_dir)
    merged = merge_adapter(base, adapter, out_dir(out, config, "merged"), config)
    typer.echo(str(merged))
