"""DPO with a LoRA adapter (TRL's DPOTrainer), set up deliberately rather than by TRL 1.x defaults.

- Precision 'bf16': weights and activations in bf16, while TRL's fused LM head computes the
  per-token log-probabilities in fp32 (its chunked log-softmax upcasts every logit tile), which is
  the fix for NaN rewards; the LoRA weights and optimizer state stay fp32. 'fp32': everything fp32.
- Gradient checkpointing and the learning rate come from our config (TRL's defaults: on, 1e-6).
- Pairs longer than max_length are dropped and counted, never truncated.
- Length bucketing groups pairs of similar length into the same micro-batch.
- A held-out slice (split by task) is evaluated every eval_steps; the adapter weights with the best
  held-out reward accuracy are kept and written (safetensors) with a per-step metrics log. The
  reference's log-probabilities of each held-out pair are computed at the first evaluation and
  reused at the later ones (the reference never changes: the same numbers, half the forwards).
- A non-finite loss or gradient norm fails the stage with TrainingDivergedError.
- train.processes > 1 trains data-parallel, one process per GPU (codeq/train/distributed.py),
  with the same pairs per optimizer step and the same metrics.json; rank 0 writes the adapter.
- Every train.checkpoint_every_s seconds a checkpoint is written and (rank 0) copied to the store
  (codeq/train/checkpoints.py); `resume_from` continues from one at the step it was written.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import math
import random
import shutil
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from codeq.config import CodeQConfig, TrainConfig, VerifierConfig
from codeq.errors import BadInputError, ConfigError, TrainingDivergedError
from codeq.policy.source import resolve_model_source
from codeq.schemas import Lineage, Pair, read_jsonl, write_json
from codeq.train.checkpoints import (
    BEST_ADAPTER_NAME,
    CheckpointClock,
    CheckpointTarget,
    checkpoint_step,
    read_rank_state,
    steps_bar,
    upload_checkpoint,
    write_rank_state,
)
from codeq.train.distributed import batch_plan, launch_ranks, local_rank, this_rank, world_size
from codeq.train.model import load_tokenizer, load_training_model, training_quantization

log = logging.getLogger(__name__)

ACCURACY_KEY = "eval_rewards/accuracies"
PROVENANCE_FILE = "provenance.json"
LENGTH_COLUMN = "length"  # tokens of the longer side of a pair; Trainer buckets batches by it
# Held-out evaluations reuse the reference's log-probabilities (bench/train.py measures the
# evaluation without it, the tests compare the two)
REUSE_REFERENCE_IN_EVAL = True


def batch_key(inputs: Any) -> str:
    """What identifies a collated batch of pairs: its tokens and masks."""
    import hashlib

    digest = hashlib.sha256()
    for name in ("input_ids", "attention_mask", "completion_mask"):
        if name in inputs:
            digest.update(name.encode())
            digest.update(inputs[name].detach().cpu().numpy().tobytes())
    return digest.hexdigest()


@dataclass
class PaddingMeter:
    """Counts real (attended) and padded tokens of the batches it is shown: the trainer shows
    it each micro-batch it trains on (not each one its data loader builds: the loader reads one
    ahead, and a resumed run builds again the batches it skips)."""

    real_tokens: int = 0
    padded_tokens: int = 0
    batches: int = 0

    def count(self, batch: Any) -> None:
        self.real_tokens += int(batch["attention_mask"].sum())
        self.padded_tokens += int(batch["input_ids"].numel())
        self.batches += 1

    @classmethod
    def of(cls, batches: Any) -> PaddingMeter:
        meter = cls()
        for batch in batches:
            meter.count(batch)
        return meter

    @property
    def ratio(self) -> float | None:
        return self.real_tokens / self.padded_tokens if self.padded_tokens else None


@dataclass
class PairSplit:
    train: list[dict[str, Any]]
    held_out: list[dict[str, Any]]
    over_max_length: int
    lengths: dict[str, int] = field(default_factory=dict)


def conversational_example(pair: Pair) -> dict[str, Any]:
    """TRL's conversational preference format: the prompt messages that produced both siblings,
    the completions as assistant turns (rendered with the same chat template as generation)."""
    return {
        "prompt": [message.model_dump() for message in pair.prompt],
        "chosen": [{"role": "assistant", "content": pair.chosen}],
        "rejected": [{"role": "assistant", "content": pair.rejected}],
    }


def _token_count(tokenizer: Any, messages: list[dict[str, str]]) -> int:
    ids = tokenizer.apply_chat_template(messages, tokenize=True)
    if isinstance(ids, dict) or hasattr(ids, "keys"):
        ids = ids["input_ids"]
    return len(ids)


def pair_length(tokenizer: Any, example: dict[str, Any]) -> int:
    """Tokens of the longer side (prompt + chosen or prompt + rejected) as the template renders it."""
    return max(
        _token_count(tokenizer, example["prompt"] + example["chosen"]),
        _token_count(tokenizer, example["prompt"] + example["rejected"]),
    )


def split_pairs(
    pairs: list[Pair], tokenizer: Any, config: TrainConfig
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], int]:
    """Drop (and count) pairs over max_length, then hold out whole problems for reward accuracy."""
    kept: list[tuple[Pair, dict[str, Any]]] = []
    over = 0
    for pair in pairs:
        example = conversational_example(pair)
        length = pair_length(tokenizer, example)
        if length > config.max_length:
            over += 1
            continue
        kept.append((pair, {**example, LENGTH_COLUMN: length}))
    if over:
        log.warning(
            "dropped %d of %d pairs longer than max_length=%d", over, len(pairs), config.max_length
        )
    if not kept:
        raise BadInputError(
            f"all {len(pairs)} pairs are longer than train.max_length={config.max_length} tokens",
            hint="raise train.max_length (CODEQ_TRAIN__MAX_LENGTH)",
        )
    train, held_out = _hold_out_by_slug(kept, config)
    return train, held_out, over


def _hold_out_by_slug(
    kept: list[tuple[Pair, dict[str, Any]]], config: TrainConfig
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Hold out whole problems (every pair of a slug on one side), so held-out reward accuracy
    measures problems the adapter never trained on."""
    if config.eval_fraction <= 0 or len(kept) < 2:
        return [example for _, example in kept], []
    target = max(1, round(config.eval_fraction * len(kept)))
    by_slug: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for pair, example in kept:
        by_slug[pair.slug].append(example)
    slugs = sorted(by_slug)
    random.Random(config.seed).shuffle(slugs)
    held_out: list[dict[str, Any]] = []
    train: list[dict[str, Any]] = []
    if len(slugs) == 1:  # one problem only: split its pairs instead
        examples = list(by_slug[slugs[0]])
        random.Random(config.seed).shuffle(examples)
        return examples[target:], examples[:target]
    for slug in slugs:
        slug_examples = by_slug[slug]
        if len(held_out) < target and len(held_out) + len(slug_examples) < len(kept):
            held_out.extend(slug_examples)
        else:
            train.extend(slug_examples)
    return train, held_out


