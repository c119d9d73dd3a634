"""The policy's backend seam (`policy.backend`) and the `transformers` backend (transformers'
continuous batching): every backend honours all of `GenerationRequest`. Float32 on tiny random
Qwen2 and Llama models whose weights are large enough that greedy decoding does not repeat one
token (so a wrong position, KV block or fork changes the output), and on the real SmolLM2."""

from __future__ import annotations

from pathlib import Path

import pytest

from codeq.cli import run
from codeq.config import PolicyConfig, load_config
from codeq.errors import ConfigError
from codeq.policy import GenerationRequest, PolicyEngine, load_policy, resolve_backend
from codeq.policy.transformers_backend import TransformersPolicy
from codeq.schemas import ChatMessage

PROMPTS = [
    "Fix this program: def add(a, b): return a - b",
    "Write a function that reverses a list." * 3,
    "Why does this loop never end? while i < 10: print(i)" * 6,
]


def messages(text: str) -> list[ChatMessage]:
    return [ChatMessage(role="user", content=text)]


@pytest.fixture(scope="module", params=["qwen2", "llama"])
def tiny_dir(request, tmp_path_factory, smollm2_dir) -> Path:
    """A tiny random model of the family (2 layers, hidden 64, GQA) with SmolLM2's tokenizer,
    initialised with std 0.3 so its greedy outputs vary token to token."""
    import torch
    from transformers import (
        AutoTokenizer,
        LlamaConfig,
        LlamaForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
    )

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    family = {"qwen2": (Qwen2Config, Qwen2ForCausalLM), "llama": (LlamaConfig, LlamaForCausalLM)}
    config_class, model_class = family[request.param]
    config = config_class(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        initializer_range=0.3,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp(f"tiny-{request.param}")
    model_class(config).save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    return folder


def policy_config(model: Path, **changes) -> PolicyConfig:
    settings = {
        "model": str(model),
        "dtype": "float32",
        "batch_size": 8,
        "cpu_threads": 1,
        "max_prompt_tokens": 512,
        "max_new_tokens": 32,
        "prefix_cache_tokens": 4096,
    }
    return PolicyConfig(**{**settings, **changes})


@pytest.fixture(scope="module")
def both(tiny_dir) -> tuple[PolicyEngine, TransformersPolicy]:
    """The engine and the transformers backend over the same loaded model."""
    engine = PolicyEngine.load(policy_config(tiny_dir), seed=0)
    return engine, TransformersPolicy(engine, cache_tokens=8192)


def generate_greedy(engine: PolicyEngine, text: str, new_tokens: int) -> list[int]:
    """transformers' `generate`, greedy, stopped at the engine's stop tokens."""
    import torch
    from transformers import GenerationConfig

    ids = engine.encode_chat(messages(text))
    config = GenerationConfig(
        max_new_tokens=new_tokens,
        do_sample=False,
        eos_token_id=sorted(engine.eos_ids),
        pad_token_id=engine.pad_id,
    )
    with torch.inference_mode():
        output = engine.model.generate(torch.tensor([ids]), generation_config=config)
    row = output[0, len(ids) :].tolist()
    stop = next((i for i, t in enumerate(row) if t in engine.eos_ids), len(row) - 1)
    return row[: stop + 1]


# ------------------------------------------------------------------ the transformers backend


def test_greedy_float32_equals_generate_token_for_token(both):
    """Three prompts of different lengths, one of them with three samples, in one batch."""
    engine, policy = both
    policy.clear_prefix_cache()
    requests = [
        GenerationRequest(messages(p), n=3 if i == 1 else 1, temperature=0.0, max_new_tokens=24)
        for i, p in enumerate(PROMPTS)
    ]
    requests = [GenerationRequest(r.messages, r.n, 0.0, 1.0, 24, stop="none") for r in requests]
    results = policy.generate(requests)
    for text, request, result in zip(PROMPTS, requests, results, strict=True):
        expected = generate_greedy(engine, text, 24)
        assert len(set(expected)) > 3, "the tiny model must not repeat one token"
        assert result.token_ids == [expected] * request.n
        assert result.completion_tokens == [len(expected)] * request.n
        assert result.prompt_tokens == len(engine.encode_chat(request.messages))


def test_seeded_samples_repeat_whatever_shares_the_batch_and_draw_as_the_engine(both):
    """At temperature 0.5. Near 1 the tiny model's next-token distribution spreads over
    thousands of tokens, so the float32 rounding that batch composition changes (by ~1e-5 in a
    logit, measured) moves a draw to a neighbouring token, in the engine as here."""
    engine, policy = both
    sampled = GenerationRequest(
        messages(PROMPTS[0]),
        n=3,
        temperature=0.5,
        top_p=0.9,
        max_new_tokens=16,
        stop="none",
        seed=11,
    )
    alone = policy.generate([sampled])[0]
    others = [GenerationRequest(messages(p), n=2, temperature=0.7, seed=3) for p in PROMPTS[1:]]
    crowded = policy.generate([*others, sampled])[-1]
    assert crowded.token_ids == alone.token_ids
    assert len({tuple(ids) for ids in alone.token_ids}) == 3  # each sample its own generator
    # the engine's stream seeds and draws the same way: in float32 the same tokens
    engine.clear_prefix_cache()
    assert engine.generate([sampled])[0].token_ids == alone.token_ids
    other_seed = GenerationRequest(sampled.messages, 3, 0.5, 0.9, 16, stop="none", seed=12)
    assert policy.generate([other_seed])[0].token_ids != alone.token_ids


def test_greedy_and_sampled_requests_share_one_batch(both):
    """Two copies of a seeded request give the same samples. 32 tokens, not the default 768:
    a random model's next-token distribution is nearly flat over 49k tokens, so over hundreds
    of tokens the copies drift apart on float rounding alone (a row's matmul depends on the
    batch's shape on CPUs with AVX-512 kernels: first seen at token 227-483); a wrong uniform
    or row would show within a few tokens."""
    engine, policy = both
    greedy = GenerationRequest(
        messages(PROMPTS[2]), temperature=0.0, max_new_tokens=20, stop="none"
    )
    sampled = GenerationRequest(
        messages(PROMPTS[0]), n=4, temperature=0.5, max_new_tokens=32, seed=5, stop="none"
    )
    result = policy.generate([sampled, greedy, sampled])
    assert result[1].token_ids == [generate_greedy(engine, PROMPTS[2], 20)]
    assert result[0].token_ids == result[2].token_ids


def test_a_stop_rule_ends_the_sample_where_the_engine_ends_it(both):
    """The answer prefix holds a whole score line, so the 'score' rule fires on the first
    token: the backend forces EOS after it, and only the first token counts."""
    engine, policy = both
    request = GenerationRequest(
        messages(PROMPTS[0]),
        n=2,
        temperature=0.0,
        max_new_tokens=8,
        prefix="Score: 7\n",
        stop="score",
    )
    ours, theirs = policy.generate([request])[0], engine.generate([request])[0]
    assert ours.completion_tokens == theirs.completion_tokens == [1, 1]
    assert ours.token_ids == theirs.token_ids and ours.texts == theirs.texts
    assert ours.prompt_tokens == len(engine.encode_chat(request.messages, request.prefix))


def test_samples_share_their_prompt_and_a_continuation_reads_only_its_new_tokens(both):
    engine, policy = both
    policy.clear_prefix_cache()
    request = GenerationRequest(messages(PROMPTS[2]), n=4, temperature=0.0, max_new_tokens=12)
    before = policy.stats.prefilled_tokens
    [first] = policy.generate([request])
    prompt = first.prompt_tokens
    # one read of the prompt but its last token, which each of the 4 samples reads itself
    assert policy.stats.prefilled_tokens - before == prompt + 3
    conversation = [
        *request.messages,
        ChatMessage(role="assistant", content=first.texts[0]),
        ChatMessage(role="user", content="Now score it."),
    ]
    follow_up = GenerationRequest(conversation, temperature=0.0, max_new_tokens=12, stop="none")
    before = policy.stats.prefilled_tokens
    [continued] = policy.generate([follow_up])
    read = policy.stats.prefilled_tokens - before
    assert read < continued.prompt_tokens - prompt + 32  # the earlier blocks were reused
    policy.clear_prefix_cache()
    before = policy.stats.prefilled_tokens
    assert policy.generate([follow_up])[0].token_ids == continued.token_ids
    assert policy.stats.prefilled_tokens - before == continued.prompt_tokens


def test_stream_takes_requests_mid_flight(both):
    engine, policy = both
    stream = policy.stream()
    first = stream.submit(
        GenerationRequest(messages(PROMPTS[0]), temperature=0.0, max_new_tokens=16, stop="none")
    )
    results = dict(stream.step())
    results.update(stream.step())
    second = stream.submit(
        GenerationRequest(messages(PROMPTS[1]), n=2, temperature=0.0, max_new_tokens=10)
    )
    while stream.busy:
        results.update(stream.step())
    assert results[first].token_ids == [generate_greedy(engine, PROMPTS[0], 16)]
    assert results[second].token_ids == [generate_greedy(engine, PROMPTS[1], 10)] * 2


def test_the_batch_keeps_the_callers_random_stream(both):
    """The library reseeds torch's global generator when it builds its batch processor."""
    import torch

    _, policy = both
    policy._batch = None
    torch.manual_seed(5)
    policy.batch()
    drawn = torch.rand(3)
    torch.manual_seed(5)
    assert torch.equal(drawn, torch.rand(3))


@pytest.mark.slow
def test_smollm2_greedy_equals_generate_and_stops_like_the_engine(smollm2_dir):
    """The real SmolLM2-135M in float32: greedy samples equal `generate` token for token, and
    a rewrite ('code') and a critique ('score') stop where the engine's stop."""
    config = policy_config(smollm2_dir, max_new_tokens=96)
    engine = PolicyEngine.load(config, seed=0)
    policy = TransformersPolicy(engine, cache_tokens=8192)
    requests = [
        GenerationRequest(messages(p), n=2, temperature=0.0, max_new_tokens=40, stop="none")
        for p in PROMPTS
    ]
    for text, result in zip(PROMPTS, policy.generate(requests), strict=True):
        assert result.token_ids == [generate_greedy(engine, text, 40)] * 2
    fix = "Fix this code:\n```python\ndef add(a, b):\n    return a - b\n```"
    rewrite = GenerationRequest(messages(fix), temperature=0.0, max_new_tokens=96, stop="code")
    critique = GenerationRequest(
        messages(fix + "\nRate the fix from 1 to 10."),
        temperature=0.0,
        max_new_tokens=48,
        prefix="Score: ",
        stop="score",
    )
    ours, theirs = policy.generate([rewrite, critique]), engine.generate([rewrite, critique])
    for mine, reference in zip(ours, theirs, strict=True):
        assert mine.texts == reference.texts
        assert mine.completion_tokens == reference.completion_tokens
        assert mine.token_ids == reference.token_ids
    assert ours[0].texts[0].rstrip().endswith("```") and ours[0].completion_tokens[0] < 96


# ------------------------------------------------------------------ the seam


def test_auto_is_the_engine_and_each_name_loads_its_backend(tiny_model_dir):
    assert resolve_backend(PolicyConfig()) == "engine"
    assert isinstance(load_policy(policy_config(tiny_model_dir)), PolicyEngine)
    chosen = load_policy(policy_config(tiny_model_dir, backend="transformers"), seed=0)
    assert isinstance(chosen, TransformersPolicy) and chosen.backend == "transformers"
    [result] = chosen.generate([GenerationRequest(messages("Hi"), max_new_tokens=4)])
    assert len(result.texts) == 1 and 1 <= result.completion_tokens[0] <= 4


def test_an_unknown_backend_is_a_config_error_that_lists_the_backends(monkeypatch, capsys):
    with pytest.raises(ConfigError) as raised:
        load_config(None, {"policy": {"backend": "vlm"}})
    assert all(name in str(raised.value) for name in ("engine", "transformers", "vllm"))
    monkeypatch.setenv("CODEQ_POLICY__BACKEND", "hf")
    assert run(["config"]) != 0
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "policy.backend" in errors[0] and "'transformers'" in errors[0]


def test_fp8_is_refused_by_the_engine_and_left_to_vllm(tiny_model_dir):
    with pytest.raises(ConfigError, match="needs policy.backend 'vllm'"):
        load_policy(policy_config(tiny_model_dir, quantization="fp8"))


@pytest.mark.parametrize("installed", [False, True])
def test_vllm_where_it_cannot_run_is_one_config_error_before_anything_loads(
    monkeypatch, tmp_path, installed
):
    """Without the package, or with it but without CUDA (this machine): a ConfigError that
    says what to install or choose, raised before the (here missing) model is looked at."""
    import importlib.util

    real_find_spec = importlib.util.find_spec

    def find_spec(name, *args):
        if name == "vllm":
            return object() if installed else None
        return real_find_spec(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    config = PolicyConfig(model=str(tmp_path / "missing"), backend="vllm")
    with pytest.raises(ConfigError) as raised:
        load_policy(config)
    if installed:
        assert "needs a CUDA GPU" in str(raised.value)
    else:
        assert "not installed" in str(raised.value)
        assert "codeq[vllm]" in raised.value.hint
    assert "'engine' or 'transformers'" in raised.value.hint


def test_a_search_through_the_transformers_backend_repeats_itself(tiny_model_dir, tmp_path):
    """The search does not know which backend runs: MCTS with rewrites, critiques and the
    real sandbox on two builtin tasks, twice from a cleared cache, the same trees."""
    from codeq.sandbox import Sandbox
    from codeq.schemas import Task, read_jsonl
    from codeq.search import run_search

    assert run(["prepare", "--source", "builtin", "--out", str(tmp_path)]) == 0
    tasks = read_jsonl(tmp_path / "train.jsonl", Task)[:2]
    config = load_config(
        None,
        {
            "policy": {
                "model": str(tiny_model_dir),
                "backend": "transformers",
                "dtype": "float32",
                "batch_size": 4,
                "max_new_tokens": 16,
                "critique_max_new_tokens": 8,
                "cpu_threads": 1,
            },
            "search": {"rollouts": 2, "rewrites_per_expansion": 2, "parallel_trees": 2},
        },
    )
    policy = load_policy(config.policy, seed=0)
    assert isinstance(policy, TransformersPolicy)
    with Sandbox(load_config(None, {"sandbox": {"workers": 2}}).sandbox) as sandbox:
        first = run_search(tasks, policy, sandbox, config)
        second = run_search(tasks, policy, sandbox, config)
    trees = [[(n.completion, n.q_ai) for n in t.nodes] for t in first]
    assert trees == [[(n.completion, n.q_ai) for n in t.nodes] for t in second]
    assert [t.task_id for t in first] == [t.task_id for t in tasks]
    assert all(len(t.nodes) == 1 + 2 * 2 for t in first)
    assert policy.stats.sequences > 0 and policy.stats.completion_tokens > 0
