"""Rollout generation and DPO at Qwen2.5-Coder-7B-Instruct's size on one GPU, in one table.

The model is random-initialised with the exact architecture of Qwen2.5-Coder-7B-Instruct (its
config.json values are written below; no weights are needed), with a tokenizer made here (one
token a letter, ChatML template, Qwen's special-token ids), saved once as a model
folder so that every arm loads it the way production loads a checkpoint.

(a) generation: every policy backend that can run here (the engine, transformers' continuous
    batching, vLLM where installed; codeq/policy/backends.py) against `model.generate`, same
    prompts (400-1500 tokens, so the time to first token is the prompt-reading rate), greedy,
    256 new tokens, batch 1/16/64 and 8 prompts x 8 samples, ABBA, with bf16 weights, with
    4-bit NF4 weights (bitsandbytes, the default on CUDA) and with FP8 weights (vLLM's fp8,
    vLLM alone); tokens/s, time to first token, peak memory, the best backend of each case,
    and the batch-1 decode rate as a fraction of the memory-bandwidth bound (weight bytes
    read a step / HBM bandwidth of the device);
(b) one DPO optimizer step through `codeq.train.dpo.build_trainer` (TRL DPOTrainer, LoRA r32
    alpha 64 on the 7 projections, pairs of 2048 tokens, effective batch 16 = 2 pairs x 8
    accumulation steps): LoRA on bf16 weights (the default precision), LoRA on fp32 weights
    (full fp32), and QLoRA on the NF4 base (what training does on CUDA when sampling is NF4);
    seconds for the step and peak memory. An arm that runs out of memory is retried with
    gradient checkpointing, and the table says so;
(c) the projected wall time of one round, collect on N GPUs and train on one, for ~1.4k pairs,
    from the numbers above and the stated work per task.

    python bench/gpu.py                        # CUDA; an H100 takes about 10 minutes
    python bench/gpu.py --tiny                 # the same code path on CPU, tiny Qwen2 config
    python bench/gpu.py --only generate --json gen.json     # the same in two calls:
    python bench/gpu.py --only train --with-json gen.json   # (b), then (c) from both

`--tiny` runs everything on CPU with a tiny config of the same family (Qwen2: q/k/v biases,
GQA, untied head) in well under a minute; the NF4 arms are skipped there (bitsandbytes'
4-bit kernels are CUDA kernels) with the reason printed. Its numbers exercise the code, they
project nothing.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent))
sys.path.insert(0, str(BENCH))

from generate import (  # noqa: E402
    GENERATE,
    PARITY_BACKENDS,
    Case,
    CaseResult,
    PeakMemory,
    agreement,
    check_parity,
    machine,
    measure_case,
    run_engine,
    transformers_over,
)

# config.json of Qwen/Qwen2.5-Coder-7B-Instruct (checked against the published file)
QWEN25_CODER_7B_INSTRUCT: dict[str, Any] = {
    "architectures": ["Qwen2ForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "hidden_act": "silu",
    "hidden_size": 3584,
    "initializer_range": 0.02,
    "intermediate_size": 18944,
    "max_position_embeddings": 32768,
    "max_window_layers": 28,
    "model_type": "qwen2",
    "num_attention_heads": 28,
    "num_hidden_layers": 28,
    "num_key_value_heads": 4,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000.0,
    "sliding_window": 131072,
    "tie_word_embeddings": False,
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 152064,
}
SPECIAL_IDS = {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645}

# The same family at toy size, for --tiny (CPU, seconds).
TINY: dict[str, Any] = {
    **QWEN25_CODER_7B_INSTRUCT,
    "hidden_size": 64,
    "intermediate_size": 128,
    "max_window_layers": 2,
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "num_key_value_heads": 2,
    "vocab_size": 1024,
    "bos_token_id": 1021,
    "eos_token_id": 1023,
}
TINY_SPECIAL_IDS = {"<|endoftext|>": 1021, "<|im_start|>": 1022, "<|im_end|>": 1023}

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
PROMPT_ALPHABET = "abcdefghijklmnopqrstuvwxyz"  # one token a letter (see char_tokenizer)
FIRST_BYTE_ID = 8  # the 256 byte-level symbols take ids 8..263

# HBM bandwidth by device name (bytes/s), for the batch-1 bound.
BANDWIDTH = [
    ("H100 PCIe", 2.0e12),
    ("H100", 3.35e12),  # SXM and NVL report "H100 80GB HBM3"
    ("H200", 4.8e12),
    ("A100-SXM4-80GB", 2.039e12),
    ("A100 80GB PCIe", 1.935e12),
    ("A100", 1.555e12),
    ("L40S", 0.864e12),
]


@dataclass
class Settings:
    """What one run measures: the full size on CUDA, or --tiny on CPU."""

    tiny: bool
    arch: dict[str, Any]
    special_ids: dict[str, int]
    device: str
    batches: list[int]
    new_tokens: int
    prompt_lengths: tuple[int, int]
    train_length: int
    per_device_pairs: int
    accumulation: int
    repeats: int
    siblings: tuple[int, int] = (8, 8)  # prompts x samples each


def settings(args: argparse.Namespace) -> Settings:
    if args.tiny:
        return Settings(
            tiny=True,
            arch=TINY,
            special_ids=TINY_SPECIAL_IDS,
            device="cpu",
            batches=args.batches or [1, 4],
            new_tokens=args.new_tokens or 16,
            prompt_lengths=(40, 150),
            train_length=64,
            per_device_pairs=2,
            accumulation=2,
            repeats=args.repeats or 1,
            siblings=(2, 3),
        )
    return Settings(
        tiny=False,
        arch=QWEN25_CODER_7B_INSTRUCT,
        special_ids=SPECIAL_IDS,
        device="cuda",
        batches=args.batches or [1, 16, 64],
        new_tokens=args.new_tokens or 256,
        prompt_lengths=(400, 1500),
        train_length=2048,
        per_device_pairs=2,
        accumulation=8,
        repeats=args.repeats or 1,
    )


# ---------------------------------------------------------------- model folder


def char_tokenizer(vocab_size: int, special_ids: dict[str, int]) -> Any:
    """One token a character of PROMPT_ALPHABET, ChatML's specials at fixed ids: prompts of an
    exact length, any generated id decodable. A byte-level BPE with no merges, because that is
    what AutoTokenizer rebuilds for a Qwen2 model folder in transformers 5 (Qwen2Tokenizer
    from tokenizer.json's vocab and merges); a word-level model would come back as one that
    drops every word."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"w{i}": i for i in range(vocab_size)}  # ids the model may sample: decodable
    for offset, symbol in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet())):
        del vocab[f"w{FIRST_BYTE_ID + offset}"]
        vocab[symbol] = FIRST_BYTE_ID + offset
    for word, index in special_ids.items():
        del vocab[f"w{index}"]
        vocab[word] = index
    backend = Tokenizer(models.BPE(vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
    )
    tokenizer.chat_template = CHATML
    return tokenizer


def token_count(tokenizer: Any, messages: list[dict[str, str]], generation_prompt: bool) -> int:
    """Tokens of the chat as the engine and the trainer see it (template rendered, then
    encoded without added specials)."""
    text = tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=generation_prompt
    )
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def make_model_folder(run: Settings, folder: Path) -> Path:
    """A random-initialised model of `run.arch` in bf16, saved with its tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(**run.arch)
    torch.manual_seed(0)
    with torch.device(run.device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(folder, safe_serialization=True)
    char_tokenizer(run.arch["vocab_size"], run.special_ids).save_pretrained(folder)
    del model
    free_memory()
    return folder


def free_memory() -> None:
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def chat_prompts(count: int, lengths: tuple[int, int], seed: int = 0) -> list[Any]:
    """`count` user turns of random letters (one token each), lengths spread evenly over
    `lengths`."""
    import random

    from codeq.schemas import ChatMessage

    rng = random.Random(seed)
    low, high = lengths
    prompts = []
    for index in range(count):
        length = low + (index * 7919) % (high - low + 1)
        letters = "".join(rng.choice(PROMPT_ALPHABET) for _ in range(length))
        prompts.append([ChatMessage(role="user", content=letters)])
    return prompts


# ---------------------------------------------------------------- (a) generation


def weight_bytes(model: Any) -> int:
    """Bytes a decode step reads: every parameter and buffer but the input embedding table
    (a step reads one row of it). 4-bit weights count their packed bytes and scales."""
    skip = {id(p) for p in model.get_input_embeddings().parameters()}
    total = 0
    for tensor in [*model.parameters(), *model.buffers()]:
        if id(tensor) in skip:
            continue
        total += tensor.numel() * tensor.element_size()
        state = getattr(tensor, "quant_state", None)
        for part in (
            getattr(state, "absmax", None),
            getattr(getattr(state, "state2", None), "absmax", None),
        ):
            if part is not None:
                total += part.numel() * part.element_size()
    return total


def bandwidth(device_name: str) -> float | None:
    return next((value for key, value in BANDWIDTH if key in device_name), None)


def device_name(run: Settings) -> str:
    import torch

    return torch.cuda.get_device_name(0) if run.device == "cuda" else machine()


@dataclass
class Row:
    """One line of the table."""

    part: str
    arm: str
    setting: str
    value: float | None
    unit: str
    ttft_s: float | None = None
    peak_gib: float | None = None
    ratio: str = ""
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def generation_rows(run: Settings, folder: Path, quantization: str) -> list[Row]:
    """(a) for one weight format: every backend that can run it and `generate`, ABBA, on
    batches of distinct prompts and on `run.siblings` (K samples of a few prompts). FP8 is
    vLLM's alone (the engine and transformers refuse it), so that part has no `generate` arm."""
    from codeq.config import PolicyConfig
    from codeq.policy import PolicyEngine
    from codeq.policy.backends import available_backends

    dtype = "float32" if run.tiny else "bfloat16"
    config = PolicyConfig(
        model=str(folder),
        device=run.device,  # type: ignore[arg-type]
        dtype=dtype,  # type: ignore[arg-type]
        quantization=quantization,  # type: ignore[arg-type]
        batch_size=max(max(run.batches), run.siblings[0] * run.siblings[1]),
        max_prompt_tokens=4096,
        max_new_tokens=max(run.new_tokens, 16),
        prefix_cache_tokens=0,
    )
    label = {"nf4": "NF4", "fp8": "FP8"}.get(quantization, dtype.replace("bfloat16", "bf16"))
    names = available_backends(config)
    policies: dict[str, Any] = {}
    if quantization != "fp8":
        policies["engine"] = PolicyEngine.load(config, seed=0)
    prompts = chat_prompts(max([*run.batches, run.siblings[0]]), run.prompt_lengths)
    found = [Case(f"batch {b}", prompts[:b]) for b in run.batches]
    found.append(Case(f"{run.siblings[0]}x{run.siblings[1]} siblings", *siblings(run, prompts)))
    if "engine" in policies and "transformers" in names:
        policies["transformers"] = transformers_over(policies["engine"], found, run.new_tokens)
    if "vllm" in names:
        from codeq.policy.vllm_backend import VllmPolicy

        share = 0.85 if "engine" not in policies else 0.45  # beside the engine's copy
        vllm_config = config.model_copy(update={"backend": "vllm"})
        policies["vllm"] = VllmPolicy.load(vllm_config, seed=0, gpu_memory_utilization=share)
    if not policies:
        return [Row("(a) generate", f"vllm {label}", "", None, "tok/s", note=VLLM_MISSING)]
    first = next(iter(policies.values()))
    read_bytes = weight_bytes(policies["engine"].model) if "engine" in policies else None
    limit = bandwidth(device_name(run))
    encoded = [len(first.encode_chat(m)) for m in prompts]
    short = [
        len(m[0].content) for m, n in zip(prompts, encoded, strict=True) if n < len(m[0].content)
    ]
    if short:  # the prompt-reading numbers depend on it: never guess
        raise RuntimeError(
            f"{len(short)} bench prompts encode to fewer tokens than their {short[0]} letters: "
            "the model folder's tokenizer does not give one token a letter"
        )
    rows = []
    for case in found:
        prompt_tokens = statistics.mean(encoded[: len(case.messages)])
        result = measure_arms(policies, case, run.new_tokens, run.repeats)
        reference = result.runs.get(GENERATE)
        for arm in result.runs:
            ours = result.runs[arm][0].rows
            if run.tiny and reference is not None and arm in PARITY_BACKENDS:
                check_parity(f"{label} {case.name} {arm}", ours, reference[0].rows)
            notes = []
            if case.samples == 1 and len(case.messages) == 1:
                notes.append(batch1_note(result, arm, read_bytes, limit))
            if arm != GENERATE and reference is not None:
                agree = agreement(ours, reference[0].rows)
                notes.append(f"{agree['identical_rows']}/{agree['rows']} rows equal generate's")
            ratio = ""
            if arm != GENERATE and reference is not None:
                ratio = f"{arm}/generate {result.ratio('tokens_per_s', arm):.2f}x"
            rows.append(
                Row(
                    "(a) generate",
                    f"{arm} {label}",
                    case.name,
                    result.median(arm, "tokens_per_s"),
                    "tok/s",
                    ttft_s=result.median(arm, "ttft_s"),
                    peak_gib=result.median(arm, "peak_mib") / 1024,
                    ratio=ratio,
                    note="; ".join(filter(None, notes)),
                    extra={
                        "runs": result.summary() if reference is not None else None,
                        "weight_bytes": read_bytes,
                        "mean_prompt_tokens": prompt_tokens,
                        "rows": case.rows,
                        "prompt_tokens_read": result.median(arm, "prompt_tokens_read"),
                    },
                )
            )
        if reference is not None:
            best = result.best("tokens_per_s")
            rows[-1].note = "; ".join(filter(None, [rows[-1].note, f"best of the case: {best}"]))
    del policies
    free_memory()
    return rows


