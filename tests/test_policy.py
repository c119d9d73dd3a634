"""PolicyEngine on the tiny random Llama (real SmolLM2 tokenizer): loading rules, batched
generation order and token accounting, the code-block stop, prompts, extraction, critique."""

from __future__ import annotations

import pytest
import torch

from codeq.config import PolicyConfig
from codeq.errors import ConfigError, ModelLoadError
from codeq.policy import GenerationRequest, PolicyEngine, resolve_dtype, resolve_quantization
from codeq.policy.critique import SCORE_PREFIX, parse_score, q_ai_from
from codeq.policy.prompts import extract_program, is_valid_rewrite
from codeq.policy.stopping import (
    StopCondition,
    closes_code_block,
    cut_after_code_block,
    eos_ids,
    gives_score,
)
from codeq.schemas import ChatMessage


@pytest.fixture(scope="module")
def tiny_engine(tiny_model_dir) -> PolicyEngine:
    config = PolicyConfig(model=str(tiny_model_dir), dtype="float32", batch_size=4)
    return PolicyEngine.load(config, seed=0)


def chat(text: str) -> list[ChatMessage]:
    return [ChatMessage(role="user", content=text)]


def test_load_sets_left_padding_cpu_and_dtype(tiny_engine):
    assert tiny_engine.device == "cpu" and tiny_engine.quantization == "none"
    assert tiny_engine.tokenizer.padding_side == "left"
    assert tiny_engine.tokenizer.pad_token_id is not None
    assert tiny_engine.dtype == torch.float32


def test_batched_greedy_generation_matches_one_by_one_and_counts_tokens(tiny_engine):
    prompts = ["Fix this.", "A much longer prompt about a buggy program that needs fixing.", "x"]
    requests = [
        GenerationRequest(chat(p), n=1, temperature=0.0, max_new_tokens=12) for p in prompts
    ]
    batched = tiny_engine.generate(requests)
    single = [tiny_engine.generate([r])[0] for r in requests]
    assert [r.texts for r in batched] == [r.texts for r in single]
    for result, prompt in zip(batched, prompts, strict=True):
        assert result.prompt_tokens == len(tiny_engine.encode_chat(chat(prompt)))
        assert len(result.completion_tokens) == 1 and 1 <= result.completion_tokens[0] <= 12


def test_several_samples_per_prompt_across_chunks_keep_request_order(tiny_engine):
    requests = [
        GenerationRequest(chat(f"prompt {i}"), n=n, temperature=0.8, max_new_tokens=6)
        for i, n in enumerate([3, 1, 2])
    ]
    tiny_engine.stats.max_rows = 0
    tiny_engine.clear_prefix_cache()
    results = tiny_engine.generate(requests, seed=1)
    assert [len(r.texts) for r in results] == [3, 1, 2]
    assert tiny_engine.stats.max_rows <= 4  # 6 sequences, never more than batch_size 4 at once
    # From the same state. (A warm prefix cache reads the prompt by another path: its logits
    # differ at float precision, which moves samples of this random model's flat distribution.)
    tiny_engine.clear_prefix_cache()
    again = tiny_engine.generate(requests, seed=1)
    assert [r.texts for r in again] == [r.texts for r in results]  # seeded: reproducible


def test_stream_admits_requests_mid_flight_and_returns_each_when_done(tiny_engine):
    """Continuous batching: a request submitted while others decode joins the batch, comes
    back as soon as its own samples stop, and decodes exactly as it would alone (greedy)."""
    long = GenerationRequest(
        chat("A long one."), n=2, temperature=0.0, max_new_tokens=12, stop="none"
    )
    short = GenerationRequest(chat("Short."), n=1, temperature=0.0, max_new_tokens=3, stop="none")
    alone = {id(r): tiny_engine.generate([r])[0].texts for r in (long, short)}
    stream = tiny_engine.stream()
    first = stream.submit(long)
    done: dict[int, tuple[int, list[str]]] = {}
    for step in range(1, 40):
        if step == 4:  # the long request has 3 tokens already
            second = stream.submit(short)
        for ticket, result in stream.step():
            done[ticket] = (step, result.texts)
        if not stream.busy:
            break
    assert done[first][1] == alone[id(long)] and done[second][1] == alone[id(short)]
    assert done[second][0] < done[first][0]  # the late, short request finished first
    assert tiny_engine.stats.max_rows <= tiny_engine.batch_size


