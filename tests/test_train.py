from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from codeq.config import load_config
from codeq.errors import BadInputError, MissingInputError, ModelLoadError
from codeq.schemas import ChatMessage, Pair, write_jsonl


def make_pairs(
    count: int, tasks: int = 4, long_every: int = 0, long_lines: int = 400
) -> list[Pair]:
    pairs = []
    for index in range(count):
        task = index % tasks
        body = "x = 1\n" * (long_lines if long_every and index % long_every == 0 else 1)
        pairs.append(
            Pair(
                task_id=f"task{task}",
                slug=f"slug{task}",
                level="easy",
                category="logic",
                prompt=[
                    ChatMessage(role="system", content="You fix Python programs."),
                    ChatMessage(
                        role="user", content=f"Fix task {task}:\ndef f(a):\n  return a-{index}"
                    ),
                ],
                chosen=f"```python\ndef f(a):\n    return a + {index}\n{body}```",
                rejected=f"```python\ndef f(a):\n    return a - {index}\n```",
                q_chosen=1.0,
                q_rejected=0.0,
            )
        )
    return pairs


def tiny_config(model_dir: Path, **train: object):
    return load_config(
        overrides={
            "policy": {"model": str(model_dir)},
            "train": {
                "lora_r": 4,
                "lora_alpha": 8,
                "per_device_batch_size": 2,
                "gradient_accumulation_steps": 2,
                "max_steps": 3,
                "learning_rate": 1e-3,
                "max_length": 256,
                "eval_steps": 2,
                "eval_fraction": 0.25,
                **train,
            },
        }
    )


def test_dpo_trains_the_adapter_and_logs_finite_metrics(tmp_path, tiny_model_dir) -> None:
    from safetensors.torch import load_file

    from codeq.train import train_dpo

    pairs_path = tmp_path / "pairs.jsonl"
    write_jsonl(pairs_path, make_pairs(16, long_every=8))
    metrics = train_dpo(pairs_path, tmp_path / "out", tiny_config(tiny_model_dir))

    adapter = tmp_path / "out" / "adapter"
    weights = load_file(adapter / "adapter_model.safetensors")
    lora_b = [tensor for name, tensor in weights.items() if "lora_B" in name]
    assert lora_b, "no LoRA B matrices in the saved adapter"
    # LoRA B starts at zero: any non-zero entry means training changed the adapter
    assert any(float(tensor.abs().max()) > 0 for tensor in lora_b)
    modules = {name.split(".")[-3] for name in weights}
    assert {"q_proj", "v_proj", "down_proj"} <= modules

    saved = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert saved["global_steps"] == 3
    assert saved["pairs"]["dropped_over_max_length"] == 2  # the two very long pairs
    assert saved["pairs"]["train"] + saved["pairs"]["held_out"] == 14
    assert len(saved["steps"]) == 3
    for step in saved["steps"]:
        for key in ("loss", "rewards/accuracies", "rewards/margins"):
            assert math.isfinite(step[key])
    assert saved["eval"], "held-out reward accuracy was never measured"
    assert 0.0 <= saved["heldout_reward_accuracy"] <= 1.0
    assert 0 < saved["tokens"]["real_to_padded"] <= 1.0
    assert metrics["precision"] == saved["precision"]


def test_merge_folds_the_adapter_into_the_base(tmp_path, tiny_model_dir) -> None:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from codeq.train import merge_adapter

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    peft_model = get_peft_model(
        base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "down_proj"])
    )
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.fill_(0.05)
    peft_model.save_pretrained(tmp_path / "adapter")
    inputs = torch.tensor([[1, 2, 3, 4, 5]])
    with torch.no_grad():
        expected = peft_model(inputs).logits

    config = load_config(overrides={"train": {"precision": "fp32"}})
    merged_dir = merge_adapter(
        str(tiny_model_dir), tmp_path / "adapter", tmp_path / "merged", config
    )
    merged = AutoModelForCausalLM.from_pretrained(merged_dir, dtype=torch.float32)
    plain = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    with torch.no_grad():
        got = merged(inputs).logits
        before = plain(inputs).logits
    assert torch.allclose(got, expected, atol=1e-4)
    assert not torch.allclose(got, before, atol=1e-4)
    assert (merged_dir / "tokenizer_config.json").is_file()
    assert not any(merged_dir.glob("adapter_*"))


def test_train_and_merge_fail_clearly_on_missing_inputs(tmp_path, tiny_model_dir) -> None:
    from codeq.train import merge_adapter, train_dpo

    empty = tmp_path / "pairs.jsonl"
    empty.write_text("")
    with pytest.raises(BadInputError, match="no preference pairs"):
        train_dpo(empty, tmp_path / "out", tiny_config(tiny_model_dir))
    with pytest.raises(MissingInputError):
        train_dpo(tmp_path / "absent.jsonl", tmp_path / "out", tiny_config(tiny_model_dir))
    with pytest.raises(ModelLoadError, match="adapter"):
        merge_adapter(str(tiny_model_dir), tmp_path / "nothing", tmp_path / "m", load_config())


def test_held_out_pairs_come_from_unseen_tasks_and_long_pairs_are_counted(tiny_model_dir) -> None:
    from codeq.train.dpo import split_pairs
    from codeq.train.model import load_tokenizer

    pairs = make_pairs(20, tasks=5, long_every=10)
    config = tiny_config(tiny_model_dir, eval_fraction=0.2).train
    train, held_out, over = split_pairs(pairs, load_tokenizer(str(tiny_model_dir)), config)
    assert over == 2
    assert len(train) + len(held_out) == 18 and len(held_out) >= 3

    def task_of(example: dict) -> str:
        return example["prompt"][1]["content"].split(":")[0]

    assert {task_of(e) for e in train}.isdisjoint({task_of(e) for e in held_out})
    assert train[0]["chosen"][0]["role"] == "assistant"


