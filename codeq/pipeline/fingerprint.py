"""What a stage's output depends on, recorded in its completion marker.

A stage's fingerprint is the part of the config that can change the stage's output (the keys in
STAGE_KEYS, the one place that says which keys a stage reads) and the checksums of its inputs
(the sha256 of each input stage's MANIFEST.json, which lists every file's sha256). A rerun whose
fingerprint matches the marker's skips the stage; a different one is refused with what changed,
unless forced (`codeq round --force`, CODEQ_FORCE=1 in a job, `-p force=true` on the cluster).

Left out on purpose: where things are stored (store.*, work_dir, policy.cache_dir), and knobs
that change only speed, memory or logging and never what a stage computes: policy.device,
batch_size, prefix_cache_tokens, cpu_threads; sandbox.backend, runsc_path, workers;
search.parallel_trees, search.deterministic; train.gradient_checkpointing,
checkpoint_every_s (a resumed train continues the same run), report_to;
verifier.gradient_checkpointing, checkpoint_every_s; evaluate.confidence (the report recomputes
intervals); promotion.patience (it decides whether a next round starts, not what a round
computes).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from codeq.config import CodeQConfig, is_neutral
from codeq.errors import BadInputError

# The keys of the generation the search and the evaluation run (policy.model names the base; the
# adapters promoted so far are an input: the previous round's promotion decision).
GENERATION_KEYS = [
    "tasks.seed",  # seeds the policy engine
    "policy.model",
    "policy.adapter",
    "policy.dtype",
    "policy.quantization",
    "policy.max_new_tokens",
    "policy.max_prompt_tokens",
    "policy.critique",
    "policy.critique_temperature",
    "policy.critique_max_new_tokens",
]
SEARCH_KEYS = [
    "search.mode",
    "search.rewrites_per_expansion",
    "search.temperature",
    "search.top_p",
    "search.rollouts",
    "search.max_depth",
    "search.exploration",
    "search.widening",
    "search.bon_samples",
    "search.mt_bon_samples",
    "search.mt_bon_turns",
    "search.prompt",
    "search.refine",
    "search.reward_tests",
    "search.stop_on_pass",
    "search.seed",
]
# Limits decide which programs pass (a slow fix times out), so they shape every reward.
SANDBOX_KEYS = [
    "sandbox.memory_mb",
    "sandbox.wall_timeout_s",
    "sandbox.cpu_time_s",
    "sandbox.max_output_bytes",
    "sandbox.max_file_bytes",
    "sandbox.max_processes",
]
TRAIN_KEYS = [
    "train.lora_r",
    "train.lora_alpha",
    "train.lora_dropout",
    "train.target_modules",
    "train.beta",
    "train.learning_rate",
    "train.per_device_batch_size",
    "train.gradient_accumulation_steps",
    "train.epochs",
    "train.max_steps",
    "train.earlier_rounds",
    "train.sft_weight",
    "train.max_length",
    "train.precision",
    "train.length_bucketing",
    "train.eval_fraction",
    "train.eval_steps",  # which steps are evaluated: the best of them is the adapter kept
    "train.seed",
    "policy.dtype",
    "policy.quantization",  # NF4 on CUDA trains QLoRA
]

# What the learned verifier's weights depend on (verifier.enabled and .fallback decide whether
# and where it is used, not what it learns).
VERIFIER_KEYS = [
    "verifier.lora_r",
    "verifier.lora_alpha",
    "verifier.lora_dropout",
    "verifier.target_modules",
    "verifier.learning_rate",
    "verifier.epochs",
    "verifier.max_steps",
    "verifier.batch_size",
    "verifier.gradient_accumulation_steps",
    "verifier.max_length",
    "verifier.max_programs_per_task",
    "verifier.earlier_rounds",
    "verifier.objective",
    "verifier.pairs_per_task",
    "verifier.eval_fraction",
    "verifier.seed",
    "policy.model",
    "policy.dtype",
]

# Stage -> the config keys its output depends on. "section.*" means every key of the section.
STAGE_KEYS: dict[str, list[str]] = {
    "prepare": ["tasks.*", *SANDBOX_KEYS],  # oracles run in the sandbox to build hidden tests
    "collect": [*GENERATION_KEYS, *SEARCH_KEYS, "search.max_tasks", *SANDBOX_KEYS],
    "verifier": [*VERIFIER_KEYS, *SANDBOX_KEYS],  # labels the sandbox finds, where needed
    "pairs": ["pairs.*", "verifier.fallback"],
    "train": TRAIN_KEYS,
    "evaluate": [
        *GENERATION_KEYS,
        *SEARCH_KEYS,
        *SANDBOX_KEYS,
        "evaluate.modes",
        "evaluate.rollout_ablation",
        "evaluate.max_tasks",
        "promotion.modes",
        "promotion.max_tasks",
        "promotion.samples",
        "promotion.guard_modes",
        "evaluate.tie_break",
        "verifier.enabled",  # the verifier's AUC on the validation rewrites
        "verifier.fallback",
    ],
    "promote": [
        "promotion.modes",
        "promotion.level",
        "promotion.samples",
        "promotion.guard_modes",
        "promotion.reach_guard",
        "promotion.force_rounds",
    ],
    "report": [],
}

FORCE_HINT = (
    "to recompute and replace the stage's output, rerun with --force (a job: CODEQ_FORCE=1; "
    "the cluster: argo submit ... -p force=true); to keep it, use a new run name (--run / "
    "store.run) or the config it was made with"
)


@dataclass(frozen=True)
class Fingerprint:
    """The config values and input checksums a stage's output depends on."""

    config: dict[str, Any]
    inputs: dict[str, str | None] = field(default_factory=dict)

    @property
    def sha256(self) -> str:
        body = json.dumps({"config": self.config, "inputs": self.inputs}, sort_keys=True)
        return hashlib.sha256(body.encode()).hexdigest()

    def to_json(self) -> dict[str, Any]:
        return {"sha256": self.sha256, "config": self.config, "inputs": self.inputs}


