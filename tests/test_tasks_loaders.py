"""Loaders: a DebugBench clone and the Hugging Face dataset map to the same records."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest

from codeq.errors import DatasetError
from codeq.tasks import deduplicate, load_source
from codeq.tasks.loaders import BUILTIN_PATH, SUBTYPE_CATEGORY, category_of, code_hash

HF_CATEGORY = {
    "syntax": "syntax error",
    "reference": "reference error",
    "logic": "logic error",
    "multiple": "multiple error",
}


def _builtin_items() -> list[dict]:
    return json.loads(BUILTIN_PATH.read_text())


def _write_clone(root: Path, items: list[dict]) -> Path:
    """A DebugBench clone layout: benchmark/python3_<subtype>.json without a subtype field."""
    by_subtype: dict[str, list[dict]] = defaultdict(list)
    for item in items:
        fields = {key: value for key, value in item.items() if key != "subtype"}
        by_subtype[item["subtype"]].append(fields)
    benchmark = root / "benchmark"
    benchmark.mkdir(parents=True)
    for subtype, group in by_subtype.items():
        (benchmark / f"python3_{subtype}.json").write_text(json.dumps(group))
    (benchmark / "java_missing colons.json").write_text("[]")  # other languages are ignored
    return root


def _hf_rows(items: list[dict]) -> list[dict]:
    rows = [
        {
            "slug": item["slug"],
            "category": HF_CATEGORY[SUBTYPE_CATEGORY[item["subtype"]]],
            "subtype": item["subtype"],
            "language": "python3",
            "level": item["level"],
            "release_time": 1700000000,
            "question": item["description"],
            "examples": item["examples"],
            "constraints": item["constraints"],
            "solution": item["oracle_code"],
            "solution_explanation": "",
            "buggy_code": item["buggy_code"],
            "bug_explanation": item["explanations"],
        }
        for item in items
    ]
    java = dict(rows[0], language="java", buggy_code="class Solution {}")
    return [*rows, java]


def _by_slug_and_code(items):
    return sorted(items, key=lambda item: (item.slug, code_hash(item.buggy_code)))


def test_clone_and_hf_dataset_give_identical_records(tmp_path: Path) -> None:
    import datasets

    items = _builtin_items()
    from_clone = load_source(str(_write_clone(tmp_path / "clone", items)))
    saved = tmp_path / "hf-saved"
    datasets.Dataset.from_list(_hf_rows(items)).save_to_disk(str(saved))
    from_disk = load_source(str(saved))
    exported = tmp_path / "hf.jsonl"
    exported.write_text("\n".join(json.dumps(row) for row in _hf_rows(items)))
    from_json = load_source(str(exported))
    assert len(from_clone) == len(items)  # java rows and files are skipped
    assert _by_slug_and_code(from_clone) == _by_slug_and_code(from_disk)
    assert _by_slug_and_code(from_clone) == _by_slug_and_code(from_json)
    first = _by_slug_and_code(from_disk)[0]
    assert first.category == category_of(first.subtype)
    assert first.bug_explanation


def test_builtin_source_covers_every_category_and_a_tree_or_list() -> None:
    items = load_source("builtin")
    assert 12 <= len(items) <= 16
    assert {item.category for item in items} == {"syntax", "reference", "logic", "multiple"}
    assert any("TreeNode" in item.oracle_code or "ListNode" in item.oracle_code for item in items)


def test_dedup_counts_normalized_duplicates() -> None:
    items = load_source("builtin")
    copy = items[0].__class__(
        **{**items[0].__dict__, "buggy_code": items[0].buggy_code + "   \n\n"}
    )
    unique, duplicates = deduplicate([*items, copy])
    assert len(unique) == len(items)
    assert duplicates == 1


def test_local_debugbench_reads_python3_items_with_subtype_from_file_name(
    debugbench_dir: Path,
) -> None:
    items = load_source(str(debugbench_dir))
    assert len(items) > 1000
    assert {item.category for item in items} == {"syntax", "reference", "logic", "multiple"}
    assert all(item.subtype in SUBTYPE_CATEGORY for item in items)
    unique, duplicates = deduplicate(items)
    assert len(unique) + duplicates == len(items)


def test_bad_sources_raise_dataset_errors(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="does not exist"):
        load_source(str(tmp_path / "missing"))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DatasetError, match="no python3_"):
        load_source(str(empty))
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "python3_double.json").write_text("[{not json")
    with pytest.raises(DatasetError, match="not valid JSON"):
        load_source(str(broken))
    unknown = tmp_path / "unknown"
    unknown.mkdir()
    (unknown / "python3_bad luck.json").write_text(json.dumps([_builtin_items()[0]]))
    with pytest.raises(DatasetError, match="unknown DebugBench subtype"):
        load_source(str(unknown))


def test_hub_ids_go_through_datasets_and_unreachable_hub_is_transient(monkeypatch) -> None:
    import datasets
    import huggingface_hub

    from codeq.errors import TransientError

    # the flags are read at import time, so set them on the loaded modules too (no network)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True, raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True, raising=False)
    with pytest.raises(TransientError, match="Hugging Face hub"):
        load_source("nobody/no-such-debugbench")


def test_hf_export_without_python3_rows_is_rejected(tmp_path: Path) -> None:
    rows = [dict(row, language="cpp") for row in _hf_rows(_builtin_items())]
    exported = tmp_path / "cpp.jsonl"
    exported.write_text("\n".join(json.dumps(row) for row in rows))
    with pytest.raises(DatasetError, match="no python3 items"):
        load_source(str(exported))