VLLM_MISSING = "vllm not installed or no CUDA here: FP8 needs it"


def siblings(run: Settings, prompts: list[Any]) -> tuple[list[Any], int]:
    count, samples = run.siblings
    return prompts[:count], samples


def measure_arms(policies: dict[str, Any], case: Case, new_tokens: int, repeats: int) -> Any:
    """`measure_case` with `generate` when the engine is loaded (its model is generate's);
    without it (FP8: vLLM alone) each backend's runs, in order."""
    if "engine" in policies:
        return measure_case(policies, case, new_tokens, repeats)
    result = CaseResult(case.name, case.rows)
    for arm in policies:
        for _ in range(repeats):
            first = run_engine(policies[arm], case, 1)
            result.first_token.setdefault(arm, []).append(first.seconds)
            result.first_token_cpu.setdefault(arm, []).append(first.cpu_seconds)
            result.runs.setdefault(arm, []).append(run_engine(policies[arm], case, new_tokens))
    return result


def batch1_note(result: Any, arm: str, read_bytes: int | None, limit: float | None) -> str:
    """The batch-1 decode rate, and its share of the memory-bandwidth bound."""
    decode = decode_rate(result, arm)
    if decode is None:
        return "decode rate not separable: the run took no longer than its TTFT"
    if not limit or not read_bytes:
        return f"decode {decode:.1f} tok/s (no bandwidth figure for this device or weights)"
    bound = limit / read_bytes
    return (
        f"decode {decode:.1f} tok/s = {decode / bound:.0%} of the bandwidth bound {bound:.0f} "
        f"tok/s ({read_bytes / 1e9:.2f} GB a step)"
    )


