"""A trained verifier: its record (VERIFIER.json: lineage, what it learned from, its held-out
AUC), loading it onto its base model, scoring (task, program) pairs, and its tie-break."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from codeq.config import CodeQConfig
from codeq.errors import CorruptInputError, MissingInputError, VerifierLineageError
from codeq.schemas import Lineage, Node, Task, read_kept, tied_at_top
from codeq.verifier.data import encode

log = logging.getLogger(__name__)

VERIFIER_FILE = "VERIFIER.json"


class VerifierInfo(BaseModel):
    """What a verifier is: the base model its LoRA and score head sit on, and what it learned
    from. Written next to the adapter as VERIFIER.json."""

    model_config = ConfigDict(extra="forbid")

    base: Lineage = Field(description="The base model (no adapters): the verifier's lineage.")
    adapter_sha256: str = Field(description="sha256 of its adapter_model.safetensors.")
    written_by: Lineage | None = Field(None, description="The policy that wrote the programs.")
    round: int | None = Field(None, description="The round it was trained in.")
    rounds: list[int] = Field(
        default_factory=list,
        description="The rounds whose collected programs it learned from (verifier.earlier_rounds).",
    )
    writers: list[Lineage] = Field(
        default_factory=list,
        description="Every policy that wrote programs it learned from (one per sampling policy).",
    )
    programs: dict[str, int] = Field(
        default_factory=dict, description="train / held_out / passing / failing counts."
    )
    heldout_auc: float | None = Field(None, description="AUC on held-out train problems.")
    objective: Literal["pointwise", "pairwise"] = Field(
        "pointwise", description="How it was trained (verifier.objective)."
    )
    max_length: int = Field(description="Tokens it reads of one (task, program).")

    @property
    def id(self) -> str:
        return self.adapter_sha256[:12]

    def describe(self) -> str:
        return f"verifier {self.id} on {self.base.describe()}"


def read_info(folder: Path) -> VerifierInfo:
    path = Path(folder) / VERIFIER_FILE
    if not path.is_file():
        raise MissingInputError(
            f"{folder} holds no {VERIFIER_FILE}, so it is not a verifier folder",
            hint="point at the verifier/ folder the verifier stage writes",
        )
    try:
        return VerifierInfo.model_validate_json(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise CorruptInputError(
            f"{path} is not a verifier record ({type(exc).__name__})",
            hint="rerun the verifier stage of that round",
        ) from None


KEPT_FILE = "KEPT.json"  # beside a verifier/ folder kept for git: each file's sha256


def unpacked_verifier(folder: Path, scratch: Path) -> Path:
    """`folder` itself when it holds the verifier as the verifier stage writes it; for a
    folder kept for git (KEPT.json in it or its parent), its verifier/ files unpacked into
    `scratch`, each checked against the sha256 KEPT.json records (CorruptInputError naming the
    file that fails)."""
    import json

    record = next(
        (path for path in (folder / KEPT_FILE, folder.parent / KEPT_FILE) if path.is_file()), None
    )
    if record is None:
        return folder
    hint = "restore the kept verifier from git (git checkout -- its folder)"
    for name, entry in json.loads(record.read_text(encoding="utf-8"))["files"].items():
        if name.startswith("verifier/"):
            data = read_kept(record.parent / entry["file"], entry["sha256"], record, hint)
            target = scratch / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
    return scratch / "verifier"


def check_lineage(info: VerifierInfo, policy: Lineage, where: str) -> None:
    """Refuse a verifier whose base model is not the policy's: its LoRA and score head fit
    only the weights they were trained on."""
    if info.base.base_sha256 != policy.base_sha256:
        raise VerifierLineageError(
            f"the verifier at {where} was trained on {info.base.describe()}, but the policy it "
            f"would judge builds on {Lineage(base_model=policy.base_model, base_sha256=policy.base_sha256).describe()}",
            hint="train a verifier on this run's base model (rerun the round's verifier stage), "
            "or use the self-critique (pairs.q_ai=critique, evaluate.tie_break=critique)",
        )


def verifier_device(config: CodeQConfig) -> tuple[str, Any]:
    """Where the verifier runs and its weights' dtype: CUDA in bf16 (where supported) if the
    policy runs on CUDA; else the CPU in float32, or bf16 when policy.dtype asks for it."""
    import torch

    from codeq.policy.engine import resolve_device

    device = resolve_device(config.policy)
    if device == "cuda":
        return device, torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float32
    return device, torch.bfloat16 if config.policy.dtype == "bfloat16" else torch.float32


def load_classifier(source: str, dtype: Any, pad_token_id: int) -> Any:
    """The base model with a one-logit score head (random until trained), read as a binary
    classifier: its loss is binary cross-entropy on the logit."""
    from transformers import AutoModelForSequenceClassification

    from codeq.policy.source import announce_load, load_error

    announce_load(source, source, "verifier base")
    try:
        model = AutoModelForSequenceClassification.from_pretrained(
            source, num_labels=1, problem_type="multi_label_classification", dtype=dtype
        )
    except (OSError, ValueError) as exc:
        raise load_error(source, source, exc) from exc
    model.config.pad_token_id = pad_token_id
    return model


class Verifier:
    """A loaded verifier: `score` gives P(passes all tests) of (task, program) pairs."""

    def __init__(
        self, model: Any, tokenizer: Any, info: VerifierInfo, batch_size: int, device: str
    ) -> None:
        self.model, self.tokenizer, self.info = model, tokenizer, info
        self.batch_size, self.device = batch_size, device
        self.cache: dict[tuple[str, str], float] = {}  # (task id, program) -> score

    @classmethod
    def load(cls, folder: str | Path, config: CodeQConfig, policy: Lineage) -> Verifier:
        """The verifier in `folder` on config.policy.model's weights; refused
        (VerifierLineageError) unless it was trained on `policy`'s base."""
        from peft import PeftModel

        from codeq.policy.source import require_adapter_dir, resolve_model_source
        from codeq.train.model import load_tokenizer

        folder = require_adapter_dir(folder, hint="rerun the verifier stage of that round")
        info = read_info(folder)
        check_lineage(info, policy, str(folder))
        source = resolve_model_source(config.policy.model, config.policy.cache_dir)
        tokenizer = load_tokenizer(str(folder))
        device, dtype = verifier_device(config)
        base = load_classifier(source, dtype, tokenizer.pad_token_id)
        model = PeftModel.from_pretrained(base, str(folder)).to(device).eval()
        log.info("loaded %s", info.describe())
        return cls(model, tokenizer, info, config.verifier.batch_size, device)

    @classmethod
    def load_kept(
        cls, folder: str | Path, config: CodeQConfig, policy: Lineage, scratch: Path
    ) -> Verifier:
        """`load`, for a verifier folder as a round writes it or as git keeps it
        (bench/verifier_auc.py --keep: KEPT.json beside `verifier/`, files xz-packed where
        it paid), the kept one unpacked into `scratch` first, each file checked against its
        sha256."""
        return cls.load(unpacked_verifier(Path(folder), scratch), config, policy)

    @property
    def id(self) -> str:
        return self.info.id

    def score(self, items: Sequence[tuple[Task, str]]) -> list[float]:
        """P(passes all its task's tests) of each (task, program), in order; batched by length,
        each distinct pair scored once however often it is asked for."""
        keys = [(task.task_id, program) for task, program in items]
        missing = {
            key: item for key, item in zip(keys, items, strict=True) if key not in self.cache
        }
        if missing:
            encoded = [
                encode(self.tokenizer, t, p, self.info.max_length) for t, p in missing.values()
            ]
            scores = logits_to_scores(
                self.model, self.tokenizer, encoded, self.batch_size, self.device
            )
            self.cache.update(zip(missing, scores, strict=True))
        return [self.cache[key] for key in keys]

    def tie_break(self) -> VerifierTieBreak:
        return VerifierTieBreak(self)


