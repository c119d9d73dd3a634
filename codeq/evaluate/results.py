"""The evaluation's results as typed records: what `evaluate` writes to results.json and what
promotion and the report read back (one shape, parsed in one place)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from codeq.errors import CorruptInputError, MissingInputError
from codeq.schemas import Lineage

Split = Literal["validation", "test"]
SCORED_ON = "visible+hidden"


def primary_mode(modes: Sequence[str]) -> str:
    """The mode an evaluation is judged by: MCTS when it ran, else the first mode."""
    return "mcts" if "mcts" in modes else modes[0]


class Rate(BaseModel):
    """A solve rate with its Wilson interval."""

    model_config = ConfigDict(extra="forbid")

    n: int
    solved: int
    solve_rate: float
    ci_low: float
    ci_high: float


class SampledPasses(BaseModel):
    """k answers sampled per task beside a single-answer mode's greedy one, each scored on all
    the task's tests: what promotion's paired test on pass counts reads (promotion.samples)."""

    model_config = ConfigDict(extra="forbid")

    samples: int = Field(description="k: answers sampled per task.")
    temperature: float
    top_p: float
    per_task: dict[str, int] = Field(description="task_id -> sampled answers that passed.")
    pass_rate: float = Field(description="Passing sampled answers over all sampled answers.")


class Selection(BaseModel):
    """How a whole search chose its one answer among the rewrites it wrote, against an oracle
    that knew the hidden tests: the tasks it could have solved and the ones its choice lost."""

    model_config = ConfigDict(extra="forbid")

    visible_passing: int = Field(
        description="Tasks where some rewrite passes every visible test (the search's reward)."
    )
    solvable: list[str] = Field(
        description="Tasks where some rewrite passes every test, visible and hidden: an "
        "oracle's choice would solve them."
    )
    lost: list[str] = Field(
        description="Solvable tasks whose returned program fails a test: lost by the choice "
        "among the rewrites (visible tests, then the tie-break), not by the search."
    )


class ModeResult(Rate):
    """One mode on every task: the returned program of each task, scored on all its tests."""

    per_task: dict[str, bool] = Field(description="task_id -> the returned program passed.")
    by_level: dict[str, Rate] = Field(default_factory=dict)
    by_category: dict[str, Rate] = Field(default_factory=dict)
    by_subtype: dict[str, Rate] = Field(default_factory=dict)
    programs: float = Field(0.0, description="Mean programs the policy wrote per task.")
    completion_tokens: int | None = Field(
        None, description="Tokens generated, critiques included (whole searches only)."
    )
    prompt_tokens: int | None = None
    seconds: float | None = Field(None, description="Wall time of the search (whole searches).")
    rollouts: int | None = Field(
        None, description="MCTS: the rollout budget; multi-turn best-of-N: the turns."
    )
    samples: int | None = Field(None, description="Best-of-N: N; multi-turn best-of-N: N per turn.")
    sampled: SampledPasses | None = Field(
        None, description="Single-answer modes on validation: k sampled answers per task too."
    )
    selection: Selection | None = Field(
        None, description="Searches at their full budget: the answer's choice against an oracle's."
    )


class AnyNodeResult(Rate):
    label: str
    per_task: dict[str, bool]


class EvalResults(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str
    adapter: str | None = None
    policy: Lineage | None = Field(None, description="The evaluated policy's lineage.")
    split: Split = "test"
    task_ids: list[str]
    primary_mode: str
    confidence: float
    seed: int = 0
    scored_on: str = Field(
        SCORED_ON, description="Each returned program is scored on visible and hidden tests."
    )
    search_reward_tests: str = "visible"
    modes: dict[str, ModeResult]
    mcts_rollout_ablation: dict[str, ModeResult] = Field(
        default_factory=dict, description="MCTS limited to b rollouts, by b."
    )
    bon_ablation: dict[str, ModeResult] = Field(
        default_factory=dict, description="Best-of-n from the first n samples, by n."
    )
    mt_bon_ablation: dict[str, ModeResult] = Field(
        default_factory=dict,
        description="Multi-turn best-of-N limited to its first t turns, by t (N x t programs "
        "at most; best-of-(N x t) is in bon_ablation when both modes ran).",
    )
    any_node_passed: AnyNodeResult | None = None

    def primary(self) -> ModeResult:
        return self.modes[self.primary_mode]

    def with_modes_of(self, later: EvalResults) -> EvalResults:
        """These results plus the modes `later` measured: the same policy evaluated again on the
        same tasks for modes these lack (search modes after single-pass ones, maybe in another
        session), so that nothing measured is measured twice. A mode both hold keeps `later`'s."""
        compared = ["policy", "split", "task_ids", "seed", "confidence"]
        if self.policy is None or later.policy is None:
            compared += ["model", "adapter"]
        differ = [name for name in compared if getattr(self, name) != getattr(later, name)]
        if differ:
            raise CorruptInputError(
                f"cannot add one evaluation's modes to another's: they differ in "
                f"{', '.join(differ)}",
                hint="evaluate every mode of the policy again on the same tasks",
            )
        merged = self.model_copy(deep=True)
        merged.modes.update(later.modes)
        merged.mcts_rollout_ablation.update(later.mcts_rollout_ablation)
        merged.bon_ablation.update(later.bon_ablation)
        merged.mt_bon_ablation.update(later.mt_bon_ablation)
        merged.any_node_passed = later.any_node_passed or self.any_node_passed
        merged.primary_mode = primary_mode(list(merged.modes))
        return merged

    def save(self, path: Path) -> None:
        from codeq.schemas import write_json

        write_json(path, self.model_dump(mode="json"))

    @classmethod
    def load(cls, path: str | Path) -> EvalResults:
        path = Path(path)
        if path.is_dir():
            path = path / "results.json"
        if not path.is_file():
            raise MissingInputError(
                f"{path} does not exist", hint="run the evaluate stage (or `codeq evaluate`) first"
            )
        try:
            results = cls.model_validate_json(path.read_text(encoding="utf-8"))
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(part) for part in first["loc"])
            raise CorruptInputError(
                f"{path} is not an evaluation result ({where}: {first['msg']})",
                hint="rerun the evaluate stage",
            ) from None
        if results.primary_mode not in results.modes:
            raise CorruptInputError(
                f"{path} has no results for its primary mode {results.primary_mode!r}",
                hint="rerun the evaluate stage",
            )
        return results
