"""The records that flow between stages: dataset -> tasks -> trajectories -> pairs -> report.

Every stage reads and writes these as JSON Lines (one record per line) through `read_jsonl` /
`write_jsonl`, so a malformed line is reported with its file and line number.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from codeq.errors import CorruptInputError, MissingInputError

Category = Literal["syntax", "reference", "logic", "multiple"]
Level = Literal["easy", "medium", "hard"]
TestSplit = Literal["visible", "hidden", "all"]


class Record(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TestCase(Record):
    """One call of the program under test. `call` is opaque to everything but the task harness
    (which runs inside the sandbox); `expected` never enters the sandbox."""

    call: dict[str, Any] = Field(description="Harness input: method/ops and JSON arguments.")
    expected: Any = Field(description="Oracle output, compared outside the sandbox.")
    check: dict[str, Any] = Field(
        default_factory=dict, description="Comparison options: unordered, float tolerance, ..."
    )
    origin: Literal["example", "generated"] = "example"


class Task(Record):
    task_id: str = Field(description="sha256 (hex, 16 chars) of the normalized buggy code.")
    slug: str
    level: Level
    category: Category
    subtype: str = Field(description="DebugBench bug subtype, e.g. 'missing colons', 'double'.")
    description: str
    examples: list[str] = Field(description="Statement examples, 'Input: ...\\nOutput: ...'.")
    constraints: str = ""
    buggy_code: str
    oracle_code: str
    bug_explanation: str | None = None
    entry: dict[str, Any] = Field(
        default_factory=dict,
        description="How the harness calls the solution: {'kind': 'function', 'method': ...} or "
        "{'kind': 'design', 'class': ...}, plus in-place/order flags.",
    )
    visible_tests: list[TestCase]
    hidden_tests: list[TestCase]

    def tests(self, which: TestSplit) -> list[TestCase]:
        if which == "visible":
            return list(self.visible_tests)
        if which == "hidden":
            return list(self.hidden_tests)
        return list(self.visible_tests) + list(self.hidden_tests)


class TestOutcome(Record):
    passed: bool
    status: str = Field(description="ok | wrong_answer | error | timeout | not_run ...")
    detail: str | None = Field(None, description="Short diagnostic (exception, diff); no secrets.")


class Verdict(Record):
    """Result of running one program against a list of tests, decided outside the sandbox."""

    passed: bool = Field(description="True only if every test passed.")
    n_passed: int
    n_total: int
    status: str = Field(
        description="passed | failed | syntax_error | timeout | memory | crash | output_limit | "
        "sandbox_error"
    )
    backend: str = Field(description="Backend that ran it: gvisor | subprocess.")
    tests: list[TestOutcome] = Field(default_factory=list)
    seconds: float = 0.0

    @property
    def pass_fraction(self) -> float:
        return self.n_passed / self.n_total if self.n_total else 0.0


class ChatMessage(Record):
    role: Literal["system", "user", "assistant"]
    content: str


class AdapterLink(Record):
    """One promoted LoRA adapter merged into a policy, in the order of the chain."""

    round: int = Field(description="The round that trained (and promoted) it.")
    sha256: str = Field(description="sha256 of its adapter_model.safetensors.")
    source: str = Field(description="Store key prefix of the adapter folder.")


class Lineage(Record):
    """What a policy is: a base model and the adapters merged into it, in order. Every
    trajectory, pair, adapter and report records the lineage of the policy behind it."""

    base_model: str = Field(description="policy.model as configured (HF id, path, 'smollm2').")
    base_sha256: str = Field(description="Fingerprint of the base model's files.")
    adapters: list[AdapterLink] = Field(default_factory=list)

    @property
    def id(self) -> str:
        """Short content hash: equal lineages, equal ids (names merged-model folders)."""
        import hashlib

        return hashlib.sha256(self.model_dump_json().encode()).hexdigest()[:16]

    def extended(self, link: AdapterLink) -> Lineage:
        return Lineage(
            base_model=self.base_model,
            base_sha256=self.base_sha256,
            adapters=[*self.adapters, link],
        )

    def describe(self) -> str:
        base = f"{self.base_model} ({self.base_sha256[:12]})"
        if not self.adapters:
            return f"base {base}"
        chain = " + ".join(f"round {a.round} ({a.sha256[:12]})" for a in self.adapters)
        return f"base {base} + {chain}"


class Node(Record):
    """One program in a search tree. Node 0 is the buggy program (the root)."""

    id: int
    parent: int | None
    depth: int
    rollout: int = Field(0, description="Rollout (expansion) that created it; 0 for the root.")
    prompt: list[ChatMessage] = Field(
        default_factory=list,
        description="Exact chat prompt that produced this node (empty at root).",
    )
    completion: str = Field("", description="Raw model output that produced this node.")
    program: str
    verdict: Verdict | None = Field(None, description="Result on the reward tests.")
    visits: int = 0
    value_sum: float = 0.0
    q_mcts: float = Field(0.0, description="Mean backed-up reward (pass fraction) of this node.")
    q_ai: float | None = Field(None, description="Self-critique score in [0, 1].")
    critique: str | None = None
    valid: bool = Field(True, description="False when extraction failed (empty/unchanged program).")


def reward_of(verdict: Verdict | None) -> float:
    """The search reward: the pass fraction on the reward tests (0 for invalid rewrites)."""
    return verdict.pass_fraction if verdict is not None else 0.0


def tied_at_top(nodes: Sequence[Node]) -> list[Node]:
    """The nodes that pass the most reward tests (what a tie-break chooses among: the search's
    final answer, execution agreement, the learned verifier)."""
    if not nodes:
        return []
    top = max(reward_of(node.verdict) for node in nodes)
    return [node for node in nodes if reward_of(node.verdict) == top]


class Trajectory(Record):
    """One task's whole search: the input of the pairs stage and of evaluation."""

    task_id: str
    slug: str
    level: Level
    category: Category
    subtype: str
    mode: str = Field(description="mcts | bon | mt_bon | zero_shot | full_rewrite")
    reward_tests: TestSplit
    nodes: list[Node]
    solved: bool = Field(description="Some node passed every reward test.")
    first_pass_node: int | None = None
    final_node: int = Field(
        description="The one program the search returns (chosen without hidden tests)."
    )
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0
    model: str = ""
    policy: Lineage | None = Field(None, description="The policy that searched (None: unknown).")