def test_length_bucketing_batches_pairs_of_similar_length(tmp_path, tiny_model_dir) -> None:
    """Half the pairs are ~10x longer than the others. With bucketing (Trainer's
    group_by_length over the pairs' token counts) batches hold pairs of one kind, so they carry
    little padding; without it, random batches mix both kinds. Counted over a whole epoch of
    real train batches (the trainer's own sampler and collator; no training step needed)."""
    from codeq.train.dpo import PaddingMeter, build_trainer

    pairs = [  # both sides of a long pair are long: padding comes only from mixing pairs
        pair.model_copy(update={"rejected": pair.chosen.replace("+", "-")})
        for pair in make_pairs(32, tasks=8, long_every=2, long_lines=60)
    ]
    ratios = {}
    for bucketing in (True, False):
        config = tiny_config(
            tiny_model_dir,
            length_bucketing=bucketing,
            max_length=2048,
            eval_fraction=0.0,
            gradient_accumulation_steps=1,
        )
        prepared = build_trainer(pairs, tmp_path / str(bucketing), config)
        batches = prepared.trainer.get_train_dataloader()
        ratios[bucketing] = PaddingMeter.of(batches).ratio
    assert ratios[True] > 0.85
    assert ratios[False] < 0.75


def test_replayed_pairs_train_against_this_rounds_policy_of_the_same_base_only() -> None:
    from codeq.schemas import AdapterLink, Lineage
    from codeq.train.dpo import common_pair_policy

    base = Lineage(base_model="qwen", base_sha256="a" * 64)
    promoted = base.extended(AdapterLink(round=3, sha256="b" * 64, source="runs/r/round-3/adapter"))
    other_base = Lineage(base_model="smollm2", base_sha256="c" * 64)
    earlier, own = make_pairs(2), make_pairs(2)
    for pair in earlier:
        pair.policy = base
    for pair in own:
        pair.policy = promoted
    # one round's pairs: their writer is the reference; several writers need one named
    assert common_pair_policy(own) == promoted
    with pytest.raises(BadInputError, match="2 different policies"):
        common_pair_policy(own + earlier)
    assert common_pair_policy(own + earlier, reference=promoted) == promoted
    stranger = make_pairs(1)
    stranger[0].policy = other_base
    with pytest.raises(BadInputError, match="another base model") as refused:
        common_pair_policy(own + stranger, reference=promoted)
    assert "smollm2" in str(refused.value) and "qwen" in str(refused.value)
    assert "train.earlier_rounds" in refused.value.hint


def test_a_likelihood_term_on_the_chosen_programs_keeps_them_likelier_than_dpo_alone(
    tmp_path, tiny_model_dir
) -> None:
    """train.sft_weight adds the chosen tokens' negative log-likelihood to DPO's loss (RPO):
    on the same pairs, seed and steps the held-out chosen programs end likelier than under
    DPO alone, and the loss logged is no longer DPO's alone."""
    from codeq.train import train_dpo

    pairs_path = tmp_path / "pairs.jsonl"
    write_jsonl(pairs_path, make_pairs(16))
    runs = {}
    for weight in (0.0, 1.0):
        out = tmp_path / f"sft-{weight}"
        train_dpo(pairs_path, out, tiny_config(tiny_model_dir, sft_weight=weight, max_steps=4))
        runs[weight] = json.loads((out / "metrics.json").read_text())
    chosen = {weight: run["eval"][-1]["eval_logps/chosen"] for weight, run in runs.items()}
    assert chosen[1.0] > chosen[0.0], chosen
    first_loss = {weight: run["steps"][0]["loss"] for weight, run in runs.items()}
    assert first_loss[1.0] > first_loss[0.0] + 0.01, first_loss  # the NLL term is in the loss


def test_held_out_evaluations_reuse_the_references_log_probs_and_compute_the_same(
    tmp_path, tiny_model_dir, monkeypatch
) -> None:
    """The reference's log-probabilities of each held-out batch are computed at the first
    evaluation only: with an evaluation after every step, the metrics of every evaluation and
    the adapter kept are exactly those of computing them each time."""
    from codeq.train import dpo

    pairs_path = tmp_path / "pairs.jsonl"
    write_jsonl(pairs_path, make_pairs(16))
    config = tiny_config(tiny_model_dir, eval_steps=1, max_steps=4, per_device_batch_size=1)
    runs = {}
    for reuse in (True, False):
        monkeypatch.setattr(dpo, "REUSE_REFERENCE_IN_EVAL", reuse)
        runs[reuse] = dpo.train_dpo(pairs_path, tmp_path / f"reuse-{reuse}", config)
    evaluations = len(runs[True]["eval"])
    assert evaluations == 4
    held_out_batches = runs[True]["pairs"]["held_out"]  # one pair a batch
    assert runs[True]["heldout_reference_forwards"] == held_out_batches
    assert runs[False]["heldout_reference_forwards"] == 0  # TRL's own, inside its loss
    timing = (
        "eval_runtime",
        "eval_samples_per_second",
        "eval_steps_per_second",
        "eval_model_preparation_time",
    )
    for with_reuse, without in zip(runs[True]["eval"], runs[False]["eval"], strict=True):
        assert {k: v for k, v in with_reuse.items() if k not in timing} == {
            k: v for k, v in without.items() if k not in timing
        }
    kept = [tmp_path / f"reuse-{r}" / "adapter" / "adapter_model.safetensors" for r in runs]
    assert kept[0].read_bytes() == kept[1].read_bytes()
