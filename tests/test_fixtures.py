"""The model fixtures load and generate a few tokens (tiny always; real SmolLM2 when slow)."""

from __future__ import annotations

import pytest


def _generate(model_dir, prompt: str, new_tokens: int = 5) -> tuple[str, int]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
    )
    inputs = tokenizer(text, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(
            **inputs, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False
        )
    generated = out[0, inputs["input_ids"].shape[1] :]
    return tokenizer.decode(generated, skip_special_tokens=True), int(generated.shape[0])


def test_tiny_model_generates(tiny_model_dir):
    """The tiny model is a working causal LM: greedy decoding of one prompt is repeatable,
    and its next-token scores depend on the prompt (min_new_tokens fixes how
    many tokens come out, so their count alone would prove nothing)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    text, count = _generate(tiny_model_dir, "Fix this program.")
    again, _ = _generate(tiny_model_dir, "Fix this program.")
    assert count == 5 and text == again
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    with torch.no_grad():
        logits = [
            model(**tokenizer(prompt, return_tensors="pt")).logits[0, -1]
            for prompt in ("Fix this program.", "def add(a, b): return a - b")
        ]
    assert not torch.allclose(logits[0], logits[1])


@pytest.mark.slow
def test_smollm2_generates_sensible_text(smollm2_dir):
    text, count = _generate(smollm2_dir, "What is the capital of France? One word.", new_tokens=8)
    assert count == 8
    assert "paris" in text.lower()
