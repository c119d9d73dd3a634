"""A committed single-pass test row of the learning curve, measured again: does it reproduce?

Reads `<results>/<name>-test.json` (the policy's lineage, its modes and its answers), evaluates
the same lineage's single-pass modes on the same test tasks with the curve's own code
(`Curve.test_modes`, the curve's options as given after `--`) --times times in one process, each
into its own evaluation folder (nothing reused, so every program is written again; the second
run follows the first on a warm engine), and writes each run's results under --into, never into
the curve's results. Per run and mode it prints the tasks solved and the completion tokens
beside the committed row's, and the tasks whose outcome differs. Exit status 1 when any run
differs from the committed row.

    OMP_WAIT_POLICY=ACTIVE python bench/retest_single_pass.py round-3 --into /work/retest \
        --times 2 -- --out /work/curve-defaults --results docs/results/learning-curve-defaults \
        --search-settings defaults --test-after-chain --test-skip 60 --rounds 20 ...

(the curve's command in docs/results.md, without --restore-only; its store must hold the
committed rounds: run that command with --restore-only first on a fresh machine).
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

SINGLE_PASS = ("zero_shot", "full_rewrite")


def differences(recorded: Any, measured: Any, mode: str) -> dict[str, Any]:
    """How `measured`'s `mode` compares with `recorded`'s on the same tasks: solved and
    completion tokens of each, and the tasks whose outcome differs (in the recorded order)."""
    before, after = recorded.modes[mode], measured.modes[mode]
    if set(before.per_task) != set(after.per_task):
        raise ValueError(f"{mode}: the two rows are not on the same tasks")
    return {
        "mode": mode,
        "solved": (before.solved, after.solved),
        "completion_tokens": (before.completion_tokens, after.completion_tokens),
        "differ": [
            task for task in before.per_task if before.per_task[task] != after.per_task[task]
        ],
    }


def identical(found: dict[str, Any]) -> bool:
    """Whether a run wrote what the committed row holds: no task differs, same tokens."""
    tokens_then, tokens_now = found["completion_tokens"]
    return not found["differ"] and tokens_then == tokens_now


def describe(run: str, found: dict[str, Any]) -> str:
    (solved_then, solved_now), (tokens_then, tokens_now) = (
        found["solved"],
        found["completion_tokens"],
    )
    verdict = "identical" if identical(found) else "DIFFERS"
    return (
        f"{run} {found['mode']}: solved {solved_now} (committed {solved_then}), completion "
        f"tokens {tokens_now} (committed {tokens_then}), {len(found['differ'])} tasks differ: "
        f"{verdict}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], epilog="after --: the curve's options"
    )
    parser.add_argument("name", help="the committed row: base, round-N or round-N-candidate")
    parser.add_argument("--into", type=Path, required=True, help="scratch folder for the runs")
    parser.add_argument("--times", type=int, default=1, help="runs in one process (default 1)")
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:split])
    curve_argv = argv[split + 1 :]

    import learning_curve

    from codeq.errors import MissingInputError
    from codeq.evaluate import EvalResults
    from codeq.logs import report_error

    curve_args = learning_curve.parse_args(curve_argv)
    committed = curve_args.results / f"{args.name}-test.json"
    if not committed.is_file():
        missing = MissingInputError(
            f"no committed row {committed}", hint="name a <name>-test.json of --results"
        )
        return report_error(missing, traceback=False)
    recorded = EvalResults.load(committed)
    modes = [mode for mode in SINGLE_PASS if mode in recorded.modes]
    chosen = learning_curve.read_json_or(curve_args.results / "learning-rate.json", {})
    curve_args.results = args.into  # the runs' rows go here, never beside the committed ones
    curve = learning_curve.Curve(curve_args)
    curve.run = chosen.get("chosen_run", curve.run)  # the run the curve went on with
    same = True
    for number in range(1, args.times + 1):
        run = f"retest-{args.name}-{number}"
        shutil.rmtree(curve_args.out / "eval" / run, ignore_errors=True)  # write, never reuse
        (args.into / f"{run}-test.json").unlink(missing_ok=True)
        curve.test_modes(run, recorded.policy, modes)
        measured = EvalResults.load(args.into / f"{run}-test.json")
        for mode in modes:
            found = differences(recorded, measured, mode)
            print(describe(run, found), flush=True)
            same = same and identical(found)
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
