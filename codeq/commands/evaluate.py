from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, get_args

import typer

from codeq.commands.common import (
    config_with,
    key_option,
    model_option,
    out_dir,
    out_option,
    preset_value,
)
from codeq.config import CodeQConfig, EvalMode

if TYPE_CHECKING:
    from codeq.verifier import VerifierTieBreak


def command(
    tasks: Path = typer.Argument(
        ...,
        help="test.jsonl or validation.jsonl (or the tasks folder: its test.jsonl).",
        metavar="TASKS",
    ),
    out: Path | None = out_option("eval", "results.json"),
    adapter: Path | None = key_option(
        "policy.adapter",
        "--adapter",
        help="LoRA adapter to evaluate on top of the base model.",
        metavar="DIR",
    ),
    model: str | None = model_option(),
    modes: str | None = key_option(
        "evaluate.modes",
        "--modes",
        help=f"Comma-separated evaluation modes, of {','.join(get_args(EvalMode))}.",
        metavar="MODES",
    ),
    max_tasks: int | None = key_option(
        "evaluate.max_tasks",
        "--max-tasks",
        help="Evaluate at most N test tasks.",
        metavar="N",
        min=1,
    ),
    rollouts: int | None = key_option(
        "search.rollouts",
        "--rollouts",
        help="MCTS rollouts per task of the primary mcts figure.",
        metavar="N",
        min=1,
    ),
    verifier: Path | None = typer.Option(
        None,
        "--verifier",
        help="A learned verifier's folder (its LoRA beside VERIFIER.json, as a round's "
        "verifier stage writes it, or as bench/verifier_auc.py --keep keeps it) that chooses among answers passing as many visible tests "
        "when evaluate.tie_break is 'verifier'; refused when it was trained on another base "
        "model than --model.",
        metavar="DIR",
        show_default="none: where evaluate.tie_break asks for one, verifier.fallback = "
        f"{preset_value('verifier.fallback')} decides",
        file_okay=False,
    ),
) -> None:
    """Score every mode on the same held-out tasks with hidden tests; writes OUT/results.json."""
    from codeq.evaluate import evaluate
    from codeq.evaluate.results import Split

    config = config_with(
        {
            "policy": {"model": model},
            "search": {"rollouts": rollouts},
            "evaluate": {
                "modes": [m.strip() for m in modes.split(",") if m.strip()] if modes else None,
                "max_tasks": max_tasks,
            },
        }
    )
    folder = out_dir(out, config, "eval")
    split: Split = "validation" if tasks.name.startswith("validation") else "test"
    tie_break = answer_tie_break(config, verifier, folder / "kept-verifier")
    results = evaluate(tasks, folder, config, split=split, adapter=adapter, tie_break=tie_break)
    summary = {
        mode: stats.model_dump(include={"n", "solved", "solve_rate", "ci_low", "ci_high"})
        for mode, stats in results.modes.items()
    }
    chose = f"verifier {verifier} ({tie_break.verifier.id})" if tie_break else "self-critique"
    typer.echo(
        json.dumps({"out": str(folder / "results.json"), "tie_break": chose, "modes": summary})
    )


def answer_tie_break(
    config: CodeQConfig, verifier: Path | None, scratch: Path
) -> VerifierTieBreak | None:
    """The verifier in `verifier` (a round's, or one kept in git, unpacked into `scratch`)
    where evaluate.tie_break asks for one (its base model checked against --model's), else
    None: the self-critique chooses, where the config allows it."""
    from codeq.errors import BadInputError
    from codeq.pipeline.verifier import critique_stands_in
    from codeq.train.lineage import base_lineage
    from codeq.verifier import Verifier

    if config.evaluate.tie_break != "verifier":
        if verifier is not None:
            raise BadInputError(
                f"--verifier {verifier} is given, but evaluate.tie_break is "
                f"{config.evaluate.tie_break!r}, so no verifier would choose an answer",
                hint="set evaluate.tie_break=verifier (CODEQ_EVALUATE__TIE_BREAK=verifier), "
                "or leave out --verifier",
            )
        return None
    if verifier is None:
        critique_stands_in(
            config,
            "evaluate.tie_break",
            "no --verifier was given",
            whose="this evaluation",
            wanted=lambda: base_lineage(config.policy),
            hint="pass --verifier DIR (a round's verifier/ folder trained on this base model), "
            "or set verifier.fallback=critique to let the self-critique choose",
        )
        return None
    return Verifier.load_kept(verifier, config, base_lineage(config.policy), scratch).tie_break()