def logits_to_scores(
    model: Any, tokenizer: Any, encoded: Sequence[list[int]], batch_size: int, device: str
) -> list[float]:
    """sigmoid(logit) of each token sequence; longest first, so batches pad little."""
    import torch

    order = sorted(range(len(encoded)), key=lambda i: -len(encoded[i]))
    scores = [0.0] * len(encoded)
    model.eval()
    with torch.no_grad():
        for start in range(0, len(order), batch_size):
            chunk = order[start : start + batch_size]
            batch = tokenizer.pad(
                {"input_ids": [encoded[i] for i in chunk]}, return_tensors="pt"
            ).to(device)
            logits = model(**batch).logits[:, 0].float()
            for index, value in zip(chunk, torch.sigmoid(logits).tolist(), strict=True):
                scores[index] = float(value)
    return scores


class VerifierTieBreak:
    """A `codeq.search.tree.TieBreak`: the verifier's scores where they decide, i.e. for the
    rewrites that pass the most reward tests when they hold two or more distinct programs (0
    elsewhere: the reward test fraction orders those first). The verifier scores each (task,
    program) once, however often the search or the evaluation's budgets ask again."""

    def __init__(self, verifier: Verifier) -> None:
        self.verifier = verifier
        self.decided = 0  # calls in which the verifier chose among distinct programs
        # names it in evaluation resume keys (codeq.evaluate.run reads a tie-break's qualname)
        self.__qualname__ = f"verifier-{verifier.id}"

    def __call__(self, task: Task, nodes: Sequence[Node]) -> list[float]:
        if not nodes:
            return []
        at_top = {id(node) for node in tied_at_top(nodes)}
        tied = {node.program for node in nodes if id(node) in at_top}
        if len(tied) < 2:
            return [0.0] * len(nodes)
        self.decided += 1
        programs = sorted(tied)
        scores = dict(
            zip(programs, self.verifier.score([(task, p) for p in programs]), strict=True)
        )
        return [scores[node.program] if id(node) in at_top else 0.0 for node in nodes]