def stage_config(config: CodeQConfig, stage: str) -> dict[str, Any]:
    """{dotted key: value} of the keys STAGE_KEYS names for `stage`, as JSON values (a key of
    NEUTRAL_VALUES at its neutral value left out)."""
    dumped = config.model_dump(mode="json")
    values: dict[str, Any] = {}
    for pattern in STAGE_KEYS[stage]:
        section, _, key = pattern.partition(".")
        if key == "*":
            for name, value in dumped[section].items():
                values[f"{section}.{name}"] = value
        else:
            values[pattern] = dumped[section][key]
    return {key: value for key, value in sorted(values.items()) if not is_neutral(key, value)}


def stage_fingerprint(
    config: CodeQConfig,
    stage: str,
    inputs: dict[str, str | None] | None = None,
    overrides: dict[str, Any] | None = None,
) -> Fingerprint:
    """`overrides` replaces config values the stage was given another way (prepare's
    --source, collect's shard count)."""
    values = {**stage_config(config, stage), **(overrides or {})}
    return Fingerprint(
        config=dict(sorted(values.items())), inputs=dict(sorted((inputs or {}).items()))
    )


class StaleOutputError(BadInputError):
    """A stage's output exists but was made with another config or other inputs."""


def _short(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


def differences(recorded: dict[str, Any], current: Fingerprint) -> list[str]:
    """What changed between a marker's recorded fingerprint and the current one, readable:
    'search.rollouts 8 -> 4', 'input pairs changed'."""
    changes = []
    old_config = recorded.get("config") or {}
    for key in sorted(set(old_config) | set(current.config)):
        old, new = old_config.get(key, "(unset)"), current.config.get(key, "(unset)")
        if old != new:
            changes.append(f"{key} {_short(old)} -> {_short(new)}")
    old_inputs = recorded.get("inputs") or {}
    for name in sorted(set(old_inputs) | set(current.inputs)):
        old, new = old_inputs.get(name), current.inputs.get(name)
        if old != new:
            state = "is not complete now" if new is None else "changed"
            changes.append(f"input {name} {state}")
    return changes


def check_recorded(recorded: Any, current: Fingerprint, what: str) -> None:
    """Refuse an output made under another fingerprint (a marker from before fingerprints,
    which records none, is accepted as it always was)."""
    if not isinstance(recorded, dict) or recorded.get("sha256") == current.sha256:
        return
    changes = differences(recorded, current) or ["the fingerprint's format"]
    raise StaleOutputError(
        f"{what} was made with another config or other inputs: {'; '.join(changes)}",
        hint=FORCE_HINT,
    )