class Pair(Record):
    task_id: str
    slug: str
    level: Level
    category: Category
    prompt: list[ChatMessage]
    chosen: str
    rejected: str
    q_chosen: float
    q_rejected: float
    policy: Lineage | None = Field(None, description="The policy that wrote both completions.")


RecordT = TypeVar("RecordT", bound=BaseModel)


def read_jsonl(path: str | Path, model: type[RecordT]) -> list[RecordT]:
    return list(iter_jsonl(path, model))


def iter_jsonl(path: str | Path, model: type[RecordT]) -> Iterator[RecordT]:
    path = Path(path)
    if not path.is_file():
        raise MissingInputError(
            f"{path} does not exist", hint="run the stage that produces it first"
        )
    with path.open(encoding="utf-8") as handle:
        for line_number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                yield model.model_validate_json(line)
            except ValidationError as exc:
                first = exc.errors()[0]
                where = ".".join(str(p) for p in first["loc"])
                raise CorruptInputError(
                    f"{path}:{line_number}: not a valid {model.__name__} record "
                    f"({where}: {first['msg']})".replace(" (: ", " ("),
                    hint="regenerate the file with the stage that produces it",
                ) from None


def write_jsonl(path: str | Path, records: Iterable[BaseModel], append: bool = False) -> int:
    """Write records, one per line; returns the count. Writes atomically unless appending."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if append:
        count = 0
        with path.open("a", encoding="utf-8") as handle:
            for record in records:
                handle.write(record.model_dump_json() + "\n")
                count += 1
            handle.flush()
        return count
    tmp = path.with_name(path.name + ".tmp")
    count = 0
    with tmp.open("w", encoding="utf-8") as handle:
        for record in records:
            handle.write(record.model_dump_json() + "\n")
            count += 1
    tmp.replace(path)
    return count


def read_kept(path: Path, sha256: str, record: Path, hint: str, key: str = "") -> bytes:
    """The content of a file kept for git beside its record (a round's round.json, a kept
    verifier's KEPT.json): xz-unpacked where its name ends in .xz, checked against the
    `sha256` the record holds; CorruptInputError naming the file and the record otherwise."""
    import hashlib
    import lzma

    listed = f"{record} for {key}" if key else str(record)
    if not path.is_file():
        raise CorruptInputError(f"{path} is missing (listed in {listed})", hint=hint)
    data = path.read_bytes()
    if path.name.endswith(".xz"):
        try:
            data = lzma.decompress(data)
        except lzma.LZMAError as exc:
            raise CorruptInputError(
                f"{path} is not a readable xz file ({exc})", hint=hint
            ) from None
    if hashlib.sha256(data).hexdigest() != sha256:
        raise CorruptInputError(f"{path} fails its sha256 (recorded in {listed})", hint=hint)
    return data


def write_json(path: str | Path, data: Any, indent: int = 2) -> None:
    """Atomic pretty JSON write (reports, stats, metrics)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(
        json.dumps(data, indent=indent, sort_keys=False, default=str) + "\n", encoding="utf-8"
    )
    tmp.replace(path)
