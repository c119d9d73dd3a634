"""Read DebugBench items (local clone, Hugging Face dataset, or the builtin set) into one record,
Python 3 only, and deduplicate them by the normalized buggy code."""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from codeq.errors import DatasetError, TransientError
from codeq.locations import local_suggestion, typo_of

SUBTYPE_CATEGORY = {
    "missing colons": "syntax",
    "unclosed parentheses": "syntax",
    "illegal separation": "syntax",
    "illegal indentation": "syntax",
    "unclosed string": "syntax",
    "illegal comment": "syntax",
    "faulty indexing": "reference",
    "undefined objects": "reference",
    "undefined methods": "reference",
    "illegal keywords": "reference",
    "condition error": "logic",
    "operation error": "logic",
    "variable error": "logic",
    "other error": "logic",
    "misused == or =": "logic",
    "double": "multiple",
    "triple": "multiple",
    "quadruple": "multiple",
}
_HF_CATEGORY = {
    "syntax error": "syntax",
    "reference error": "reference",
    "logic error": "logic",
    "multiple error": "multiple",
}
LEVELS = {"easy", "medium", "hard"}
BUILTIN_PATH = Path(__file__).resolve().parent.parent / "data" / "builtin_tasks.json"
BUILTIN = "builtin"
SOURCE_HINT = "pass a DebugBench clone folder, a Hugging Face dataset id, or 'builtin'"


@dataclass(frozen=True)
class RawItem:
    """One DebugBench item, whatever it was read from."""

    slug: str
    level: str
    subtype: str
    category: str
    description: str
    examples: list[str]
    constraints: str
    oracle_code: str
    buggy_code: str
    bug_explanation: str | None = None
    origin: str = field(default="", compare=False)


def normalize_code(code: str) -> str:
    lines = [line.rstrip() for line in code.replace("\r\n", "\n").replace("\t", "    ").split("\n")]
    return "\n".join(lines).strip("\n") + "\n"


def code_hash(code: str) -> str:
    return hashlib.sha256(normalize_code(code).encode("utf-8")).hexdigest()


def category_of(subtype: str, fallback: str | None = None) -> str:
    key = subtype.strip().lower()
    if key in SUBTYPE_CATEGORY:
        return SUBTYPE_CATEGORY[key]
    if fallback and fallback.strip().lower() in _HF_CATEGORY:
        return _HF_CATEGORY[fallback.strip().lower()]
    raise DatasetError(
        f"unknown DebugBench subtype {subtype!r}",
        hint="expected one of: " + ", ".join(sorted(SUBTYPE_CATEGORY)),
    )


def _examples_list(value: Any, where: str) -> list[str]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            value = [part for part in re.split(r"\n\s*\n(?=\s*Input)", value) if part.strip()]
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise DatasetError(f"{where}: examples must be a list of strings")
    return [item.strip() for item in value]


def _explanation(item: dict[str, Any]) -> str | None:
    for key in ("bug_explanation", "explanations", "type"):
        value = item.get(key)
        if isinstance(value, list):
            value = "; ".join(str(part) for part in value)
        if value:
            return str(value)
    return None


def _required(item: dict[str, Any], key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str) or not value.strip():
        raise DatasetError(f"{where}: field {key!r} is missing or empty")
    return value


def _make_item(
    item: dict[str, Any], subtype: str, fallback_category: str | None, where: str
) -> RawItem:
    level = str(item.get("level", "")).strip().lower()
    if level not in LEVELS:
        raise DatasetError(f"{where}: level {item.get('level')!r} is not easy/medium/hard")
    return RawItem(
        slug=_required(item, "slug", where).strip(),
        level=level,
        subtype=subtype.strip().lower(),
        category=category_of(subtype, fallback_category),
        description=_required(item, "description", where),
        examples=_examples_list(item.get("examples"), where),
        constraints=str(item.get("constraints") or ""),
        oracle_code=_required(item, "oracle_code", where),
        buggy_code=_required(item, "buggy_code", where),
        bug_explanation=_explanation(item),
        origin=where,
    )


def _debugbench_files(folder: Path) -> list[Path]:
    for candidate in (folder, folder / "benchmark"):
        files = sorted(candidate.glob("python3_*.json"))
        if files:
            return files
    return []