def require_tracking_client(report_to: str) -> None:
    """train.report_to names a client that is not installed: a config error (exit 2), not a
    crash inside the trainer after the model has loaded."""
    if report_to != "none" and importlib.util.find_spec(report_to) is None:
        raise ConfigError(
            f"train.report_to={report_to!r} but the {report_to!r} package is not installed",
            hint=f"use an image with `pip install {report_to}`, or set train.report_to=none",
        )


def dpo_arguments(config: TrainConfig, out_dir: Path, has_eval: bool, use_bf16: bool) -> Any:
    import torch
    from trl import DPOConfig

    plan = batch_plan(config)  # one process: the config's batch; N: each rank's share of it
    return DPOConfig(
        output_dir=str(out_dir / "checkpoints"),
        learning_rate=config.learning_rate,
        beta=config.beta,
        **loss_terms(config),
        per_device_train_batch_size=plan.per_device_batch_size,
        per_device_eval_batch_size=plan.per_device_batch_size,
        gradient_accumulation_steps=plan.gradient_accumulation_steps,
        num_train_epochs=config.epochs,
        max_steps=config.max_steps,
        bf16=use_bf16,
        fp16=False,
        use_cpu=not torch.cuda.is_available(),
        activation_checkpointing=config.gradient_checkpointing,
        # length bucketing through Trainer's own option: batches of pairs of similar length
        train_sampling_strategy="group_by_length" if config.length_bucketing else "random",
        length_column_name=LENGTH_COLUMN,
        remove_unused_columns=False,  # keep the length column for the sampler; the collator
        # reads only the token ids
        max_length=config.max_length,  # longer pairs were dropped before; this never truncates
        eval_strategy="steps" if has_eval else "no",
        eval_steps=config.eval_steps,
        # the best adapter is kept in memory by the callback, which also asks for a resumable
        # checkpoint every checkpoint_every_s seconds (time, not steps: a step takes seconds on
        # a GPU and minutes on a CPU); only the newest is kept on disk
        save_strategy="no",
        save_total_limit=1,
        logging_steps=1,
        logging_first_step=True,
        report_to=config.report_to,
        seed=config.seed,
        data_seed=config.seed,
        dataloader_num_workers=0,
        disable_tqdm=True,
        # every LoRA weight gets a gradient each step: DDP need not search for unused ones
        ddp_find_unused_parameters=False,
    )


