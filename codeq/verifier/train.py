"""Training a verifier: a LoRA and a one-logit score head on the policy's base model, learned
with binary cross-entropy on (task, program) -> passes all tests (transformers' Trainer on
`*ForSequenceClassification`, PEFT task type SEQ_CLS, which trains the score head whole), or
(verifier.objective pairwise) with TRL's RewardTrainer on (passing, failing) programs of one
task, so that what tells tasks apart cancels out.

Resumable like DPO (codeq/train/checkpoints.py): every verifier.checkpoint_every_s seconds the
Trainer writes a checkpoint (LoRA and score head, optimizer, scheduler, random states, step) and
it is copied to the store; `resume_from` continues from one of those copies at its step.
"""

from __future__ import annotations

import logging
import math
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from codeq.config import CodeQConfig, VerifierConfig
from codeq.errors import BadInputError, TrainingDivergedError
from codeq.schemas import Lineage, write_json
from codeq.train.checkpoints import (
    CheckpointClock,
    CheckpointTarget,
    checkpoint_step,
    steps_bar,
    upload_checkpoint,
)
from codeq.verifier.data import (
    Program,
    encode,
    hold_out_tasks,
    nothing_to_learn,
    within_task_pairs,
)
from codeq.verifier.metrics import rank_auc, within_task_auc
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
    """The Trainer's arguments; for the pairwise objective TRL's RewardConfig with the same."""
    values: dict[str, Any] = dict(
        output_dir=str(out_dir / "checkpoints"),
        learning_rate=config.learning_rate,
        per_device_train_batch_size=config.batch_size,
        gradient_accumulation_steps=config.gradient_accumulation_steps,
        num_train_epochs=config.epochs,
        max_steps=config.max_steps,
        bf16=bf16,
        use_cpu=device == "cpu",
        activation_checkpointing=config.gradient_checkpointing,
        # checkpoints are asked for by time (the callback below), not by step count; only the
        # newest is kept on disk
        save_strategy="no",
        save_total_limit=1,
        logging_steps=1,
        report_to="none",
        seed=config.seed,
        data_seed=config.seed,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    if config.objective == "pairwise":
        from trl import RewardConfig

        # programs are cut to max_length by `encode`; the pair's two halves share each batch
        return RewardConfig(**values, max_length=None, center_rewards_coefficient=None)
    from transformers import TrainingArguments

    return TrainingArguments(
        **values,
        train_sampling_strategy="group_by_length",
        length_column_name=LENGTH_COLUMN,
        remove_unused_columns=False,  # the collator reads the ids and the label
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


def pair_rows(
    pairs: Sequence[tuple[Program, Program]], tokenizer: Any, max_length: int
) -> list[dict[str, Any]]:
    """RewardTrainer's tokenized rows: the passing program chosen, the failing one rejected."""
    return [
        {
            "chosen_ids": encode(tokenizer, good.task, good.program, max_length),
            "rejected_ids": encode(tokenizer, bad.task, bad.program, max_length),
        }
        for good, bad in pairs
    ]


def checkpoints_callback(every_s: float, target: CheckpointTarget | None) -> Any:
    """A progress bar over the steps, and a checkpoint every `every_s` seconds of training
    (none when 0), each copied to `target` when there is one."""
    from transformers import TrainerCallback

    class PeriodicCheckpoints(TrainerCallback):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            self.clock = CheckpointClock(every_s)
            self.bar: Any = None

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.bar = steps_bar(state, "train (verifier)")
            self.clock.saved()

        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if self.bar is not None:
                self.bar.close()

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if self.bar is not None:
                self.bar.update(1)
            if state.global_step < state.max_steps and self.clock.due():
                control.should_save = True

        def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if target is not None:
                folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
                upload_checkpoint(target, folder, state.global_step)
                log.info(
                    "verifier: step %d's checkpoint kept at %s", state.global_step, target.prefix
                )
            self.clock.saved()

    return PeriodicCheckpoints()


def train_verifier(
    programs: Sequence[Program],
    out_dir: str | Path,
    config: CodeQConfig,
    *,
    base: Lineage,
    written_by: Lineage | None = None,
    round_number: int | None = None,
    rounds: Sequence[int] = (),
    writers: Sequence[Lineage] = (),
    checkpoints: CheckpointTarget | None = None,
    resume_from: Path | None = None,
) -> dict[str, Any]:
    """Train a verifier on labelled `programs` on config.policy.model (whose lineage is
    `base`); write out_dir/verifier/ (adapter, tokenizer, VERIFIER.json) and
    out_dir/metrics.json, and return the metrics (held-out AUC among them). `checkpoints`:
    where checkpoints are copied as training goes; `resume_from`: a checkpoint folder (one of
    those copies) to continue from instead of step 0."""
    import torch
    from datasets import Dataset
    from peft import get_peft_model
    from transformers import Trainer
    from transformers.trainer_callback import PrinterCallback

    from codeq.policy.source import resolve_model_source
    from codeq.train.lineage import adapter_sha256
    from codeq.train.model import load_tokenizer

    settings = config.verifier
    pairwise = settings.objective == "pairwise"
    reason = nothing_to_learn(programs, pairwise)
    if reason is not None or any(item.passed is None for item in programs):
        raise BadInputError(
            f"cannot train a verifier: {reason or 'some programs are not labelled'}",
            hint="it learns from passing and failing programs, each run on all its task's tests",
        )
    out_dir = Path(out_dir)
    train, held_out = hold_out_tasks(programs, settings.eval_fraction, settings.seed)
    if pairwise and nothing_to_learn(train, pairwise):  # every pair fell in the held-out part
        train, held_out = list(programs), []
    source = resolve_model_source(config.policy.model, config.policy.cache_dir)
    tokenizer = load_tokenizer(source)
    device, dtype = verifier_device(config)
    torch.manual_seed(settings.seed)
    model = get_peft_model(
        load_classifier(source, dtype, tokenizer.pad_token_id), lora_config(settings)
    )
    for parameter in model.parameters():  # PEFT keeps LoRA in float32, not the score head:
        if parameter.requires_grad and parameter.dtype == torch.bfloat16:  # steps of 1e-4 fall
            parameter.data = parameter.data.float()  # below bf16's precision; autocast computes

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
    arguments = training_arguments(settings, out_dir, device, dtype == torch.bfloat16)
    callbacks = [checkpoints_callback(settings.checkpoint_every_s, checkpoints)]
    trainer: Trainer
    if pairwise:
        from trl import RewardTrainer

        pairs = within_task_pairs(train, settings.pairs_per_task, settings.seed)
        log.info("verifier: pairwise, %d (passing, failing) pairs of one task", len(pairs))
        trainer = RewardTrainer(
            model=model,
            args=arguments,
            train_dataset=Dataset.from_list(pair_rows(pairs, tokenizer, settings.max_length)),
            processing_class=tokenizer,
            callbacks=callbacks,
        )
    else:
        trainer = Trainer(
            model=model,
            args=arguments,
            train_dataset=Dataset.from_list(rows(train)),
            data_collator=collator(tokenizer),
            callbacks=callbacks,
        )
    trainer.remove_callback(PrinterCallback)  # our logger reports, not stdout
    resumed_step = checkpoint_step(resume_from) if resume_from is not None else None
    if resume_from is not None:
        log.info("verifier: resuming at step %d from %s", resumed_step, resume_from)
    started = time.perf_counter()
    result = trainer.train(resume_from_checkpoint=str(resume_from) if resume_from else None)
    seconds = time.perf_counter() - started
    if not math.isfinite(result.training_loss):
        raise TrainingDivergedError(
            f"the verifier's loss became {result.training_loss}",
            hint="lower verifier.learning_rate",
        )
    heldout_auc, heldout_within = None, None
    if held_out:
        encoded = [row["input_ids"] for row in rows(held_out)]
        scores = logits_to_scores(model, tokenizer, encoded, settings.batch_size, device)
        labels = [bool(i.passed) for i in held_out]
        heldout_auc = rank_auc(scores, labels)
        heldout_within = within_task_auc([i.task.task_id for i in held_out], scores, labels)
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
        rounds=list(rounds),
        writers=list(writers),
        programs=counts,
        heldout_auc=heldout_auc,
        max_length=settings.max_length,
        objective=settings.objective,
    )
    (folder / VERIFIER_FILE).write_text(info.model_dump_json(indent=1), encoding="utf-8")
    shutil.rmtree(out_dir / "checkpoints", ignore_errors=True)  # spent; frees the scratch
    steps = [entry for entry in trainer.state.log_history if "loss" in entry]
    metrics = {
        "trained": True,
        "verifier": info.model_dump(mode="json"),
        "base_model": source,
        "device": device,
        "global_steps": trainer.state.global_step,
        "resumed_from_step": resumed_step,
        "train_loss": result.training_loss,
        "train_seconds": round(seconds, 2),
        "heldout_auc": heldout_auc,
        "heldout_within_task": heldout_within,
        "steps": steps,
        "config": settings.model_dump(),
    }
    write_json(out_dir / "metrics.json", metrics)
    return metrics