def decode_rate(result: Any, arm: str) -> float | None:
    """Tokens a second after the first: (tokens - rows) / (seconds - time to first token);
    None where the timed run was no longer than the separately timed first token."""
    ttft = result.median(arm, "ttft_s")
    runs = [r for r in result.runs[arm] if r.seconds > ttft]
    if not runs:
        return None
    return statistics.median((r.tokens - len(r.rows)) / (r.seconds - ttft) for r in runs)


# ---------------------------------------------------------------- (b) one DPO step


def training_pairs(run: Settings, tokenizer: Any, count: int) -> list[Any]:
    """`count` pairs whose longer side is exactly `run.train_length` tokens as the chat
    template renders it (prompt 3/4, completion 1/4, as repair pairs are)."""
    import random

    from codeq.schemas import ChatMessage, Pair

    rng = random.Random(1)

    def letters(n: int) -> str:
        return "".join(rng.choice(PROMPT_ALPHABET) for _ in range(n))

    def length(pair: Any) -> int:
        chat = [{"role": "user", "content": pair.prompt[0].content}]
        return token_count(tokenizer, [*chat, {"role": "assistant", "content": pair.chosen}], False)

    empty = [{"role": "user", "content": ""}, {"role": "assistant", "content": ""}]
    content = run.train_length - token_count(tokenizer, empty, False)
    completion = content // 4
    pairs = []
    for index in range(count):
        pairs.append(
            Pair(
                task_id=f"task{index % 4}",
                slug=f"slug{index % 4}",
                level="easy",
                category="logic",
                prompt=[ChatMessage(role="user", content=letters(content - completion))],
                chosen=letters(completion),
                rejected=letters(completion),
                q_chosen=1.0,
                q_rejected=0.0,
            )
        )
    measured = length(pairs[0])
    if measured != run.train_length:  # the step's cost depends on it: never guess
        raise RuntimeError(
            f"a bench pair is {measured} tokens, not {run.train_length}: the model "
            "folder's tokenizer does not give one token a letter"
        )
    return pairs