def loss_terms(config: TrainConfig) -> dict[str, Any]:
    """DPO's sigmoid loss, and with train.sft_weight the chosen tokens' likelihood beside it."""
    if not config.sft_weight:
        return {"loss_type": ["sigmoid"]}
    return {"loss_type": ["sigmoid", "sft"], "loss_weights": [1.0, config.sft_weight]}


def lora_config(config: TrainConfig | VerifierConfig, task_type: str = "CAUSAL_LM") -> Any:
    """The LoRA of a trained adapter: the policy's (causal LM) or the verifier's (SEQ_CLS)."""
    from peft import LoraConfig

    return LoraConfig(
        r=config.lora_r,
        lora_alpha=config.lora_alpha,
        lora_dropout=config.lora_dropout,
        target_modules=list(config.target_modules),
        bias="none",
        task_type=task_type,
    )


def _make_trainer_class() -> Any:
    from transformers.trainer_callback import PrinterCallback
    from trl import DPOTrainer

    class MeteredDPOTrainer(DPOTrainer):  # type: ignore[misc, valid-type]
        """DPOTrainer that meters the padding of the batches it trains on, buckets lengths
        over a whole optimizer step when data-parallel (Trainer's `_get_train_sampler`), and
        computes the reference's log-probabilities of each held-out batch once."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.reuse_reference_in_eval = REUSE_REFERENCE_IN_EVAL
            self.remove_callback(PrinterCallback)  # logs go to stderr via our callback, not stdout
            self.train_meter = PaddingMeter()
            self.reference_logps: dict[str, tuple[Any, Any]] = {}  # held-out batch -> its logps
            self.reference_forwards = 0  # in evaluation

        def _compute_loss(self, model: Any, inputs: Any, return_outputs: bool) -> Any:
            """In evaluation, TRL's loss with the reference log-probabilities this batch got at
            the first evaluation from TRL's own `compute_ref_log_probs` (what its precompute
            uses): the reference (the adapter disabled, or the kept reference model) is frozen,
            so the numbers are the same every time (tests/test_train.py)."""
            policy: Any = self.model
            if policy.training or self.precompute_ref_logps or not self.reuse_reference_in_eval:
                return super()._compute_loss(model, inputs, return_outputs)
            key = batch_key(inputs)
            if key not in self.reference_logps:
                reference: Any = self.ref_model or self.model  # as TRL's precompute passes it
                self.reference_logps[key] = self.compute_ref_log_probs(reference, inputs)
                self.reference_forwards += 1
            chosen, rejected = self.reference_logps[key]
            with_reference = {**inputs, "ref_chosen_logps": chosen, "ref_rejected_logps": rejected}
            self.precompute_ref_logps = True  # TRL reads them from the batch then
            try:
                return super()._compute_loss(model, with_reference, return_outputs)
            finally:
                self.precompute_ref_logps = False

        def training_step(self, model: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
            self.train_meter.count(inputs)
            return super().training_step(model, inputs, *args, **kwargs)

        def _get_train_sampler(self, train_dataset: Any = None) -> Any:
            """Length bucketing groups over a whole optimizer step's pairs on every rank, as on
            one process (Trainer groups over one rank's share): N processes then draw the same
            index sequence as one, and accelerate deals its micro-batches round robin, so step
            k trains on the pairs one process trains on at step k."""
            from transformers.trainer_pt_utils import LengthGroupedSampler

            sampler = super()._get_train_sampler(train_dataset)
            if isinstance(sampler, LengthGroupedSampler):
                sampler.batch_size *= self.args.world_size
            return sampler

    return MeteredDPOTrainer


def _make_callback(
    trainer_ref: dict[str, Any], every_s: float, target: CheckpointTarget | None
) -> Any:
    from peft import get_peft_model_state_dict
    from transformers import TrainerCallback

    class GuardAndBestCallback(TrainerCallback):  # type: ignore[misc, valid-type]
        """Fails on a non-finite loss/grad norm; keeps the adapter weights of the best held-out
        reward accuracy (ties keep the later, more trained adapter); asks for a checkpoint when
        one is due and keeps its own state in it."""

        def __init__(self) -> None:
            self.best_accuracy: float | None = None
            self.best_step: int | None = None
            self.best_state: dict[str, Any] | None = None
            self.step_seconds: list[float] = []
            self._step_started = 0.0
            self.bar: Any = None
            self.clock = CheckpointClock(every_s)

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.bar = steps_bar(state, "train (DPO)")
            self.clock.saved()

        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if self.bar is not None:
                self.bar.close()

        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self._step_started = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.step_seconds.append(time.perf_counter() - self._step_started)
            if self.bar is not None:
                self.bar.update(1)
            if state.global_step < state.max_steps and self._checkpoint_due():
                control.should_save = True

        def _checkpoint_due(self) -> bool:
            """Due on every rank or on none: the ranks save together (a rank's clock alone
            could differ from another's by a step)."""
            import torch

            due = self.clock.due()
            trainer = trainer_ref["trainer"]
            if trainer.args.world_size == 1:
                return due
            flag = torch.tensor([1 if due else 0], device=trainer.accelerator.device)
            return bool(trainer.accelerator.reduce(flag, reduction="sum").item() > 0)

        def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            """The trainer wrote checkpoint-<step>: add ours, then (rank 0) copy it to the store."""
            from safetensors.torch import save_file

            trainer = trainer_ref["trainer"]
            checkpoint_dir = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            meter = trainer.train_meter
            write_rank_state(
                checkpoint_dir,
                args.process_index,
                {
                    "best_accuracy": self.best_accuracy,
                    "best_step": self.best_step,
                    "step_seconds": self.step_seconds,
                    "meter": [meter.real_tokens, meter.padded_tokens, meter.batches],
                },
            )
            if state.is_world_process_zero and self.best_state is not None:
                save_file(
                    {name: t.contiguous() for name, t in self.best_state.items()},
                    str(checkpoint_dir / BEST_ADAPTER_NAME),
                )
            trainer.accelerator.wait_for_everyone()  # every rank's files are written
            if state.is_world_process_zero and target is not None:
                upload_checkpoint(target, checkpoint_dir, state.global_step)
                log.info("step %d: checkpoint kept at %s", state.global_step, target.prefix)
            self.clock.saved()

        def restore(self, checkpoint_dir: Path, rank: int) -> None:
            """Our part of a checkpoint: the best adapter so far, step times, padding counts."""
            from safetensors.torch import load_file

            saved = read_rank_state(checkpoint_dir, rank)
            self.best_accuracy, self.best_step = saved["best_accuracy"], saved["best_step"]
            self.step_seconds = list(saved["step_seconds"])
            meter = trainer_ref["trainer"].train_meter
            meter.real_tokens, meter.padded_tokens, meter.batches = saved["meter"]
            best_path = checkpoint_dir / BEST_ADAPTER_NAME
            self.best_state = load_file(str(best_path)) if best_path.is_file() else None

        def on_log(
            self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any
        ) -> None:
            for key in ("loss", "grad_norm", "eval_loss"):
                value = (logs or {}).get(key)
                if value is not None and not math.isfinite(float(value)):
                    raise TrainingDivergedError(
                        f"DPO {key} became {value} at step {state.global_step}",
                        hint="use train.precision=fp32, lower train.learning_rate, or check the pairs",
                    )
            step_logs = logs or {}
            if "loss" in step_logs and self.bar is not None:
                self.bar.set_postfix(
                    loss=f"{step_logs['loss']:.4f}",
                    acc=f"{step_logs.get('rewards/accuracies', float('nan')):.2f}",
                )

        def on_evaluate(
            self, args: Any, state: Any, control: Any, metrics: Any = None, **kwargs: Any
        ) -> None:
            accuracy = (metrics or {}).get(ACCURACY_KEY)
            if accuracy is None:
                return
            log.info("step %d: held-out reward accuracy %.3f", state.global_step, accuracy)
            if self.best_accuracy is None or accuracy >= self.best_accuracy:
                self.best_accuracy = float(accuracy)
                self.best_step = int(state.global_step)
                model = trainer_ref["trainer"].model
                self.best_state = {
                    name: tensor.detach().clone()
                    for name, tensor in get_peft_model_state_dict(model).items()
                }

    return GuardAndBestCallback()


def common_pair_policy(pairs: list[Pair], reference: Lineage | None = None) -> Lineage | None:
    """DPO's reference, which the adapter is trained on: the policy that wrote every pair, or
    `reference` where earlier rounds' pairs are replayed (train.earlier_rounds), whose writers
    may be earlier policies of the same base model but of no other."""
    lineages = {pair.policy.id: pair.policy for pair in pairs if pair.policy is not None}
    if reference is None:
        if len(lineages) > 1:
            raise BadInputError(
                f"the pairs come from {len(lineages)} different policies",
                hint="train on the pairs of one round (one collect stage)",
            )
        return next(iter(lineages.values()), None)
    for writer in lineages.values():
        if writer.base_sha256 != reference.base_sha256:
            raise BadInputError(
                f"replayed pairs were written by {writer.describe()}, another base model than "
                f"the one trained: {reference.describe()}",
                hint="replay only rounds of this run's base model (lower train.earlier_rounds)",
            )
    return reference


def write_provenance(adapter_dir: Path, policy: Lineage | None) -> None:
    """adapter/provenance.json: the policy the adapter was trained on (its DPO reference)."""
    write_json(
        adapter_dir / PROVENANCE_FILE,
        {"trained_on": policy.model_dump() if policy is not None else None},
    )


def read_provenance(adapter_dir: Path) -> Lineage | None:
    path = Path(adapter_dir) / PROVENANCE_FILE
    if not path.is_file():
        return None
    trained_on = json.loads(path.read_text()).get("trained_on")
    return Lineage.model_validate(trained_on) if trained_on else None


def load_pairs(pairs_path: Path) -> list[Pair]:
    path = Path(pairs_path)
    if path.is_dir():
        path = path / "pairs.jsonl"
    pairs = read_jsonl(path, Pair)
    if not pairs:
        raise BadInputError(
            f"{path} holds no preference pairs",
            hint="collect more trajectories or lower pairs.min_value_gap, then rerun `codeq pairs`",
        )
    return pairs


def _use_bf16(config: TrainConfig) -> bool:
    import torch

    if config.precision != "bf16":
        return False
    if torch.cuda.is_available():
        return bool(torch.cuda.is_bf16_supported())
    return True


def _history(
    log_history: list[dict[str, Any]],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    steps = [entry for entry in log_history if "loss" in entry]
    evals = [entry for entry in log_history if ACCURACY_KEY in entry]
    return steps, evals


def _check_finite_history(steps: list[dict[str, Any]]) -> None:
    keys = ("loss", "rewards/accuracies", "rewards/margins", "rewards/chosen", "rewards/rejected")
    for entry in steps:
        for key in keys:
            if key in entry and not math.isfinite(float(entry[key])):
                raise TrainingDivergedError(
                    f"DPO {key} is {entry[key]} at step {entry.get('step')}",
                    hint="use train.precision=fp32 or lower train.learning_rate",
                )


def _require_launched(config: TrainConfig) -> None:
    """A trainer for N processes is built in each of N launched processes (train_dpo launches
    them); built alone it would train on 1/N of each step's pairs."""
    if world_size() != config.processes:
        raise ConfigError(
            f"train.processes={config.processes} but this is one process of {world_size()}",
            hint="train through codeq.train.train_dpo, which launches the processes",
        )


def _training_device() -> int | None:
    """The GPU this process trains on (LOCAL_RANK: one per process), None on CPU. The model is
    loaded straight onto it: N processes never hold N copies in host memory, and each rank
    quantizes its NF4 base onto its own GPU (accelerate refuses a 4-bit model on another
    device than the rank's)."""
    import torch

    if not torch.cuda.is_available():
        return None
    torch.cuda.set_device(local_rank())
    return local_rank()


@dataclass
class PreparedTraining:
    """A DPO trainer ready to run, with what train_dpo reports about its inputs."""

    trainer: Any
    callback: Any
    tokenizer: Any
    source: str
    use_bf16: bool
    quantization: str
    n_pairs: int
    n_train: int
    n_held_out: int
    over_max_length: int


def build_trainer(
    pairs: list[Pair],
    out_dir: Path,
    config: CodeQConfig,
    checkpoints: CheckpointTarget | None = None,
) -> PreparedTraining:
    """Load the base model, drop over-long pairs, hold out a slice, and set up the trainer."""
    import torch
    from datasets import Dataset

    train_config = config.train
    _require_launched(train_config)
    source = resolve_model_source(config.policy.model, config.policy.cache_dir)
    tokenizer = load_tokenizer(source)
    train_examples, held_out, over_max_length = split_pairs(pairs, tokenizer, train_config)
    use_bf16 = _use_bf16(train_config)
    torch.manual_seed(train_config.seed)
    quantization = training_quantization(config.policy)
    model = load_training_model(
        source, torch.bfloat16 if use_bf16 else torch.float32, quantization, _training_device()
    )
    log.info(
        "%d train / %d held-out pairs (%d over max_length dropped); base %s%s; precision %s",
        len(train_examples),
        len(held_out),
        over_max_length,
        source,
        " in 4-bit NF4 (QLoRA, as it samples)" if quantization == "nf4" else "",
        "bf16 (fp32 log-probs)" if use_bf16 else "fp32",
    )
    trainer_ref: dict[str, Any] = {}
    callback = _make_callback(trainer_ref, train_config.checkpoint_every_s, checkpoints)
    trainer = _make_trainer_class()(
        model=model,
        args=dpo_arguments(train_config, out_dir, bool(held_out), use_bf16),
        train_dataset=Dataset.from_list(train_examples),
        eval_dataset=Dataset.from_list(held_out) if held_out else None,
        processing_class=tokenizer,
        peft_config=lora_config(train_config),
        callbacks=[callback],
    )
    trainer_ref["trainer"] = trainer
    return PreparedTraining(
        trainer=trainer,
        callback=callback,
        tokenizer=tokenizer,
        source=source,
        use_bf16=use_bf16,
        quantization=quantization,
        n_pairs=len(pairs),
        n_train=len(train_examples),
        n_held_out=len(held_out),
        over_max_length=over_max_length,
    )


def train_dpo(
    pairs_path: str | Path,
    out_dir: str | Path,
    config: CodeQConfig,
    checkpoints: CheckpointTarget | None = None,
    resume_from: Path | None = None,
    reference: Lineage | None = None,
) -> dict[str, Any]:
    """Train a LoRA adapter with DPO on pairs; write out_dir/adapter/ and out_dir/metrics.json.
    With train.processes > 1 in that many data-parallel processes (same files, same metrics).
    `checkpoints`: where checkpoints are copied as training goes; `resume_from`: a checkpoint
    folder (one of those copies) to continue from instead of step 0; `reference`: the policy
    trained on when the pairs come from several (common_pair_policy)."""
    require_tracking_client(config.train.report_to)
    out_dir = Path(out_dir)
    pairs = load_pairs(Path(pairs_path))
    common_pair_policy(pairs, reference)
    batch_plan(config.train)  # a batch the processes cannot share fails before they start
    if config.train.processes > 1:
        path = Path(pairs_path)
        return launch_ranks(
            path / "pairs.jsonl" if path.is_dir() else path,
            out_dir,
            config,
            checkpoints,
            resume_from,
            reference,
        )
    return train_in_this_process(pairs, out_dir, config, checkpoints, resume_from, reference)


def _sum_over_ranks(trainer: Any, meter: PaddingMeter) -> None:
    """Each rank metered its own batches: the meter then counts every rank's."""
    import torch

    counts = torch.tensor(
        [meter.real_tokens, meter.padded_tokens, meter.batches],
        dtype=torch.int64,
        device=trainer.accelerator.device,
    )
    total = trainer.accelerator.reduce(counts, reduction="sum")
    meter.real_tokens, meter.padded_tokens, meter.batches = (int(value) for value in total)


def train_in_this_process(
    pairs: list[Pair],
    out_dir: str | Path,
    config: CodeQConfig,
    checkpoints: CheckpointTarget | None = None,
    resume_from: Path | None = None,
    reference: Lineage | None = None,
) -> dict[str, Any]:
    """train_dpo in this process: the whole run, or one rank of N (only rank 0 writes files)."""
    from peft import set_peft_model_state_dict

    out_dir = Path(out_dir)
    policy = common_pair_policy(pairs, reference)
    prepared = build_trainer(pairs, out_dir, config, checkpoints)
    trainer, callback, tokenizer = prepared.trainer, prepared.callback, prepared.tokenizer
    resumed_step = checkpoint_step(resume_from) if resume_from is not None else None
    if resume_from is not None:
        callback.restore(resume_from, this_rank())
        log.info("resuming DPO at step %d from %s", resumed_step, resume_from)
    started = time.perf_counter()
    result = trainer.train(resume_from_checkpoint=str(resume_from) if resume_from else None)
    seconds = time.perf_counter() - started
    steps, evals = _history(trainer.state.log_history)
    final_eval: dict[str, Any] = {}
    if prepared.n_held_out:  # the last step's held-out accuracy (evaluated once more if needed)
        last_evaluated = evals[-1].get("step") if evals else None
        if last_evaluated == trainer.state.global_step:
            final_eval = evals[-1]
        else:
            final_eval = trainer.evaluate()
            steps, evals = _history(trainer.state.log_history)
    _check_finite_history(steps)
    if callback.best_state is not None and callback.best_step != trainer.state.global_step:
        set_peft_model_state_dict(trainer.model, callback.best_state)
    adapter_dir = out_dir / "adapter"
    writes = trainer.is_world_process_zero()  # DDP keeps the ranks' adapters equal
    if writes:
        trainer.model.save_pretrained(str(adapter_dir), safe_serialization=True)
        tokenizer.save_pretrained(str(adapter_dir))
        write_provenance(adapter_dir, policy)
        shutil.rmtree(out_dir / "checkpoints", ignore_errors=True)  # spent; frees the scratch

    meter = trainer.train_meter
    _sum_over_ranks(trainer, meter)
    plan = batch_plan(config.train)
    metrics = {
        "base_model": prepared.source,
        "trained_on": policy.model_dump() if policy is not None else None,
        "adapter": str(adapter_dir),
        "precision": "bf16" if prepared.use_bf16 else "fp32",
        "quantization": prepared.quantization,
        "log_probs_dtype": "float32",
        "pairs": {
            "total": prepared.n_pairs,
            "train": prepared.n_train,
            "held_out": prepared.n_held_out,
            "dropped_over_max_length": prepared.over_max_length,
        },
        "batch": {
            "processes": plan.processes,
            "per_device": plan.per_device_batch_size,
            "gradient_accumulation_steps": plan.gradient_accumulation_steps,
            "pairs_per_step": plan.pairs_per_step,
        },
        "global_steps": trainer.state.global_step,
        "resumed_from_step": resumed_step,
        "train_seconds": seconds,  # of this run (since the resumed step, if resumed)
        "step_seconds": callback.step_seconds,
        "train_loss": result.training_loss,
        "tokens": {
            "real": meter.real_tokens,
            "padded": meter.padded_tokens,
            "real_to_padded": meter.ratio,
            "real_tokens_per_second": meter.real_tokens / seconds if seconds else None,
        },
        "heldout_reward_accuracy": callback.best_accuracy,
        "heldout_reward_accuracy_final": final_eval.get(ACCURACY_KEY),
        "heldout_note": "best is the selection metric (optimistic); final is the last step's",
        # this process's reference forwards in evaluation: one per held-out batch, however
        # many evaluations (since the resumed step, if resumed)
        "heldout_reference_forwards": trainer.reference_forwards,
        "best_step": callback.best_step,
        "steps": steps,
        "eval": evals,
        "config": config.train.model_dump(),
    }
    if writes:
        write_json(out_dir / "metrics.json", metrics)
    return metrics
