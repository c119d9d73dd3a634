"""Runs kept apart: each `--run` of one `--out` folder has its own scratch folder (one run
never resumes from files another left), and merged policies are cached by their weights, built
once for every run and round with the same ones, listed with their sizes by `codeq cache` and
removed by `codeq cache --clear`."""

from __future__ import annotations

from codeq.cli import run
from codeq.config import PolicyConfig
from codeq.pipeline import stages
from codeq.schemas import AdapterLink
from codeq.train import lineage as lineage_module


def test_each_run_of_an_out_folder_has_its_own_scratch_folder(tmp_path, monkeypatch, capsys):
    """Two runs used to share OUT/work: the second run's evaluation resumed from the trees the
    first one had left there ("3 of 3 tasks already searched")."""
    scratch: dict[str, set] = {}

    def record(context, **arguments):
        scratch.setdefault(context.config.store.run, set()).add(context.scratch)
        context.workdir("eval").joinpath(f"{context.config.store.run}.json").write_text("{}")
        context.store.mark_complete(context.layout.stage("promote"), {"promote": False})
        return {"skipped": False}

    for name in stages.STAGE_FUNCTIONS:
        monkeypatch.setitem(stages.STAGE_FUNCTIONS, name, record)
    out = tmp_path / "out"
    for name in ("first", "second"):
        assert run(["round", "--run", name, "-o", str(out)]) == 0, capsys.readouterr().err
    assert scratch == {"first": {out / "work" / "first"}, "second": {out / "work" / "second"}}
    assert [p.name for p in (out / "work" / "second").rglob("*.json")] == ["second.json"]


def test_a_merged_policy_is_built_once_for_every_run_with_the_same_weights(
    tiny_model_dir, tiny_adapter_dir, tmp_path, monkeypatch, capsys
):
    """The same adapter promoted in two runs (the same seeded round under a new --run) is one
    merged folder, not one per run; `codeq cache` lists it with its size, --clear removes it."""
    cache = tmp_path / "cache"
    policy = PolicyConfig(model=str(tiny_model_dir), dtype="float32", cache_dir=str(cache))
    base = lineage_module.base_lineage(policy)
    sha = lineage_module.adapter_sha256(tiny_adapter_dir)
    merges = []
    real_merge = lineage_module.merge_adapters

    def counted(*args, **kwargs):
        merges.append(args)
        return real_merge(*args, **kwargs)

    monkeypatch.setattr(lineage_module, "merge_adapters", counted)
    folders = set()
    for run_name in ("first", "second"):
        link = AdapterLink(round=0, sha256=sha, source=f"runs/{run_name}/round-0/adapter")
        policy_lineage = base.extended(link)
        folders.add(lineage_module.materialize(policy_lineage, [tiny_adapter_dir], policy))
    assert len(merges) == 1 and len(folders) == 1
    (folder,) = folders
    assert folder.startswith(str(cache / "merged"))

    monkeypatch.setenv("CODEQ_POLICY__CACHE_DIR", str(cache))
    assert run(["cache"]) == 0
    listed = capsys.readouterr().out
    size = lineage_module.human_size(lineage_module.folder_bytes(cache / "merged"))
    assert f"1 merged policy, {size}" in listed
    assert "base " in listed and "round 0" in listed
    assert run(["cache", "--clear"]) == 0
    assert capsys.readouterr().out.startswith(f"removed 1 merged policy ({size})")
    assert not (cache / "merged").exists()