def train_config(
    run: Settings, folder: Path, precision: str, quantization: str, checkpointing: bool
) -> Any:
    from codeq.config import load_config

    return load_config(
        overrides={
            "policy": {"model": str(folder), "device": run.device, "quantization": quantization},
            "train": {
                "precision": precision,
                "per_device_batch_size": run.per_device_pairs,
                "gradient_accumulation_steps": run.accumulation,
                "max_steps": 1,
                "eval_fraction": 0.0,
                "max_length": run.train_length,
                "gradient_checkpointing": checkpointing,
            },
        }
    )


def one_dpo_step(run: Settings, folder: Path, precision: str, quantization: str) -> Row:
    """One optimizer step through build_trainer; out of memory -> again with checkpointing."""
    import torch

    from codeq.train.model import load_tokenizer

    pairs = training_pairs(
        run, load_tokenizer(str(folder)), run.per_device_pairs * run.accumulation
    )
    label = {"bf16": "LoRA bf16", "fp32": "LoRA fp32"}[precision]
    if quantization == "nf4":
        label = "QLoRA NF4 (bf16 compute)"
    setting = f"{len(pairs)} pairs x {run.train_length} tokens"
    notes = []
    for checkpointing in (False, True):
        memory = PeakMemory(run.device)
        step = None
        try:
            with tempfile.TemporaryDirectory() as work, memory.measure():
                config = train_config(run, folder, precision, quantization, checkpointing)
                step = timed_step(pairs, Path(work), config)
        except torch.cuda.OutOfMemoryError:
            notes.append(
                "out of memory" + (" with" if checkpointing else " without") + " checkpointing"
            )
        free_memory()  # after the except block: its traceback held the trainer
        if step is None:
            continue
        if checkpointing:
            notes.append("gradient checkpointing on")
        return Row(
            "(b) DPO step",
            label,
            setting,
            step,
            "s/step",
            peak_gib=memory.peak_mib / 1024,
            note="; ".join(notes),
        )
    return Row("(b) DPO step", label, setting, None, "s/step", note="; ".join(notes))