def load_local(folder: Path) -> list[RawItem]:
    """A DebugBench clone (or its `benchmark/` folder): python3_<subtype>.json files."""
    if not folder.is_dir():
        raise DatasetError(
            f"{folder} is not a folder", hint="pass a DebugBench clone or its benchmark/ folder"
        )
    files = _debugbench_files(folder)
    if not files:
        raise DatasetError(
            f"no python3_*.json files in {folder} or {folder / 'benchmark'}",
            hint="pass a DebugBench clone (github.com/thunlp/DebugBench) or its benchmark/ folder",
        )
    items: list[RawItem] = []
    for path in files:
        subtype = path.stem.removeprefix("python3_")
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as exc:
            raise DatasetError(f"{path} is not valid JSON: {exc}".splitlines()[0]) from exc
        if not isinstance(data, list):
            raise DatasetError(f"{path} must hold a JSON list of items")
        for index, item in enumerate(data):
            if not isinstance(item, dict):
                raise DatasetError(f"{path.name}[{index}] is not an object")
            items.append(_make_item(item, subtype, None, f"{path.name}[{index}]"))
    return items


def from_hf_record(record: dict[str, Any], where: str) -> RawItem | None:
    """Map one Hugging Face DebugBench row to a RawItem; None for other languages."""
    if str(record.get("language", "")).strip().lower() != "python3":
        return None
    mapped = {
        "slug": record.get("slug"),
        "level": record.get("level"),
        "description": record.get("question"),
        "examples": record.get("examples"),
        "constraints": record.get("constraints"),
        "oracle_code": record.get("solution"),
        "buggy_code": record.get("buggy_code"),
        "bug_explanation": record.get("bug_explanation"),
    }
    return _make_item(mapped, str(record.get("subtype", "")), record.get("category"), where)


def _hf_rows(source: str) -> Iterable[dict[str, Any]]:
    import datasets

    path = Path(source)
    try:
        if path.is_dir():
            loaded = datasets.load_from_disk(str(path))
        elif path.is_file():
            builder = "parquet" if path.suffix == ".parquet" else "json"
            loaded = datasets.load_dataset(builder, data_files=str(path))
        else:
            check_hub_dataset(source)
            loaded = datasets.load_dataset(source)
    except (DatasetError, TransientError):
        raise
    except Exception as exc:  # noqa: BLE001 - datasets raises many unrelated types
        read_as_id = _read_as_id(source)
        if _is_network_failure(exc):
            raise TransientError(
                f"cannot reach the Hugging Face hub for {source!r}: {type(exc).__name__}",
                hint=f"{read_as_id}retry later, or pass a local DebugBench clone",
            ) from exc
        raise DatasetError(
            f"cannot load Hugging Face dataset {source!r}: {type(exc).__name__}: {exc}".splitlines()[
                0
            ],
            hint=f"{read_as_id}check the dataset id and network access, or pass a local "
            "DebugBench clone",
        ) from exc
    splits = list(loaded.values()) if isinstance(loaded, datasets.DatasetDict) else [loaded]
    for split in splits:
        yield from split


def _read_as_id(source: str) -> str:
    # a mistyped local folder ("data/debugbench") also ends up on the hub, read as an id
    if Path(source).exists():
        return ""
    return f"there is no local folder {source!r}, so it was read as a Hugging Face dataset id; "


def check_hub_dataset(source: str) -> None:
    """Ask the hub once (no retries) whether dataset `source` exists, so a mistyped id or local
    folder is one line at once: no such dataset is bad input (exit 2); an unreachable hub is
    transient (exit 75) unless a local folder close to it exists (then it was a mistyped path)
    or the hub's cache holds the dataset (then `datasets` reads the cache)."""
    if _offline():
        return
    from huggingface_hub import HfApi
    from huggingface_hub.errors import RepositoryNotFoundError

    nearby = local_suggestion(source)
    did_you_mean = f"did you mean {nearby}? " if nearby else ""
    try:
        HfApi().dataset_info(source, timeout=10)
    except RepositoryNotFoundError:
        raise DatasetError(
            f"task source {source!r} is neither a local folder nor a Hugging Face dataset",
            hint=f"{did_you_mean}{SOURCE_HINT} (a private dataset needs `hf auth login`)",
        ) from None
    except Exception as exc:  # noqa: BLE001 - anything else is for `datasets` to report
        if not _is_network_failure(exc) or _hub_cached(source):
            return
        if nearby:
            raise DatasetError(
                f"task source {source!r} is no local folder, and the Hugging Face hub cannot be "
                "reached to look it up as a dataset id",
                hint=f"{did_you_mean}{SOURCE_HINT}",
            ) from None
        raise TransientError(
            f"cannot reach the Hugging Face hub for {source!r}: {type(exc).__name__}",
            hint=f"{_read_as_id(source)}retry later, or pass a local DebugBench clone",
        ) from None


