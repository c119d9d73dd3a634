"""Data-parallel DPO (train.processes > 1, codeq/train/distributed.py): two CPU processes over
gloo train one adapter on the same pairs per optimizer step as one process, with the same
metrics.json; the chart runs one process per GPU of the train Job."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from codeq.config import StoreConfig, TrainConfig, load_config
from codeq.errors import BadInputError, ConfigError
from codeq.schemas import AdapterLink, Lineage, write_jsonl
from codeq.store import open_store
from codeq.train.checkpoints import CheckpointTarget, latest
from tests.test_train import make_pairs
from tests.test_train_smollm2 import repair_pairs


def key_tree(value: Any) -> Any:
    """The keys of a metrics dict, nested, without the values (lists: their first entry's)."""
    if isinstance(value, dict):
        return {key: key_tree(item) for key, item in value.items()}
    if isinstance(value, list) and value:
        return [key_tree(value[0])]
    return None


def distributed_config(model_dir: Path, processes: int, **train: object):
    return load_config(
        overrides={
            "policy": {"model": str(model_dir)},
            "train": {
                "processes": processes,
                "lora_r": 4,
                "lora_alpha": 8,
                "lora_dropout": 0.0,  # no per-rank randomness: the runs must agree step by step
                "precision": "fp32",
                "per_device_batch_size": 2,
                "gradient_accumulation_steps": 2,
                "max_steps": 3,
                "learning_rate": 1e-3,
                "max_length": 512,
                "eval_steps": 2,
                "eval_fraction": 0.25,
                **train,
            },
        }
    )


@pytest.mark.parametrize(
    ("per_device", "accumulation", "processes", "expected"),
    [
        (2, 8, 1, (2, 8)),
        (2, 8, 2, (2, 4)),
        (2, 8, 4, (2, 2)),
        (2, 8, 8, (2, 1)),
        (2, 8, 16, (1, 1)),
        (3, 4, 2, (3, 2)),
        (4, 1, 2, (2, 1)),
        (6, 1, 4, None),
        (2, 8, 3, None),
        (2, 8, 32, None),
    ],
)
def test_each_process_takes_an_equal_share_of_a_steps_pairs(
    per_device, accumulation, processes, expected
):
    from codeq.train.distributed import batch_plan

    config = TrainConfig(
        per_device_batch_size=per_device,
        gradient_accumulation_steps=accumulation,
        processes=processes,
    )
    if expected is None:
        with pytest.raises(ConfigError, match="cannot share"):
            batch_plan(config)
        return
    plan = batch_plan(config)
    assert (plan.per_device_batch_size, plan.gradient_accumulation_steps) == expected
    assert plan.pairs_per_step == per_device * accumulation
    assert plan.per_device_batch_size <= per_device


@pytest.mark.slow
def test_two_gloo_processes_train_the_single_process_adapter(
    tmp_path, tiny_model_dir, debugbench_dir
):
    """The same real repair pairs trained by one process and by two: the two-process run writes
    one adapter (rank 0's), in the same metrics format, having trained on the same pairs each
    step (equal losses and weights up to float summation order). 24 train pairs: the 3 steps
    of 4 stay inside the first epoch, whose last step accelerate would fill up with repeated
    pairs, and Trainer's length bucketing would group 6 pairs at a time on each of two ranks
    where one process groups 4 (so the order would differ unless widened to a whole step);
    held-out accuracy is measured once, after the last step, so both runs write their last
    adapter."""
    from safetensors.torch import load_file

    from codeq.train import train_dpo

    # half the pairs replayed from an earlier round (train.earlier_rounds): written by the
    # policy before; each process trains against the reference the caller names
    base = Lineage(base_model="tiny", base_sha256="a" * 64)
    policy = base.extended(AdapterLink(round=0, sha256="b" * 64, source="runs/r/round-0/adapter"))
    pairs = repair_pairs(debugbench_dir, 28)
    for index, pair in enumerate(pairs):
        pair.policy = policy if index % 2 else base
    pairs_path = tmp_path / "pairs.jsonl"
    write_jsonl(pairs_path, pairs)
    settings = {"eval_fraction": 0.1, "eval_steps": 10}
    single = train_dpo(
        pairs_path,
        tmp_path / "one",
        distributed_config(tiny_model_dir, 1, **settings),
        reference=policy,
    )
    # the two processes also checkpoint after every step (they agree when, rank 0 copies)
    store_uri = f"file://{tmp_path / 'store'}"
    target = CheckpointTarget(StoreConfig(uri=store_uri), "train-progress", {})
    double = train_dpo(
        pairs_path,
        tmp_path / "two",
        distributed_config(tiny_model_dir, 2, checkpoint_every_s=1e-9, **settings),
        checkpoints=target,
        reference=policy,
    )
    assert double["trained_on"] == single["trained_on"] == policy.model_dump()
    provenance = json.loads((tmp_path / "two" / "adapter" / "provenance.json").read_text())
    assert Lineage.model_validate(provenance["trained_on"]) == policy

    assert double == json.loads((tmp_path / "two" / "metrics.json").read_text())
    assert key_tree(double) == key_tree(single)
    assert sorted(path.name for path in (tmp_path / "two").rglob("adapter_model*")) == [
        "adapter_model.safetensors"
    ]
    assert double["batch"] == {
        "processes": 2,
        "per_device": 2,
        "gradient_accumulation_steps": 1,
        "pairs_per_step": 4,
    }
    assert single["batch"]["pairs_per_step"] == 4
    assert double["pairs"] == single["pairs"]
    assert double["pairs"]["train"] == 24 and double["pairs"]["held_out"] == 4
    assert double["best_step"] == single["best_step"] == 3
    assert double["global_steps"] == single["global_steps"] == 3
    # summed over both ranks: the micro-batches one process trains on
    assert double["tokens"]["real"] == single["tokens"]["real"]
    checkpoint = latest(open_store(target.store), "train-progress")
    assert checkpoint is not None and checkpoint["step"] == 2  # none after the last step
    saved = {key.rsplit("/", 1)[-1] for key in open_store(target.store).list("train-progress")}
    assert {"codeq_state_rank0.json", "codeq_state_rank1.json", "optimizer.pt"} <= saved
    assert 0 < double["tokens"]["real_to_padded"] <= 1
    for one, two in zip(single["steps"], double["steps"], strict=True):
        assert two["loss"] == pytest.approx(one["loss"], rel=1e-4, abs=1e-6)

    trained = load_file(tmp_path / "two" / "adapter" / "adapter_model.safetensors")
    reference = load_file(tmp_path / "one" / "adapter" / "adapter_model.safetensors")
    assert trained.keys() == reference.keys()
    lora_b = [tensor for name, tensor in trained.items() if "lora_B" in name]
    assert any(float(tensor.abs().max()) > 0 for tensor in lora_b), "LoRA B is still zero"
    for name, tensor in trained.items():
        assert (tensor - reference[name]).abs().max() < 1e-4, name


def test_a_failing_process_fails_the_caller_with_its_own_error(tmp_path, tiny_model_dir):
    """Every pair is over max_length: the ranks fail with BadInputError (exit 2, no retry),
    which the caller raises as itself, not as a crash of torchrun."""
    from codeq.train import train_dpo

    pairs_path = tmp_path / "pairs.jsonl"
    write_jsonl(pairs_path, make_pairs(6, long_every=1))
    config = distributed_config(tiny_model_dir, 2, max_length=64)
    with pytest.raises(BadInputError, match="longer than train.max_length=64") as raised:
        train_dpo(pairs_path, tmp_path / "out", config)
    assert raised.value.exit_code == 2
    assert not (tmp_path / "out" / "adapter").exists()


def test_a_batch_the_processes_cannot_share_fails_before_any_starts(tmp_path, tiny_model_dir):
    from codeq.train import train_dpo

    pairs_path = tmp_path / "pairs.jsonl"
    write_jsonl(pairs_path, make_pairs(6))
    config = distributed_config(tiny_model_dir, 3)  # 2 x 2 pairs a step
    with pytest.raises(ConfigError, match="train.processes=3 cannot share the 4 pairs"):
        train_dpo(pairs_path, tmp_path / "out", config)
    assert not (tmp_path / "out").exists()


def stage_containers(extra: dict[str, Any]) -> dict[str, dict[str, Any]]:
    from tests.test_helm import stage_jobs  # skips where the Helm SDK is missing

    return {
        stage: job["spec"]["template"]["spec"]["containers"][0]
        for stage, job in stage_jobs("default", json.dumps(extra)).items()
    }


def env_of(container: dict[str, Any]) -> dict[str, str | None]:
    return {e["name"]: e.get("value") for e in container["env"]}


@pytest.mark.parametrize(("gpus", "processes"), [(4, "4"), (8, "8"), (1, None), (0, None)])
def test_the_train_job_runs_one_process_per_gpu(gpus, processes):
    containers = stage_containers({"stages": {"train": {"gpus": gpus}}})
    train = containers.pop("train")
    assert env_of(train).get("CODEQ_TRAIN__PROCESSES") == processes
    assert train["resources"]["limits"]["nvidia.com/gpu"] == gpus
    # the job's own process launches the ranks and stays the one that reads and writes the store
    assert train["args"] == ["python", "-m", "jobs.train"]
    for stage, container in containers.items():
        assert "CODEQ_TRAIN__PROCESSES" not in env_of(container), stage


def test_the_process_count_the_chart_sets_is_one_codeq_accepts(monkeypatch):
    for key in [k for k in os.environ if k.startswith("CODEQ_")]:
        monkeypatch.delenv(key)
    train = stage_containers({"stages": {"train": {"gpus": 4}}})["train"]
    monkeypatch.setenv("CODEQ_TRAIN__PROCESSES", env_of(train)["CODEQ_TRAIN__PROCESSES"])
    assert load_config(None).train.processes == 4


def test_a_process_count_other_than_the_gpus_fails_the_render():
    from tests.test_helm import helm

    with pytest.raises(helm.HelmError, match="config.train.processes=2 but stages.train.gpus=4"):
        stage_containers({"stages": {"train": {"gpus": 4}}, "config": {"train": {"processes": 2}}})
    # without GPUs the config's count runs (on CPU over gloo, as the CPU twin can)
    train = stage_containers(
        {"stages": {"train": {"gpus": 0}}, "config": {"train": {"processes": 2}}}
    )["train"]
    assert "CODEQ_TRAIN__PROCESSES" not in env_of(train)


STOPPED_TRAINER = """
import json, sys
from jobs._runner import StageTerminated, install_sigterm_handler
from codeq.config import load_config
from codeq.train import train_dpo

install_sigterm_handler()
pairs, out, overrides = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
try:
    train_dpo(pairs, out, load_config(overrides=overrides))
except StageTerminated:
    sys.exit(143)
"""


def test_sigterm_to_the_job_stops_every_training_process(tmp_path, tiny_model_dir):
    """Kubernetes stops a pod by SIGTERM to the job's python (through tini): the job stops
    torchrun, which stops its ranks; none outlives the job to write into its folder."""
    import signal
    import subprocess
    import sys
    import time

    from tests.sandbox_attacks.helpers import descendants, still_running

    pairs_path = tmp_path / "pairs.jsonl"
    write_jsonl(pairs_path, make_pairs(16))
    overrides = {
        "policy": {"model": str(tiny_model_dir)},
        "train": {"processes": 2, "max_steps": 100000, "eval_fraction": 0.0, "max_length": 256},
    }
    env = {k: v for k, v in os.environ.items() if not k.startswith("CODEQ_")}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parent.parent)
    log = tmp_path / "train.log"
    with log.open("w") as out:
        job = subprocess.Popen(
            [sys.executable, "-c", STOPPED_TRAINER, str(pairs_path), str(tmp_path / "out")]
            + [json.dumps(overrides)],
            env=env,
            stdout=out,
            stderr=out,
        )
    try:
        deadline = time.monotonic() + 300
        ranks: dict[int, str] = {}
        while len(ranks) < 2 and time.monotonic() < deadline and job.poll() is None:
            time.sleep(0.5)
            ranks = {
                pid: command
                for pid, command in descendants(job.pid).items()
                if "-m codeq.train.rank_process" in command
                and "torch.distributed.run" not in command
            }
        assert len(ranks) == 2, f"the ranks never started:\n{log.read_text()[-3000:]}"
        launched = descendants(job.pid)
        time.sleep(5)  # into loading and training
        job.send_signal(signal.SIGTERM)
        code = job.wait(timeout=120)
    finally:
        if job.poll() is None:
            job.kill()
    assert code == 143, log.read_text()[-3000:]
    deadline = time.monotonic() + 10
    while still_running(launched) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert still_running(launched) == {}, "training processes outlived the job"
    assert not (tmp_path / "out" / "adapter").exists()