def timed_step(pairs: list[Any], work: Path, config: Any) -> float:
    """Seconds of the one optimizer step (the first: its one-off warm-up included)."""
    from codeq.train.dpo import build_trainer

    prepared = build_trainer(pairs, work, config)
    started = time.perf_counter()
    prepared.trainer.train()
    seconds = time.perf_counter() - started
    return prepared.callback.step_seconds[0] if prepared.callback.step_seconds else seconds


# ---------------------------------------------------------------- (c) one round


@dataclass
class RoundWork:
    """The work of one round (defaults: CodeQ's round size and codeq's search defaults)."""

    pairs: int = 1400
    tasks: int = 800
    rewrites_per_task: int = 24  # search.rollouts 8 x search.rewrites_per_expansion 3
    rewrite_tokens: int = 300
    critique_tokens: int = 12
    prompt_tokens_read_per_task: int = 5000  # after the prefix cache
    effective_batch: int = 16
    gpus: tuple[int, ...] = (1, 4, 8)


def projection_rows(rows: list[Row], work: RoundWork, batch: int) -> list[Row]:
    """Collect time from the fastest backend's tokens/s and prompt-reading rate at `batch`
    (any weight format measured; `generate` is not a backend), train time from the measured
    DPO step (QLoRA on NF4, what CUDA trains with by default, else LoRA bf16)."""
    measured = [
        r
        for r in rows
        if r.part == "(a) generate"
        and r.setting == f"batch {batch}"
        and r.value
        and r.ttft_s
        and not r.arm.startswith("generate")
    ]
    generate = max(measured, key=lambda r: r.value or 0.0, default=None)
    train = next(
        (r for r in rows if r.part == "(b) DPO step" and r.value and r.arm.startswith("QLoRA")),
        None,
    ) or next(
        (r for r in rows if r.part == "(b) DPO step" and r.value and r.arm == "LoRA bf16"), None
    )
    if generate is None or train is None or not generate.ttft_s or not generate.value:
        return [Row("(c) round", "projection", "", None, "h", note="needs (a) and (b) numbers")]
    if not train.value:
        return [Row("(c) round", "projection", "", None, "h", note="needs (b) numbers")]
    prompt_rate = batch * generate.extra["mean_prompt_tokens"] / generate.ttft_s
    generated = work.rewrites_per_task * (work.rewrite_tokens + work.critique_tokens)
    per_task = generated / generate.value + work.prompt_tokens_read_per_task / prompt_rate
    steps = math.ceil(work.pairs / work.effective_batch)
    train_hours = steps * train.value / 3600
    out = []
    for gpus in work.gpus:
        collect_hours = work.tasks * per_task / gpus / 3600
        out.append(
            Row(
                "(c) round",
                f"collect on {gpus} GPU{'s' * (gpus > 1)}, train on 1",
                f"{work.tasks} tasks, {work.pairs} pairs",
                collect_hours + train_hours,
                "h",
                note=f"collect {collect_hours:.2f} h ({generate.arm}, batch {batch}) + train "
                f"{train_hours:.2f} h ({steps} steps of {train.arm})",
            )
        )
    return out