def _offline() -> bool:
    return any(
        os.environ.get(name, "").strip().lower() in {"1", "true", "yes", "on"}
        for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
    )


def _hub_cached(source: str) -> bool:
    from huggingface_hub import constants

    return (Path(constants.HF_HUB_CACHE) / f"datasets--{source.replace('/', '--')}").is_dir()


def _is_network_failure(exc: BaseException) -> bool:
    chain: BaseException | None = exc
    while chain is not None:
        name = type(chain).__name__
        if (
            isinstance(chain, ConnectionError | TimeoutError | socket.gaierror)
            or "Connect" in name
            or "Timeout" in name
        ):
            return True
        chain = chain.__cause__ or chain.__context__
    return False


def load_hf(source: str) -> list[RawItem]:
    """The Hugging Face dataset (hub id, a `save_to_disk` folder, or a JSON/parquet export)."""
    items: list[RawItem] = []
    for index, row in enumerate(_hf_rows(source)):
        item = from_hf_record(dict(row), f"{source}[{index}]")
        if item is not None:
            items.append(item)
    if not items:
        raise DatasetError(
            f"{source} holds no python3 items", hint="DebugBench rows need language == 'python3'"
        )
    return items


def load_builtin() -> list[RawItem]:
    """The small task set shipped with codeq (written for the project, DebugBench format)."""
    data = json.loads(BUILTIN_PATH.read_text(encoding="utf-8"))
    return [
        _make_item(item, item["subtype"], None, f"builtin[{index}]")
        for index, item in enumerate(data)
    ]


def _looks_like_hf_folder(path: Path) -> bool:
    return (
        (path / "dataset_info.json").is_file()
        or (path / "dataset_dict.json").is_file()
        or (path / "state.json").is_file()
    )


def load_source(source: str) -> list[RawItem]:
    """Every Python 3 item of a source: 'builtin', a DebugBench folder, or a HF dataset."""
    check_task_source(source)
    if source == BUILTIN:
        return load_builtin()
    path = Path(source).expanduser()
    if path.is_dir():
        return load_hf(str(path)) if _looks_like_hf_folder(path) else load_local(path)
    if path.is_file():
        return load_hf(str(path))
    return load_hf(source)


def check_task_source(source: str) -> None:
    """Raise DatasetError now, without reading anything, for a source that is no folder, no
    dataset file, not 'builtin' and not spelt like a hub dataset id (namespace/name), or that
    is a near miss of 'builtin' or of an existing path, with a did-you-mean."""
    if source == BUILTIN:
        return
    path = Path(source).expanduser()
    if path.is_dir():
        return
    if path.is_file():
        if path.suffix not in {".json", ".jsonl", ".parquet"}:
            raise DatasetError(f"{path} is not a DebugBench folder or dataset file")
        return
    typo = typo_of(source, [BUILTIN], namespace_required=True)
    if typo is not None:
        raise DatasetError(
            f"task source {source!r} does not exist"
            if typo.kind == "path"
            else f"unknown task source {source!r}: no such folder, and not 'builtin'",
            hint=f"{typo.did_you_mean()}{SOURCE_HINT}",
        )


def deduplicate(items: Iterable[RawItem]) -> tuple[list[RawItem], int]:
    """Keep the first item per normalized buggy code; returns (unique items, duplicates)."""
    seen: set[str] = set()
    unique: list[RawItem] = []
    duplicates = 0
    for item in items:
        digest = code_hash(item.buggy_code)
        if digest in seen:
            duplicates += 1
            continue
        seen.add(digest)
        unique.append(item)
    return unique, duplicates
