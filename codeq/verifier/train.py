"""Training a verifier: a LoRA and a one-logit score head on the policy's base model, learned
with binary cross-entropy on (task, program) -> passes all tests (transformers' Trainer on
`*ForSequenceClassification`, PEFT task type SEQ_CLS, which trains the score head whole)."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from codeq.config import CodeQConfig, VerifierConfig
from codeq.errors import BadInputError, TrainingDivergedError
from codeq.schemas import Lineage, write_json
from codeq.verifier.data import Program, encode, hold_out_tasks, nothing_to_learn
from codeq.verifier.metrics import rank_auc
from codeq.verifier.model import (
    VERIFIER_FILE,
    VerifierInfo,
    load_classifier,
    logits_to_scores,
    verifier_device,
)

log = logging.getLogger(__name__)

LENGTH_COLUMN = "length"


def lora_config(config: VerifierConfig) -> Any:
    from codeq.train.dpo import lora_config as adapter_lora_config

    return adapter_lora_config(config, task_type="SEQ_CLS")


def training_arguments(config: VerifierConfig, out_dir: Path, device: str, bf16: bool) -> Any:
    from transformers import TrainingArguments

    return TrainingArguments(
        output_dir=str(out_dir / "checkpoints"),
        learning_rate=config.learning_rate,
        per_device_train_batch_size=config.batch_size,
        gradient_accumulation_steps=config.gradient_accumulation_steps,
        num_train_epochs=config.epochs,
        max_steps=config.max_steps,
        bf16=bf16,
        use_cpu=device == "cpu",
        train_sampling_strategy="group_by_length",
        length_column_name=LENGTH_COLUMN,
        remove_unused_columns=False,  # the collator reads the ids and the label
        save_strategy="no",
        logging_steps=1,
        report_to="none",
        seed=config.seed,
        data_seed=config.seed,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )


def collator(tokenizer: Any) -> Any:
    import torch

    def collate(examples: list[dict[str, Any]]) -> dict[str, Any]:
        batch = tokenizer.pad(
            {"input_ids": [example["input_ids"] for example in examples]}, return_tensors="pt"
        )
        labels = [[float(example["label"])] for example in examples]
        return {**batch, "labels": torch.tensor(labels, dtype=torch.float32)}

    return collate


def train_verifier(
    programs: Sequence[Program],
    out_dir: str | Path,
    config: CodeQConfig,
    *,
    base: Lineage,
    written_by: Lineage | None = None,
    round_number: int | None = None,
) -> dict[str, Any]:
    """Train a verifier on labelled `programs` on config.policy.model (whose lineage is
    `base`); write out_dir/verifier/ (adapter, tokenizer, VERIFIER.json) and
    out_dir/metrics.json, and return the metrics (held-out AUC among them)."""
    import torch
    from datasets import Dataset
    from peft import get_peft_model
    from transformers import Trainer
    from transformers.trainer_callback import PrinterCallback

    from codeq.policy.source import resolve_model_source
    from codeq.train.lineage import adapter_sha256
    from codeq.train.model import load_tokenizer

    reason = nothing_to_learn(programs)
    if reason is not None or any(item.passed is None for item in programs):
        raise BadInputError(
            f"cannot train a verifier: {reason or 'some programs are not labelled'}",
            hint="it learns from passing and failing programs, each run on all its task's tests",
        )
    settings = config.verifier
    out_dir = Path(out_dir)
    train, held_out = hold_out_tasks(programs, settings.eval_fraction, settings.seed)
    source = resolve_model_source(config.policy.model, config.policy.cache_dir)
    tokenizer = load_tokenizer(source)
    device, dtype = verifier_device(config)
    torch.manual_seed(settings.seed)
    model = get_peft_model(
        load_classifier(source, dtype, tokenizer.pad_token_id), lora_config(settings)
    )

    def rows(items: Sequence[Program]) -> list[dict[str, Any]]:
        encoded = [encode(tokenizer, i.task, i.program, settings.max_length) for i in items]
        return [
            {"input_ids": ids, "label": float(bool(i.passed)), LENGTH_COLUMN: len(ids)}
            for ids, i in zip(encoded, items, strict=True)
        ]

    log.info(
        "verifier: %d programs to learn from (%d passing), %d held out (%d problems), on %s",
        len(train),
        sum(bool(i.passed) for i in train),
        len(held_out),
        len({i.task.slug for i in held_out}),
        source,
    )
    trainer = Trainer(
        model=model,
        args=training_arguments(settings, out_dir, device, dtype == torch.bfloat16),
        train_dataset=Dataset.from_list(rows(train)),
        data_collator=collator(tokenizer),
    )
    trainer.remove_callback(PrinterCallback)  # our logger reports, not stdout
    started = time.perf_counter()
    result = trainer.train()
    seconds = time.perf_counter() - started
    if not math.isfinite(result.training_loss):
        raise TrainingDivergedError(
            f"the verifier's loss became {result.training_loss}",
            hint="lower verifier.learning_rate",
        )
    heldout_auc = None
    if held_out:
        encoded = [row["input_ids"] for row in rows(held_out)]
        scores = logits_to_scores(model, tokenizer, encoded, settings.batch_size, device)
        heldout_auc = rank_auc(scores, [bool(i.passed) for i in held_out])
        log.info("verifier: AUC %.3f on %d held-out programs", heldout_auc or 0.0, len(held_out))
    folder = out_dir / "verifier"
    model.save_pretrained(str(folder), safe_serialization=True)
    tokenizer.save_pretrained(str(folder))
    counts = {
        "train": len(train),
        "held_out": len(held_out),
        "passing": sum(bool(i.passed) for i in programs),
        "failing": sum(not i.passed for i in programs),
    }
    info = VerifierInfo(
        base=Lineage(base_model=base.base_model, base_sha256=base.base_sha256),
        adapter_sha256=adapter_sha256(folder),
        written_by=written_by,
        round=round_number,
        programs=counts,
        heldout_auc=heldout_auc,
        max_length=settings.max_length,
    )
    (folder / VERIFIER_FILE).write_text(info.model_dump_json(indent=1), encoding="utf-8")
    steps = [entry for entry in trainer.state.log_history if "loss" in entry]
    metrics = {
        "trained": True,
        "verifier": info.model_dump(mode="json"),
        "base_model": source,
        "device": device,
        "global_steps": trainer.state.global_step,
        "train_loss": result.training_loss,
        "train_seconds": round(seconds, 2),
        "heldout_auc": heldout_auc,
        "steps": steps,
        "config": settings.model_dump(),
    }
    write_json(out_dir / "metrics.json", metrics)
    return metrics