# ---------------------------------------------------------------- table and main


def table(rows: list[Row]) -> str:
    lines = [
        "| part | arm | setting | value | TTFT s | peak GiB | ratio | note |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        value = "-" if r.value is None else f"{r.value:,.2f} {r.unit}"
        ttft = "" if r.ttft_s is None else f"{r.ttft_s:.2f}"
        peak = "" if r.peak_gib is None else f"{r.peak_gib:.2f}"
        lines.append(
            f"| {r.part} | {r.arm} | {r.setting} | {value} | {ttft} | {peak} | {r.ratio} | {r.note} |"
        )
    return "\n".join(lines)


def report(
    args: argparse.Namespace,
    run: Settings,
    measured: list[Row],
    notes: list[str],
    started: float,
    final: bool,
) -> None:
    """Write the table (and --json, --markdown) of the rows so far; a run cut off at a device
    time limit keeps every part it finished. Only the final report prints the table."""
    import torch

    rows = list(measured)
    if args.with_json:
        earlier = json.loads(Path(args.with_json).read_text())
        rows = [Row(**r) for r in earlier if r["part"] != "(c) round"] + rows
    rows.sort(key=lambda row: row.part)  # stable: (a) rows, then (b), each in measured order
    rows += projection_rows(rows, RoundWork(), max(run.batches))
    fp32 = next((r for r in rows if r.arm == "LoRA fp32" and r.value), None)
    for row in rows:
        if row.part == "(b) DPO step" and row.value and fp32 and row is not fp32:
            row.ratio = f"{fp32.value / row.value:.2f}x fp32's speed"
    header = (
        f"bench/gpu.py{' --tiny' if run.tiny else ''}: {device_name(run)}; torch {torch.__version__}; "
        f"model: random {'tiny Qwen2' if run.tiny else 'Qwen2.5-Coder-7B-Instruct architecture'}; "
        f"{run.new_tokens} new tokens, prompts {run.prompt_lengths[0]}-{run.prompt_lengths[1]} "
        f"tokens; {time.perf_counter() - started:.0f}s"
    )
    text = "\n".join([header, "", table(rows), *(f"\n{n}" for n in notes)])
    if final:
        print(text, flush=True)
    if args.markdown:
        Path(args.markdown).write_text(text + "\n")
    if args.json:
        Path(args.json).write_text(
            json.dumps([r.__dict__ for r in rows], indent=2, default=str) + "\n"
        )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="tiny Qwen2 config on CPU")
    parser.add_argument("--only", choices=["generate", "train"], help="run one part")
    parser.add_argument("--batches", type=int, nargs="+")
    parser.add_argument("--new-tokens", type=int)
    parser.add_argument("--repeats", type=int, help="runs of each arm (default 1)")
    parser.add_argument(
        "--budget-s",
        type=float,
        default=450,
        help="start no further part after this many seconds (default 450: the last, the fp32 "
        "DPO step, takes about two minutes on an H100 by estimate)",
    )
    parser.add_argument("--work-dir", help="where the model folder goes (default: a temp dir)")
    parser.add_argument(
        "--no-nf4", action="store_true", help="skip the NF4 parts (no bitsandbytes installed)"
    )
    parser.add_argument(
        "--weights",
        nargs="+",
        choices=["bf16", "fp8", "nf4"],
        default=["bf16", "fp8", "nf4"],
        help="the weight formats of part (a), in the order they run (default: bf16 fp8 nf4; "
        "a reversed order shows whether running first costs an arm)",
    )
    parser.add_argument("--json", help="also write every number here")
    parser.add_argument("--markdown", help="also write the table here")
    parser.add_argument(
        "--with-json",
        help="rows of an earlier run's --json (e.g. --only generate) to include and project from",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    import torch

    args = parse_args(argv)
    run = settings(args)
    if run.device == "cuda" and not torch.cuda.is_available():
        print("error: no CUDA device; run with --tiny for the CPU version", file=sys.stderr)
        return 2
    started = time.perf_counter()
    nf4_reason = (
        ""
        if run.device == "cuda"
        else "NF4 and FP8 skipped: bitsandbytes' 4-bit kernels and FP8 are CUDA's"
    )
    if args.no_nf4 and not nf4_reason:
        nf4_reason = "NF4 and FP8 skipped: --no-nf4 (bitsandbytes not installed)"
    rows: list[Row] = []
    skipped: list[str] = []
    with tempfile.TemporaryDirectory(dir=args.work_dir) as tmp:
        folder = make_model_folder(run, Path(tmp) / "model")
        print(
            f"[gpu] random model saved in {time.perf_counter() - started:.0f}s",
            file=sys.stderr,
            flush=True,
        )
        parts: list[tuple[str, Any]] = []  # the longest (the fp32 step) last
        nf4 = not nf4_reason
        generation = {
            "bf16": ("(a) bf16", lambda: generation_rows(run, folder, "none")),
            "fp8": ("(a) FP8", lambda: generation_rows(run, folder, "fp8")),
            "nf4": ("(a) NF4", lambda: generation_rows(run, folder, "nf4")),
        }
        weights = [w for w in args.weights if nf4 or w == "bf16"] if args.only != "train" else []
        if weights[:1] == ["bf16"]:
            parts += [generation["bf16"]]
            weights = weights[1:]
        if args.only != "generate":
            parts += [("(b) LoRA bf16", lambda: [one_dpo_step(run, folder, "bf16", "none")])]
        parts += [generation[w] for w in weights]
        if args.only != "generate" and nf4:
            parts += [("(b) QLoRA NF4", lambda: [one_dpo_step(run, folder, "bf16", "nf4")])]
        if args.only != "generate":
            parts += [("(b) LoRA fp32", lambda: [one_dpo_step(run, folder, "fp32", "none")])]
        for name, measure in parts:
            spent = time.perf_counter() - started
            if spent > args.budget_s:
                skipped.append(
                    f"{name} skipped: {spent:.0f}s spent, over the {args.budget_s:.0f}s budget "
                    "(run it with --only and --with-json)"
                )
                continue
            print(f"[gpu] {name} ...", file=sys.stderr, flush=True)
            rows += measure()
            print(
                f"[gpu] {name} took {time.perf_counter() - started - spent:.0f}s",
                file=sys.stderr,
                flush=True,
            )
            report(
                args,
                run,
                rows,
                [f"partial: written after {name}; the parts after it have not run yet"],
                started,
                final=False,
            )
    report(args, run, rows, [n for n in [nf4_reason, *skipped] if n], started, final=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
