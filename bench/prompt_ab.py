"""Single-pass repair prompts compared on the same validation tasks: how often the model returns
the buggy program unchanged, returns nothing, runs out of tokens, and solves the task.

Each variant is the first-turn chat of a repair (what `full_rewrite` asks and what the search asks
at its root), decoded greedily by the real engine, the returned program scored on every test
(visible + hidden) in the sandbox, as `codeq evaluate` scores it. The variants are paired on the
same tasks; the table gives each one's solve rate with its 95% Wilson interval and, against the
first variant, tasks gained and lost with the exact one-sided McNemar p. Decisions about prompts
are taken on the validation split only.

    python bench/prompt_ab.py --tasks codeq-runs/curve/work/tasks-test/validation.jsonl \
        --model ~/.cache/codeq/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf --max-tasks 40 \
        --json ab.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from codeq.config import CodeQConfig  # noqa: E402
from codeq.policy import prompts  # noqa: E402
from codeq.policy.requests import GenerationRequest  # noqa: E402
from codeq.promotion import one_sided_mcnemar  # noqa: E402
from codeq.schemas import ChatMessage, Task, read_jsonl  # noqa: E402

# A variant that lost on validation (docs/results.md), kept verbatim so the comparison reruns:
# the detailed prompt asking for a one- or two-sentence diagnosis before the program.
EXPLAIN_FIRST_SYSTEM = (
    "You are an expert Python programmer who fixes bugs. Read the problem and the buggy program "
    "and find every bug. First say in one or two plain sentences, without code, what is wrong; "
    "then give the complete corrected program in one ```python code block."
)
EXPLAIN_FIRST_INSTRUCTION = (
    "Fix the bugs in this program: first name each bug in a plain sentence, then reply with the "
    "full corrected program in a single ```python code block. Keep the class and method "
    "signatures."
)


def asking_for_a_diagnosis(messages: list[ChatMessage]) -> list[ChatMessage]:
    """The detailed chat with the explain-first system prompt and instruction in its turns (the
    model's own answers are left as they are)."""
    swapped = []
    for message in messages:
        if message.role == "system":
            message = ChatMessage(role="system", content=EXPLAIN_FIRST_SYSTEM)
        elif message.role == "user":
            content = message.content.replace(prompts.FIX_INSTRUCTION, EXPLAIN_FIRST_INSTRUCTION)
            message = ChatMessage(role="user", content=content)
        swapped.append(message)
    return swapped


def explain_first(task: Task) -> list[ChatMessage]:
    return asking_for_a_diagnosis(prompts.agent_messages(task))


def explain_first_refine(
    task: Task, answer: str, failures: list[prompts.FailedTest]
) -> list[ChatMessage]:
    return asking_for_a_diagnosis(prompts.refine_messages(task, answer, failures, "detailed"))


def styled_refine(style: str) -> Callable[[Task, str, list[prompts.FailedTest]], list[ChatMessage]]:
    def refine(task: Task, answer: str, failures: list[prompts.FailedTest]) -> list[ChatMessage]:
        return prompts.refine_messages(task, answer, failures, style)

    return refine


def one_turn_refine(
    task: Task, answer: str, failures: list[prompts.FailedTest]
) -> list[ChatMessage]:
    """`search.refine: one_turn` under the plain first turn: the failing program as the code to
    fix, with its failing tests, in one user turn."""
    return prompts.one_turn_refine_messages(
        task, prompts.extract_program(answer), failures, "plain"
    )


VARIANTS: dict[str, Callable[[Task], list[ChatMessage]]] = {
    "detailed": prompts.agent_messages,
    "plain": prompts.plain_messages,
    # the plain first turn again, refined in one turn
    "plain_one_turn": prompts.plain_messages,
    "explain_first": explain_first,
}
# A variant whose first turn is another's reuses that one's answers when both run: greedy
# decoding in bf16 is not bit-repeatable across batches, so decoding it again would give the two
# refinements different parents (9 against 10 solved of 40 in docs/results.md) and cost a pass.
SAME_FIRST_TURN = {"plain_one_turn": "plain"}
REFINE_VARIANTS: dict[str, Callable[[Task, str, list[prompts.FailedTest]], list[ChatMessage]]] = {
    "detailed": styled_refine("detailed"),
    "plain": styled_refine("plain"),
    "plain_one_turn": one_turn_refine,
    "explain_first": explain_first_refine,
}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=Path, required=True, help="validation tasks (.jsonl)")
    parser.add_argument("--model", required=True, help="policy.model (a .gguf, folder or id)")
    parser.add_argument("--max-tasks", type=int, default=40, help="the first N tasks of the file")
    parser.add_argument("--max-new-tokens", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument(
        "--variants", nargs="+", default=["detailed", "plain"], choices=sorted(VARIANTS)
    )
    parser.add_argument(
        "--refine-samples",
        type=int,
        default=2,
        help="then, for each answer that fails its visible tests, this many refinements at the "
        "search's temperature with the variant's feedback prompt (0: skip)",
    )
    parser.add_argument("--temperature", type=float, default=0.8, help="of the refinements")
    parser.add_argument("--json", type=Path, help="write the per-task outcomes and the table")
    return parser.parse_args()


def run_variant(
    name: str,
    tasks: list[Task],
    engine: Any,
    sandbox: Any,
    args: argparse.Namespace,
    earlier: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """One variant's greedy first turn, scored, then its refinements; the first turn comes from
    `earlier` (runs by variant name) when SAME_FIRST_TURN names one that already ran."""
    shared = (earlier or {}).get(SAME_FIRST_TURN.get(name, ""))
    if shared is not None:
        first = {key: shared[key] for key in ("seconds", "tasks", "texts", "programs")}
        run = {"variant": name, **first, "first_turn_of": shared["variant"]}
    else:
        run = {"variant": name, **first_turn(name, tasks, engine, sandbox, args)}
    if args.refine_samples and name in REFINE_VARIANTS:
        run["refine"] = refine_variant(
            name, tasks, run["texts"], run["programs"], engine, sandbox, args
        )
    return run


def first_turn(
    name: str, tasks: list[Task], engine: Any, sandbox: Any, args: argparse.Namespace
) -> dict[str, Any]:
    from codeq.tasks import score_programs

    started = time.monotonic()
    requests = [
        GenerationRequest(
            messages=VARIANTS[name](task),
            n=1,
            temperature=0.0,
            max_new_tokens=args.max_new_tokens,
        )
        for task in tasks
    ]
    results = engine.generate(requests)
    texts = [result.texts[0] for result in results]
    programs = [prompts.extract_program(text) for text in texts]
    scored = score_programs(list(zip(tasks, programs, strict=True)), "all", sandbox)
    rows = []
    for task, program, verdict, result in zip(tasks, programs, scored, results, strict=True):
        tokens = result.completion_tokens[0] if result.completion_tokens else None
        rows.append(
            {
                "task_id": task.task_id,
                "solved": bool(verdict.passed and program),
                "copied": prompts.same_program(program, task.buggy_code),
                "empty": not program.strip(),
                "hit_token_limit": tokens is not None and tokens >= args.max_new_tokens,
                "tokens": tokens,
            }
        )
    seconds = round(time.monotonic() - started, 1)
    return {"seconds": seconds, "tasks": rows, "texts": texts, "programs": programs}


def refine_variant(
    name: str,
    tasks: list[Task],
    texts: list[str],
    programs: list[str],
    engine: Any,
    sandbox: Any,
    args: argparse.Namespace,
) -> dict[str, Any]:
    """One level of the search's refinement: answers that fail their visible tests (and are
    neither empty nor the buggy program) get feedback from those tests and are rewritten."""
    from codeq.tasks import score_programs

    started = time.monotonic()
    candidates = [
        (task, text, program)
        for task, text, program in zip(tasks, texts, programs, strict=True)
        if program.strip() and not prompts.same_program(program, task.buggy_code)
    ]
    visible = score_programs(
        [(task, program) for task, _, program in candidates], "visible", sandbox
    )
    failing = [
        (task, text, program, verdict)
        for (task, text, program), verdict in zip(candidates, visible, strict=True)
        if not verdict.passed
    ]
    requests = [
        GenerationRequest(
            messages=REFINE_VARIANTS[name](
                task, text, prompts.visible_failures(task, verdict.tests)
            ),
            n=args.refine_samples,
            temperature=args.temperature,
            max_new_tokens=args.max_new_tokens,
            seed=index,
        )
        for index, (task, text, _, verdict) in enumerate(failing)
    ]
    results = engine.generate(requests)
    items, copies, empties = [], 0, 0
    for (task, _, parent, _), result in zip(failing, results, strict=True):
        for text in result.texts:
            program = prompts.extract_program(text)
            copies += prompts.same_program(program, parent) or prompts.same_program(
                program, task.buggy_code
            )
            empties += not program.strip()
            items.append((task, program))
    verdicts = score_programs(items, "all", sandbox) if items else []
    rescued = {task.task_id for (task, _), v in zip(items, verdicts, strict=True) if v.passed}
    return {
        "parents": len(failing),
        "rewrites": len(items),
        "copies": copies,
        "empty": empties,
        "solved_rewrites": sum(v.passed for v in verdicts),
        "tasks_rescued": sorted(rescued),
        "seconds": round(time.monotonic() - started, 1),
    }


def summary(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    from codeq.evaluate.stats import wilson_interval

    baseline = {row["task_id"]: row["solved"] for row in runs[0]["tasks"]}
    table = []
    for run in runs:
        rows = run["tasks"]
        n = len(rows)
        solved = sum(row["solved"] for row in rows)
        low, high = wilson_interval(solved, n)
        gained = sum(row["solved"] and not baseline[row["task_id"]] for row in rows)
        lost = sum(baseline[row["task_id"]] and not row["solved"] for row in rows)
        table.append(
            {
                "variant": run["variant"],
                "tasks": n,
                "solved": solved,
                "ci95": [round(low, 3), round(high, 3)],
                "copied": sum(row["copied"] for row in rows),
                "empty": sum(row["empty"] for row in rows),
                "hit_token_limit": sum(row["hit_token_limit"] for row in rows),
                "gained_vs_first": gained,
                "lost_vs_first": lost,
                "p_one_sided": round(one_sided_mcnemar(gained, lost), 4),
                "seconds": run["seconds"],
            }
        )
    return table


def print_table(table: list[dict[str, Any]]) -> None:
    print(
        "| variant | solved | 95% CI | copied buggy | empty | hit token limit | +/- vs first (p) |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for row in table:
        low, high = row["ci95"]
        print(
            f"| {row['variant']} | {row['solved']}/{row['tasks']} | {low:.0%}-{high:.0%} | "
            f"{row['copied']} | {row['empty']} | {row['hit_token_limit']} | "
            f"+{row['gained_vs_first']}/-{row['lost_vs_first']} (p={row['p_one_sided']}) |"
        )


def main() -> None:
    args = parse_args()
    from codeq.policy import PolicyEngine
    from codeq.sandbox import Sandbox

    config = CodeQConfig.model_validate(
        {"policy": {"model": args.model, "batch_size": args.batch_size}}
    )
    tasks = read_jsonl(args.tasks, Task)[: args.max_tasks]
    engine = PolicyEngine.load(config.policy, seed=0)
    runs: dict[str, dict[str, Any]] = {}
    with Sandbox(config.sandbox) as sandbox:
        for name in args.variants:
            runs[name] = run_variant(name, tasks, engine, sandbox, args, earlier=runs)
            print(f"{name}: {runs[name]['seconds']} s", file=sys.stderr, flush=True)
    report(list(runs.values()), args)


def report(runs: list[dict[str, Any]], args: argparse.Namespace) -> None:
    table = summary(runs)
    print_table(table)
    for run in runs:
        if "refine" in run:
            print(f"refine {run['variant']}: {json.dumps(run['refine'])}")
    if args.json:
        settings = vars(args) | {"tasks": str(args.tasks), "json": str(args.json)}
        kept = [{k: v for k, v in run.items() if k not in ("texts", "programs")} for run in runs]
        args.json.write_text(json.dumps({"args": settings, "table": table, "runs": kept}, indent=1))


if __name__ == "__main__":
    main()