def test_a_decode_step_reads_back_only_its_tokens(tiny_engine, monkeypatch):
    """Nothing in a decode step waits for the device but the one read of the step's tokens
    (which the stop rules need): no lengths, masks or row checks read back, also in the steps
    where rows finish and leave. Sampled rows with top-p 1 (top-p below 1 sorts on the host's
    side only on CPU, by design)."""
    import collections

    stream = tiny_engine.stream()
    for index, (n, budget, seed) in enumerate([(2, 4, 1), (1, 30, None), (1, 7, 2)]):
        temperature = 0.0 if index == 0 else 0.8
        stream.submit(
            GenerationRequest(
                chat(f"prompt {index} " * (index + 1)),
                n=n,
                temperature=temperature,
                top_p=1.0,
                max_new_tokens=budget,
                stop="none",
                seed=seed,
            )
        )
    stream.step()  # the prompts read, the first tokens
    reads: collections.Counter[str] = collections.Counter()
    for name in ("__bool__", "__int__", "__float__", "__index__", "item", "tolist", "nonzero"):
        original = getattr(torch.Tensor, name)

        def counted(self, *args, _name=name, _original=original, **kwargs):
            reads[_name] += 1
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    steps = 0
    while len(stream.sequences) > 1:
        stream.step()
        steps += 1
    monkeypatch.undo()
    assert steps >= 5 and dict(reads) == {"tolist": steps}  # rows left at steps 3 and 6


def test_prompts_are_cut_from_the_top(tiny_model_dir):
    config = PolicyConfig(model=str(tiny_model_dir), dtype="float32", max_prompt_tokens=64)
    engine = PolicyEngine.load(config)
    ids = engine.encode_chat(chat("word " * 500))
    assert len(ids) == 64
    assert engine.tokenizer.decode(ids).endswith("assistant\n")


def test_stop_condition_stops_a_sequence_at_its_closing_fence(tiny_engine):
    tok = tiny_engine.tokenizer
    texts = ["```python\nx = 1\n```", "no code here, just words and more words"]
    rows = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    stops = [StopCondition(tok, eos_ids(tok), "code") for _ in rows]
    first_done: list[int | None] = [None, None]
    for row, ids in enumerate(rows):
        for step, token in enumerate(ids, start=1):
            if stops[row].update(token, step) and first_done[row] is None:
                first_done[row] = step
    assert first_done == [len(rows[0]), None]
    assert [stop.length for stop in stops] == [len(rows[0]), None]


