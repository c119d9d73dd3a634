"""Policies as lineages: a base model and the promoted LoRA adapters merged into it, in order.

Round N samples, critiques and trains on the policy promoted so far: the base with every
promoted adapter folded in (merge_and_unload, as CodeQ does between rounds), saved once as a
plain model folder in the cache and named by the lineage's id. Round N trains a fresh LoRA on
that folder, so DPO's reference model is round N's own sampling policy. On CUDA the same folder
is loaded in 4-bit NF4 for sampling and for training (QLoRA), so both see the same weights.

The merged folder is saved in the dtype inference uses (bf16 where supported): the weights that
sample are exactly the weights the next adapter is trained against.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from pathlib import Path

from codeq.config import PolicyConfig
from codeq.errors import MissingInputError, ModelLoadError
from codeq.policy.gguf import SMOLLM2_ALIAS, smollm2_gguf_path
from codeq.policy.source import require_adapter_dir, resolve_model_source
from codeq.schemas import AdapterLink, Lineage
from codeq.store import sha256_of_file
from codeq.train.merge import merge_adapters

log = logging.getLogger(__name__)

ADAPTER_WEIGHTS = "adapter_model.safetensors"
LINEAGE_FILE = "LINEAGE.json"
_FINGERPRINTS = "fingerprints.json"
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".json", ".model", ".txt", ".gguf", ".tiktoken")


def _cached_sha256(path: Path, cache_dir: Path) -> str:
    """sha256 of a file, remembered by (path, size, mtime) so multi-GB weights hash once."""
    stat = path.stat()
    key = f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}"
    index_path = cache_dir / _FINGERPRINTS
    try:
        index = json.loads(index_path.read_text())
    except (OSError, ValueError):
        index = {}
    if key not in index:
        index[key] = sha256_of_file(path)
        cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = index_path.with_name(index_path.name + ".tmp")
        tmp.write_text(json.dumps(index, indent=1))
        tmp.replace(index_path)
    return str(index[key])


def model_fingerprint(policy: PolicyConfig) -> str:
    """sha256 identifying the base model's files: the GGUF file itself, or a hash over every
    weight, config and tokenizer file of a model folder (a Hugging Face id is resolved to the
    folder transformers downloads it to)."""
    cache_dir = Path(policy.cache_dir).expanduser()
    model = policy.model
    if model == SMOLLM2_ALIAS:
        return _cached_sha256(smollm2_gguf_path(), cache_dir)
    if model.endswith(".gguf"):
        path = Path(model).expanduser()
        if not path.is_file():
            raise ModelLoadError(f"GGUF file not found: {path}")
        return _cached_sha256(path, cache_dir)
    folder = Path(resolve_model_source(policy.model, policy.cache_dir))
    if not folder.is_dir():
        folder = _hub_snapshot(model, cache_dir)
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix in _WEIGHT_SUFFIXES)
    files = [p for p in files if p.name != LINEAGE_FILE]
    digest = hashlib.sha256()
    for path in files:
        digest.update(f"{path.relative_to(folder)}:{_cached_sha256(path, cache_dir)}\n".encode())
    return digest.hexdigest()


def _hub_snapshot(model_id: str, cache_dir: Path) -> Path:
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(model_id, cache_dir=str(cache_dir)))
    except Exception as exc:  # the hub client raises many types for unreachable or unknown ids
        raise ModelLoadError(
            f"cannot fetch {model_id} to fingerprint it: {str(exc).splitlines()[0]}",
            hint="point policy.model at a local folder or a .gguf file when the hub is unreachable",
        ) from exc


def base_lineage(policy: PolicyConfig) -> Lineage:
    """The lineage of the configured base model with no adapter merged."""
    return Lineage(base_model=policy.model, base_sha256=model_fingerprint(policy))


def adapter_sha256(adapter_dir: str | Path) -> str:
    folder = require_adapter_dir(adapter_dir)
    weights = folder / ADAPTER_WEIGHTS
    if not weights.is_file():
        raise MissingInputError(
            f"{folder} holds no {ADAPTER_WEIGHTS}", hint="rerun the train stage of that round"
        )
    return sha256_of_file(weights)


def link_of(adapter_dir: str | Path, round_number: int, source: str) -> AdapterLink:
    return AdapterLink(round=round_number, sha256=adapter_sha256(adapter_dir), source=source)


MERGED_DIR = "merged"


def merged_key(lineage: Lineage) -> str:
    """What a merged folder holds: the base's fingerprint and each adapter's sha256, in order.
    Not the lineage id, which also names the run and round that trained each adapter: runs that
    train the same adapter (the same seeded round again under a new --run) share one folder."""
    weights = [lineage.base_sha256, *(link.sha256 for link in lineage.adapters)]
    return hashlib.sha256("\n".join(weights).encode()).hexdigest()[:16]


def materialize(lineage: Lineage, adapter_dirs: Sequence[Path], policy: PolicyConfig) -> str:
    """A model folder (or id) that loads as `lineage`: the base itself when no adapter is
    merged, otherwise `cache_dir/merged/<merged key>-<dtype>/`, built once by merging the
    adapters (`adapter_dirs`, in chain order, each checked against its recorded sha256) into the
    base, and shared by every run and round whose policy has the same weights."""
    if len(adapter_dirs) != len(lineage.adapters):
        raise ValueError("materialize needs one adapter folder per adapter of the lineage")
    base = resolve_model_source(lineage.base_model, policy.cache_dir)
    if not lineage.adapters:
        return base
    from codeq.policy.engine import resolve_device, resolve_dtype

    save_dtype = resolve_dtype(policy, resolve_device(policy))
    target = merged_target(lineage, policy)
    merged = target.parent
    if holds_merge(target, lineage):
        log.info("merged policy %s: reusing %s (%s)", lineage.id, target, _size(target))
        return str(target)
    for link, folder in zip(lineage.adapters, adapter_dirs, strict=True):
        if adapter_sha256(folder) != link.sha256:
            raise MissingInputError(
                f"adapter {folder} does not match round {link.round}'s sha256 {link.sha256[:12]}",
                hint="download the adapter again from the store",
            )
    merge_adapters(base, adapter_dirs, target, save_dtype)
    (target / LINEAGE_FILE).write_text(lineage.model_dump_json(indent=1))
    log.info(
        "merged policy %s: %s in %s; merged policies here take %s in all (`codeq cache` lists "
        "them, `codeq cache --clear` removes them)",
        lineage.id,
        _size(target),
        target,
        _size(merged),
    )
    return str(target)


def merged_target(lineage: Lineage, policy: PolicyConfig) -> Path:
    """Where `materialize` keeps the merge of `lineage`: `cache_dir/merged/<key>-<dtype>`. The
    folder's name is also its name in the store (`runs/<run>/merged/<name>`)."""
    from codeq.policy.engine import resolve_device, resolve_dtype

    dtype_name = str(resolve_dtype(policy, resolve_device(policy))).removeprefix("torch.")
    return Path(policy.cache_dir).expanduser() / MERGED_DIR / f"{merged_key(lineage)}-{dtype_name}"


def holds_merge(folder: Path, lineage: Lineage) -> bool:
    """Whether `folder` is a finished merge of `lineage`'s weights (its LINEAGE.json, written
    last, names the lineage that built it)."""
    try:
        built = Lineage.model_validate_json((folder / LINEAGE_FILE).read_text())
    except (OSError, ValueError):
        return False
    return merged_key(built) == merged_key(lineage)


def folder_bytes(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


def _size(folder: Path) -> str:
    return human_size(folder_bytes(folder))


def human_size(size: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:.0f} {unit}" if unit in {"B", "kB"} else f"{size:.1f} {unit}"
        size /= 1000
    raise AssertionError("unreachable")
