"""Where a model comes from: the one rule inference, DPO training and merging share for
`policy.model` (a Hugging Face id, a local model folder, a .gguf file, or 'smollm2')."""

from __future__ import annotations

import logging
from pathlib import Path

from codeq.errors import ModelLoadError
from codeq.locations import Typo, closest_path, typo_of
from codeq.policy.gguf import SMOLLM2_ALIAS, materialize_gguf, smollm2_gguf_path

log = logging.getLogger(__name__)

MODEL_HINT = (
    "policy.model (--model) takes a model folder (config.json + weights), a .gguf file, "
    "'smollm2', or a Hugging Face id such as Qwen/Qwen2.5-Coder-7B-Instruct"
)


def check_model_source(model: str) -> None:
    """Raise ModelLoadError now if `model` names a local model that is not there (a missing
    folder or .gguf file, a folder without config.json, the SmolLM2 package missing) or is a
    typo (a near miss of 'smollm2', a path no hub id is spelt like), without loading anything;
    other Hugging Face ids pass (they are checked when they are downloaded)."""
    if model == SMOLLM2_ALIAS:
        smollm2_gguf_path()
        return
    path = Path(model).expanduser()
    if model.endswith(".gguf"):
        if not path.is_file():
            raise ModelLoadError(
                f"model file {model} does not exist",
                hint=f"{Typo('path', closest_path(model)).did_you_mean()}{MODEL_HINT}",
            )
        return
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelLoadError(f"{model} is not a model folder (no config.json)", hint=MODEL_HINT)
        return
    if path.exists():
        raise ModelLoadError(
            f"{model} is a file, not a model folder or .gguf file", hint=MODEL_HINT
        )
    typo = typo_of(model, [SMOLLM2_ALIAS])
    if typo is None:
        return
    message = f"model path {model} does not exist"
    if typo.kind == "alias":
        message = f"unknown model {model!r}: no such folder or file, and not '{SMOLLM2_ALIAS}'"
    raise ModelLoadError(message, hint=f"{typo.did_you_mean()}{MODEL_HINT}")


def resolve_model_source(model: str, cache_dir: str) -> str:
    """A folder or Hugging Face id that `from_pretrained` can load. GGUF files are dequantized
    once into `cache_dir` (the same folder for every stage). A local path that does not exist
    is a ModelLoadError here, rather than a puzzling 'repo id' error from the hub client."""
    check_model_source(model)
    if model == SMOLLM2_ALIAS:
        return str(materialize_gguf(smollm2_gguf_path(), cache_dir))
    if model.endswith(".gguf"):
        return str(materialize_gguf(Path(model).expanduser(), cache_dir))
    path = Path(model).expanduser()
    return str(path) if path.is_dir() else model


ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_HINT = "point policy.adapter (--adapter) at the adapter/ folder `codeq train` writes"


def is_adapter_dir(folder: str | Path) -> bool:
    """Whether `folder` holds a PEFT LoRA adapter (its adapter_config.json)."""
    return (Path(folder).expanduser() / ADAPTER_CONFIG).is_file()


def require_adapter_dir(
    folder: str | Path, *, shown: str | None = None, hint: str = ADAPTER_HINT
) -> Path:
    """`folder` (user-expanded) if it holds a LoRA adapter, else a ModelLoadError naming it as
    `shown` (e.g. its store address) with `hint`: the one check of inference, merge, lineage,
    evaluation and the stages."""
    path = Path(folder).expanduser()
    if not is_adapter_dir(path):
        raise ModelLoadError(
            f"{shown or path} holds no {ADAPTER_CONFIG}, so it is not a LoRA adapter folder",
            hint=hint,
        )
    return path


def announce_load(model: str, source: str, what: str = "model") -> None:
    """Say what a (possibly long) model load waits for, before it starts; from here on the
    model library's own log lines go through the entry point's handler too."""
    from codeq.logs import route_library_logs

    route_library_logs()
    if Path(source).is_dir():
        if model == source:
            log.info("loading %s from %s", what, source)
        else:
            log.info("loading %s %s from %s", what, model, source)
    else:
        log.info(
            "loading %s %s from the Hugging Face hub (downloaded once, then cached); "
            "without network access set HF_HUB_OFFLINE=1 to use the cache only",
            what,
            model,
        )


def load_error(model: str, source: str, exc: BaseException) -> ModelLoadError:
    """One line for a failed from_pretrained, with what to check."""
    hint = MODEL_HINT
    if not Path(source).exists():
        hint = (
            f"there is no local folder {model!r}, so it was read as a Hugging Face id: check "
            "the spelling and network access, or pass a local folder / .gguf file"
        )
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return ModelLoadError(f"cannot load model {model}: {first}", hint=hint)