class CountingTokenizer:
    """The tokenizer, counting the calls of `decode`."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer, self.decodes = tokenizer, 0

    def decode(self, ids, **kwargs) -> str:
        self.decodes += 1
        return self.tokenizer.decode(ids, **kwargs)


@pytest.mark.parametrize("kind", ["code", "score"])
def test_stop_conditions_stop_where_the_decoded_text_does_and_decode_a_token_once(
    tiny_engine, kind
):
    """A stop rule is checked on the text of the tokens so far only when the new token can
    complete it, and a token's text is decoded once: it stops at the same token as decoding
    every token and checking the whole text, whatever the answer's prefix (one that already
    stops the text stops it at the first token)."""
    tok = tiny_engine.tokenizer
    texts = [
        "```python\nx = 1\n```\nand more",
        "no code ``` here\n but a fence ```` later",
        "Score: 7/10\nbecause",
        "The score is 8 out of 10. Then\n more",
        "score: 99.99999999",
        "words 12.5 and `x` with\nnewlines",
    ]
    counting = CountingTokenizer(tok)
    rows = [tok(text, add_special_tokens=False)["input_ids"] for text in texts]
    for prefix in ["", "Score: ", "```py\nx\n```"]:
        for ids in rows:
            stop = StopCondition(counting, set(), kind, prefix)
            stopped = next((s for s, t in enumerate(ids, 1) if stop.update(t, s)), None)
            tail, expected = prefix, None
            for step, token in enumerate(ids, start=1):
                tail += tok.decode([token])
                if closes_code_block(tail) if kind == "code" else gives_score(tail):
                    expected = step
                    break
            assert stopped == expected == stop.length, (prefix, tok.decode(ids))
    assert 0 < counting.decodes <= len({t for ids in rows for t in ids})  # each once at most


def test_greedy_decoding_matches_transformers_generate(tiny_engine):
    """Our loop (shared prompt prefill, padded cache, finished rows dropped) picks the same
    tokens as `model.generate` on the same prompts."""
    prompts = ["Fix this.", "A much longer prompt about a buggy program that needs fixing."]
    requests = [
        GenerationRequest(chat(p), n=2, temperature=0.0, max_new_tokens=10, stop="none")
        for p in prompts
    ]
    ours = tiny_engine.generate(requests)
    tok, model = tiny_engine.tokenizer, tiny_engine.model
    for request, result in zip(requests, ours, strict=True):
        ids = torch.tensor([tiny_engine.encode_chat(request.messages)])
        with torch.inference_mode():
            reference = model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=10,
                do_sample=False,
                pad_token_id=tok.pad_token_id,
                eos_token_id=sorted(eos_ids(tok)),
            )
        expected = tok.decode(reference[0, ids.shape[1] :], skip_special_tokens=True)
        assert result.texts == [expected, expected]


def test_prefix_cache_reads_only_new_tokens_and_changes_no_output(tiny_model_dir):
    def engine(cache_tokens: int) -> PolicyEngine:
        config = PolicyConfig(
            model=str(tiny_model_dir), dtype="float32", prefix_cache_tokens=cache_tokens
        )
        return PolicyEngine.load(config, seed=0)

    problem = "Fix this program so that it returns the sum of a list. " * 8
    first = chat(problem)
    deeper = [
        *first,
        ChatMessage(role="assistant", content="```python\ndef f(xs):\n    return 0\n```"),
        ChatMessage(role="user", content="It fails f([1, 2]): expected 3."),
    ]
    siblings = [chat(problem + tail) for tail in ("def f(xs): pass", "def f(ys): return 1")]
    batches = [[first], [deeper], siblings]
    outputs = {}
    for cache_tokens in (0, 4096):
        policy = engine(cache_tokens)
        texts = []
        for messages in batches:
            requests = [
                GenerationRequest(m, n=2, temperature=0.0, max_new_tokens=8, stop="none")
                for m in messages
            ]
            texts.append([r.texts for r in policy.generate(requests)])
        outputs[cache_tokens] = (texts, policy.stats)
    assert outputs[4096][0] == outputs[0][0]
    without, with_cache = outputs[0][1], outputs[4096][1]
    assert without.prefilled_tokens == without.prompt_tokens
    # The deeper prompt reads only the turn it adds; the siblings share the problem.
    assert with_cache.prefilled_tokens < 0.6 * without.prefilled_tokens


def test_fence_and_score_helpers():
    assert gives_score("I think so.\nScore: 7/10\n") and not gives_score("Score: 7")
    assert not gives_score("Score: 0.8125") and gives_score("Score: 99.99999")
    assert closes_code_block("Sure:\n```python\nx = 1\n```")
    assert not closes_code_block("```python\nx = 1\n")
    assert cut_after_code_block("```\na\n``` trailing words") == "```\na\n```"


def test_nf4_on_cpu_is_a_config_error_and_auto_picks_by_device():
    with pytest.raises(ConfigError, match="CUDA"):
        resolve_quantization(PolicyConfig(quantization="nf4"), "cpu")
    assert resolve_quantization(PolicyConfig(), "cpu") == "none"
    assert resolve_quantization(PolicyConfig(), "cuda") == "nf4"
    assert resolve_dtype(PolicyConfig(dtype="float32"), "cpu") == torch.float32
    assert resolve_dtype(PolicyConfig(), "cpu") in (torch.bfloat16, torch.float32)


def test_missing_adapter_and_missing_model_are_model_load_errors(tiny_model_dir, tmp_path):
    with pytest.raises(ModelLoadError, match="adapter"):
        PolicyEngine.load(PolicyConfig(model=str(tiny_model_dir), adapter=str(tmp_path / "none")))
    with pytest.raises(ModelLoadError):
        PolicyEngine.load(PolicyConfig(model=str(tmp_path / "missing.gguf")))


def test_lora_adapter_is_applied(tiny_model_dir, tmp_path):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    peft_model = get_peft_model(
        base, LoraConfig(r=2, target_modules=["q_proj"], init_lora_weights=False)
    )
    peft_model.save_pretrained(tmp_path / "adapter")
    plain = PolicyEngine.load(PolicyConfig(model=str(tiny_model_dir), dtype="float32"))
    adapted = PolicyEngine.load(
        PolicyConfig(model=str(tiny_model_dir), dtype="float32", adapter=str(tmp_path / "adapter"))
    )
    ids = torch.tensor([plain.encode_chat(chat("hello"))])
    with torch.inference_mode():
        assert not torch.allclose(plain.model(ids).logits, adapted.model(ids).logits)


@pytest.mark.parametrize(
    ("text", "program"),
    [
        ("Fixed:\n```python\ndef f():\n    return 1\n```\nDone.", "def f():\n    return 1\n"),
        ("```python\nold\n```\nBetter:\n```py\nnew = 2\n```", "new = 2\n"),
        ("```python\nclass A:\n    pass", "class A:\n    pass\n"),  # unterminated last block
        ("Here you go.\nclass S:\n    x = 1\n", "class S:\n    x = 1\n"),  # no fence
        ("I don't know.", ""),
        ("```python\n\n```", ""),
    ],
)
def test_extract_program(text, program):
    assert extract_program(text) == program


def test_unchanged_or_empty_rewrites_are_invalid():
    assert not is_valid_rewrite("", "x = 1\n")
    assert not is_valid_rewrite("x = 1\n\n", "x = 1")
    assert is_valid_rewrite("x = 2\n", "x = 1\n")


@pytest.mark.parametrize(
    ("text", "score"),
    [
        ("Score: 7/10. Looks right.", 0.7),
        ("score = 0.9", 0.9),
        ("I'd give it 3 out of 10", 0.3),
        ("Confidence 80%", 0.8),
        ("Score: 12/10", 1.0),
        ("It is correct. 8", 0.8),
        ("No idea at all.", None),
    ],
)
def test_parse_score(text, score):
    parsed = parse_score(text)
    assert parsed == (pytest.approx(score) if score is not None else None)


def test_q_ai_averages_parsed_scores_and_is_neutral_without_any():
    assert q_ai_from(["Score: 2/10", "Score: 4/10"]) == pytest.approx(0.3)
    assert q_ai_from(["nothing"]) == 0.5
    assert q_ai_from(["7/10 because"], prefix="Score: ") == pytest.approx(0.7)


@pytest.mark.slow
def test_smollm2_stops_at_the_code_block_and_the_score_line(smollm2_dir):
    from codeq.policy.critique import critique_request
    from codeq.policy.prompts import agent_messages
    from codeq.schemas import Task

    task = Task(
        task_id="0" * 16,
        slug="add-two",
        level="easy",
        category="logic",
        subtype="operation error",
        description="Return the sum of a and b.",
        examples=["Input: a = 1, b = 2\nOutput: 3"],
        buggy_code="class Solution:\n    def add(self, a: int, b: int) -> int:\n        return a - b\n",
        oracle_code="class Solution:\n    def add(self, a: int, b: int) -> int:\n        return a + b\n",
        visible_tests=[],
        hidden_tests=[],
    )
    engine = PolicyEngine.load(PolicyConfig(model=str(smollm2_dir), cpu_threads=1), seed=0)
    rewrite = GenerationRequest(
        agent_messages(task), n=1, temperature=0.0, max_new_tokens=200, keep_cache=True
    )
    (code,) = engine.generate([rewrite])
    assert code.texts[0].rstrip().endswith("```") and code.completion_tokens[0] < 200
    assert extract_program(code.texts[0]).strip()
    # The critique continues the conversation: the rewrite's KV, kept, is not read again.
    review = critique_request(
        agent_messages(task), code.texts[0], temperature=0.0, max_new_tokens=40
    )
    before = engine.stats.prefilled_tokens
    (score,) = engine.generate([review])
    read = engine.stats.prefilled_tokens - before
    new_turn = score.prompt_tokens - code.prompt_tokens - code.completion_tokens[0]
    assert read <= new_turn + 4
    # done at the end of its line, or (greedy SmolLM2 on some CPUs) once its number runs away
    assert gives_score(SCORE_PREFIX + score.texts[0]) and score.completion_tokens[0] < 20
    assert parse_score("Score: " + score.texts[0]) is not None
