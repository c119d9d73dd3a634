"""A whole round (prepare -> collect -> pairs -> train -> evaluate -> promote -> report) with the
tiny model against a real S3 endpoint (moto server) that answers some requests with 5xx, then
the same round again (every stage skips), then `codeq round` on a local folder."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from test_store_helpers import BUCKET, s3_endpoint_fixture  # noqa: F401

from codeq.config import load_config
from codeq.pipeline.local_round import LOCAL_ROUND_PRESET, run_round
from codeq.pipeline.stages import StageContext, prepare_stage, round_stages
from codeq.schemas import Task, read_jsonl
from codeq.store import RoundLayout, open_store
from tests.scripted import TaskScriptedEngine

TINY_SETTINGS = {
    "tasks": {"max_items": 7},  # a few builtin tasks keep the round short
    "policy": {
        "max_new_tokens": 32,
        "critique_max_new_tokens": 8,
        "device": "cpu",
        "dtype": "float32",
    },
    "search": {"rollouts": 1, "rewrites_per_expansion": 2, "max_depth": 1},
    "pairs": {"min_value_gap": 0.0},
    "train": {
        "max_steps": 1,
        "lora_r": 4,
        "lora_alpha": 8,
        "per_device_batch_size": 1,
        "gradient_accumulation_steps": 1,
        "eval_fraction": 0.0,
        "precision": "fp32",
        "max_length": 1024,
    },
    "evaluate": {"modes": ["full_rewrite"], "rollout_ablation": [1], "max_tasks": 2},
    "sandbox": {"workers": 1},
}


class OracleOrWrongPolicy(TaskScriptedEngine):
    """Collects with clearly different siblings so the round has real preference pairs: the
    first sample of each rewrite request is the task's oracle program, the others a wrong
    rewrite; every critique says 5/10. (The tiny random model alone writes no programs.)"""

    name = "oracle-or-wrong"

    def samples(self, request):
        task = self.task_of(request)
        wrong = task.buggy_code + "\nWRONG_REWRITE = 1\n"
        return [task.oracle_code if i == 0 else wrong for i in range(request.n)]


def stage_prefixes(layout: RoundLayout) -> list[str]:
    return [
        layout.stage(name) for name in ("tasks", "pairs", "adapter", "eval", "promote", "report")
    ] + [layout.shard(0)]


@pytest.mark.slow
def test_round_against_s3_with_injected_errors(s3_endpoint, tiny_model_dir, tmp_path):
    uri = f"s3://{BUCKET}/round-{int(time.time())}"
    config = load_config(
        LOCAL_ROUND_PRESET,
        {
            **TINY_SETTINGS,
            "policy": {**TINY_SETTINGS["policy"], "model": str(tiny_model_dir)},
            "store": {
                "uri": uri,
                "endpoint_url": s3_endpoint.proxy.url,
                "run": "s3round",
                "max_attempts": 6,
            },
        },
    )
    store = open_store(config.store)
    prepare_stage(StageContext(config, store, tmp_path / "prepare"), "builtin")
    train_tasks = read_jsonl(tmp_path / "prepare/round-0/tasks/train.jsonl", Task)
    s3_endpoint.proxy.fail_next(6, status=503)
    summary = run_round(
        config,
        tmp_path / "out",
        source="builtin",
        engines={"collect": OracleOrWrongPolicy(train_tasks)},
    )
    assert list(summary["timings"]) == round_stages(config)
    layout = RoundLayout("s3round", 0)
    assert store.marker(layout.stage("pairs"))["pairs"] > 0
    assert store.marker(layout.stage("adapter"))["trained"] is True
    assert store.exists(layout.stage("adapter") + "/adapter_model.safetensors")
    for prefix in stage_prefixes(layout):
        assert store.is_complete(prefix), prefix
        store.verify_manifest(prefix)
    decision = store.get_json(layout.stage("promote") + "/decision.json")
    assert isinstance(decision["promote"], bool) and decision["reason"]
    assert decision["split"] == "validation" and decision["gate_mode"] == "full_rewrite"
    for role in ("candidate", "incumbent"):
        for split in ("validation", "test"):
            assert store.exists(layout.stage("eval") + f"/{role}/{split}/results.json")
    assert store.exists(layout.stage("report") + "/index.html")
    assert summary["report"].startswith("s3://")

    again = run_round(config, tmp_path / "again", source="builtin")
    assert all(result["skipped"] for result in again["results"].values())


@pytest.mark.slow
def test_codeq_round_command_on_a_local_folder(tiny_model_dir, tmp_path, capsys, monkeypatch):
    import yaml

    from codeq.cli import run as cli_run

    settings = yaml.safe_load(LOCAL_ROUND_PRESET.read_text())
    for section, values in TINY_SETTINGS.items():
        settings.setdefault(section, {}).update(values)
    config_file = tmp_path / "tiny.yaml"
    config_file.write_text(yaml.safe_dump(settings))
    out = tmp_path / "local"
    code = cli_run(
        ["--config", str(config_file), "round", "--out", str(out), "--model", str(tiny_model_dir)]
    )
    captured = capsys.readouterr()
    assert code == 0, captured.err[-3000:]
    report = Path(captured.out.strip().splitlines()[-1].removeprefix("report: "))
    assert report == out / "store" / "runs" / "local" / "round-0" / "report" / "index.html"
    assert report.is_file() and "<html" in report.read_text().lower()
    ran = round_stages(load_config(LOCAL_ROUND_PRESET))  # the learned verifier's stage among them
    for stage in ran:
        assert f"stage {ran.index(stage) + 1}/{len(ran)}: {stage}" in captured.err


# ------------------------------------------------------------------------------ the demo chain


def test_the_laptop_preset_leaves_promotion_enough_validation_tasks(tmp_path):
    """A clean gain on every validation task of the demo must be able to reach the level: the
    one-sided exact McNemar test needs 5 tasks gained and none lost at 0.05 (the 3 validation
    tasks of a 0.25 split gave p = 0.125 even at +3/-0, so the demo could never promote)."""
    from codeq.cli import run as cli_run
    from codeq.promotion import one_sided_mcnemar

    out = tmp_path / "tasks"
    assert cli_run(["--preset", "laptop", "prepare", "--source", "builtin", "-o", str(out)]) == 0
    laptop = load_config(LOCAL_ROUND_PRESET)
    validation = read_jsonl(out / "validation.jsonl", Task)
    assert one_sided_mcnemar(len(validation), 0) < laptop.promotion.level
    assert one_sided_mcnemar(5, 0) < laptop.promotion.level <= one_sided_mcnemar(4, 0)
    train = read_jsonl(out / "train.jsonl", Task)
    per_round = laptop.tasks.train_per_round
    assert per_round is not None and per_round < len(train), "rounds collect on new tasks"


def stub_rounds(monkeypatch) -> None:
    """Every stage returns at once; each round finishes and promotes nothing."""
    from codeq.pipeline import stages

    def finished(context, **arguments):
        for stage in ("promote", "report"):
            context.store.mark_complete(context.layout.stage(stage), {"promote": False})
        return {"skipped": False}

    for name in stages.STAGE_FUNCTIONS:
        monkeypatch.setitem(stages.STAGE_FUNCTIONS, name, finished)


def last_line(capsys) -> str:
    return capsys.readouterr().err.strip().splitlines()[-1]


def test_the_demo_chains_two_rounds_without_a_promotion(tmp_path, monkeypatch, capsys):
    """`make demo` is `codeq rounds --rounds 2`: with the laptop preset round 1 runs even when
    round 0 promoted nothing (promotion.patience 2)."""
    from codeq.cli import run as cli_run

    makefile = (Path(__file__).resolve().parent.parent / "Makefile").read_text()
    assert "$(BIN)/codeq rounds --rounds 2\n" in makefile.split("\ndemo:", 1)[1]
    stub_rounds(monkeypatch)
    out = tmp_path / "demo"
    assert cli_run(["rounds", "--rounds", "2", "-o", str(out)]) == 0
    assert last_line(capsys) == "run local: 2 of 2 rounds finished"
    runs = out / "store" / "runs" / "local"
    assert sorted(p.parent.name for p in runs.glob("round-*/settings.yaml")) == [
        "round-0",
        "round-1",
    ]


def test_rounds_say_truly_why_they_stopped_and_how_to_go_on(tmp_path, monkeypatch, capsys):
    from codeq.cli import run as cli_run

    stub_rounds(monkeypatch)
    monkeypatch.setenv("CODEQ_PROMOTION__PATIENCE", "1")
    out = tmp_path / "demo"
    stopped = (
        "run local: stopped with 1 of 2 rounds finished: the last 1 round(s) in a row promoted "
        f"nothing, and promotion.patience is 1. To go on, `codeq round -o {out}` runs round 1 "
        f"anyway, or `CODEQ_PROMOTION__PATIENCE=2 codeq rounds --rounds 2 -o {out}` lets the "
        "chain go on"
    )
    assert cli_run(["rounds", "--rounds", "2", "-o", str(out)]) == 0
    assert last_line(capsys) == stopped
    assert cli_run(["rounds", "--rounds", "2", "-o", str(out)]) == 0  # the rerun: still true
    assert last_line(capsys) == stopped
    assert cli_run(["round", "-o", str(out)]) == 0  # what it says goes on
    assert "round 1 finished" in capsys.readouterr().err
    assert cli_run(["rounds", "--rounds", "2", "-o", str(out)]) == 0
    assert last_line(capsys) == (
        "run local already has 2 finished round(s), so --rounds 2 has nothing to do; "
        f"`codeq rounds --rounds 3 -o {out}` runs round 2"
    )
