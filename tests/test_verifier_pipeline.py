"""The learned verifier in a round: the verifier stage trains it from the round's collect, the
pairs stage takes Q_ai from it (pairs.q_ai), evaluation breaks ties among answers with it
(evaluate.tie_break) and records its AUC on validation rewrites; a round that asks for a
verifier it lacks, or one trained on another base model, stops with one error line naming the
lineages, unless verifier.fallback lets the self-critique stand in."""

from __future__ import annotations

import json
import lzma
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest
from test_bench import load_bench
from test_verifier import EXPRESSIONS, make_task, variant

from codeq.config import StoreConfig, load_config
from codeq.errors import EXIT_BAD_INPUT, VerifierLineageError, VerifierMissingError
from codeq.pipeline.stages import STAGES, StageContext, pairs_stage, round_stages, verifier_stage
from codeq.pipeline.verifier import (
    evaluation_tie_break,
    pairs_q_ai,
    record_evaluation,
    required_verifier,
)
from codeq.policy import GenerationRequest, GenerationResult
from codeq.schemas import (
    ChatMessage,
    Lineage,
    Node,
    Pair,
    Task,
    Trajectory,
    Verdict,
    read_jsonl,
    write_jsonl,
)
from codeq.store import RoundLayout, open_store
from tests.preemption import preempted_after_checkpoint
from tests.scripted import CyclingAnswers

REPO = Path(__file__).resolve().parent.parent
LAYOUT = RoundLayout("default", 0)
TRAIN = [make_task(i) for i in range(8)]
VALIDATION = [make_task(i) for i in range(8, 11)]  # problems the verifier never learned from
VERIFIER = {
    "lora_r": 8,
    "lora_alpha": 16,
    "learning_rate": 5e-3,
    "epochs": 12,
    "batch_size": 8,
    "max_length": 192,
    "eval_fraction": 0.25,
    # what these tests were made for: a pointwise verifier of the round's own collect, and a
    # missing verifier that stops the stage asking for it
    "objective": "pointwise",
    "earlier_rounds": 0,
    "fallback": "error",
}


def base_of(model_dir: Path) -> Lineage:
    from codeq.config import PolicyConfig
    from codeq.train.lineage import base_lineage

    return base_lineage(PolicyConfig(model=str(model_dir)))


def rewrite(node_id: int, task: Task, program: str, passed: bool) -> Node:
    """A sibling rewrite, tested on all tests, its critique scoring it the wrong way round."""
    verdict = Verdict(
        passed=passed,
        n_passed=2 if passed else 0,
        n_total=2,
        status="passed" if passed else "failed",
        backend="subprocess",
    )
    return Node(
        id=node_id,
        parent=0,
        depth=1,
        prompt=[ChatMessage(role="user", content=f"fix {task.slug}")],
        completion=program,
        program=program,
        verdict=verdict,
        q_mcts=1.0 if passed else 0.0,
        q_ai=0.1 if passed else 0.9,
        valid=True,
    )


def collected(task: Task, policy: Lineage) -> Trajectory:
    programs = [(variant(e, i), ok) for i in range(3) for e, ok in EXPRESSIONS.items()]
    nodes = [Node(id=0, parent=None, depth=0, program=task.buggy_code)]
    nodes += [rewrite(i, task, program, ok) for i, (program, ok) in enumerate(programs, 1)]
    return Trajectory(
        task_id=task.task_id,
        slug=task.slug,
        level=task.level,
        category=task.category,
        subtype=task.subtype,
        mode="mcts",
        reward_tests="all",
        nodes=nodes,
        solved=True,
        final_node=1,
        policy=policy,
    )


def collected_store(root: Path, model_dir: Path):
    """A store whose round 0 has prepared tasks and one complete collect shard."""
    store = open_store(StoreConfig(uri=f"file://{root / 'store'}"))
    tasks = root / "tasks"
    write_jsonl(tasks / "train.jsonl", TRAIN)
    write_jsonl(tasks / "validation.jsonl", VALIDATION)
    write_jsonl(tasks / "test.jsonl", VALIDATION)
    store.put_dir(LAYOUT.stage("tasks"), tasks)
    store.mark_complete(LAYOUT.stage("tasks"), {})
    shard = root / "shard"
    policy = base_of(model_dir)
    write_jsonl(shard / "trajectories.jsonl", [collected(task, policy) for task in TRAIN])
    store.put_dir(LAYOUT.shard(0), shard)
    store.mark_complete(LAYOUT.shard(0), {"shard_index": 0, "shard_count": 1})
    return store


def context(store, scratch: Path, model_dir: Path, force: bool = False, round_number=0, **settings):
    verifier = {"enabled": True, **VERIFIER, **settings.pop("verifier", {})}
    overrides = {
        "store": {"uri": store.uri, "round": round_number},
        "policy": {"model": str(model_dir), "device": "cpu"},
        "sandbox": {"backend": "subprocess", "workers": 1},
        "verifier": verifier,
        **settings,
    }
    config = load_config(overrides=overrides)
    return StageContext(config=config, store=store, scratch=scratch, force=force)


@pytest.fixture(scope="module")
def trained_round(tiny_model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("verifier-round")
    store = collected_store(root, tiny_model_dir)
    result = verifier_stage(context(store, root / "scratch", tiny_model_dir))
    return store, root, result


def test_the_verifier_stage_learns_from_the_rounds_programs(trained_round, tiny_model_dir):
    store, root, result = trained_round
    assert result["trained"] and not result["skipped"], result
    assert result["programs"]["passing"] == 3 * len(TRAIN)
    assert result["programs"]["train"] + result["programs"]["held_out"] == 12 * len(TRAIN)
    assert result["heldout_auc"] is not None and result["heldout_auc"] >= 0.8
    assert result["scored_rewrites"] == 12 * len(TRAIN)  # Q_ai for pairs, no model needed there
    marker = store.marker(LAYOUT.stage("verifier"))
    assert marker["base"] == base_of(tiny_model_dir).id
    info = json.loads((root / "store" / LAYOUT.stage("verifier") / "VERIFIER.json").read_text())
    assert info["base"] == base_of(tiny_model_dir).model_dump(mode="json")
    assert info["written_by"] == base_of(tiny_model_dir).model_dump(mode="json")
    again = verifier_stage(context(store, root / "scratch", tiny_model_dir))
    assert again["skipped"]


def add_round(store, root: Path, number: int, tasks: list[Task], policy: Lineage) -> None:
    """Round `number` of the store's run: its prepared tasks and one complete collect shard."""
    layout = LAYOUT.of_round(number)
    folder = root / f"round-{number}"
    write_jsonl(folder / "tasks" / "train.jsonl", tasks)
    store.put_dir(layout.stage("tasks"), folder / "tasks")
    store.mark_complete(layout.stage("tasks"), {})
    write_jsonl(folder / "shard" / "trajectories.jsonl", [collected(t, policy) for t in tasks])
    store.put_dir(layout.shard(0), folder / "shard")
    store.mark_complete(layout.shard(0), {"shard_index": 0, "shard_count": 1})


def test_the_verifier_learns_from_the_runs_earlier_rounds_each_program_once(
    tmp_path, tiny_model_dir
):
    from codeq.schemas import AdapterLink

    store = collected_store(tmp_path, tiny_model_dir)  # round 0: 8 problems, 12 programs each
    promoted = base_of(tiny_model_dir).extended(
        AdapterLink(round=0, sha256="ab" * 32, source="runs/default/round-0/adapter")
    )
    # round 2, from another policy: 2 new problems, and one of round 0's written again
    add_round(store, tmp_path, 2, [make_task(20), make_task(21), TRAIN[0]], promoted)
    quick = {"verifier": {"max_steps": 1, "eval_fraction": 0.0}, "round_number": 2}
    alone = verifier_stage(context(store, tmp_path / "scratch", tiny_model_dir, **quick))
    assert alone["rounds"] == [2] and alone["programs"]["train"] == 3 * 12, alone
    quick["verifier"]["earlier_rounds"] = 2  # rounds 0 and 1; round 1 collected nothing
    result = verifier_stage(context(store, tmp_path / "scratch", tiny_model_dir, True, **quick))
    assert result["rounds"] == [0, 2], result
    assert result["programs"]["train"] == (8 + 2) * 12, result  # add-0's again once
    info = json.loads(
        (tmp_path / "store" / LAYOUT.of_round(2).stage("verifier") / "VERIFIER.json").read_text()
    )
    assert info["rounds"] == [0, 2] and info["round"] == 2
    assert [w["adapters"] for w in info["writers"]] == [[], [promoted.adapters[0].model_dump()]]
    assert info["written_by"] is None  # two policies wrote what it learned from
    marker = store.marker(LAYOUT.of_round(2).stage("verifier"))
    assert "round 0 collect shard 0" in marker["fingerprint"]["inputs"]


def chosen_programs(store, root: Path) -> list[str]:
    target = root / "check" / "pairs.jsonl"
    store.get_verified_file(LAYOUT.stage("pairs"), "pairs.jsonl", target)
    return [pair.chosen for pair in read_jsonl(target, Pair)]


def test_pairs_take_q_ai_from_the_verifier_in_place_of_the_critique(trained_round, tiny_model_dir):
    store, root, _ = trained_round
    blend = {"alpha": 0.0, "min_value_gap": 0.3, "max_pairs_per_task": 4}
    scratch = root / "scratch"
    by_critique = {**blend, "q_ai": "critique"}
    by_critique = pairs_stage(context(store, scratch, tiny_model_dir, pairs=by_critique))
    assert by_critique["pairs"] > 0
    assert all(" + " not in program for program in chosen_programs(store, root))
    by_verifier = {**blend, "q_ai": "verifier"}
    stats = pairs_stage(context(store, scratch, tiny_model_dir, force=True, pairs=by_verifier))
    assert stats["pairs"] > 0
    chosen = chosen_programs(store, root)
    assert sum(" + " in program for program in chosen) >= 0.8 * len(chosen), chosen
    saved = json.loads((root / "store" / LAYOUT.stage("pairs") / "stats.json").read_text())
    assert (saved["q_ai"], saved["q_ai_asked"]) == ("verifier", "verifier")
    fingerprint = store.marker(LAYOUT.stage("pairs"))["fingerprint"]
    assert "verifier" in fingerprint["inputs"] and fingerprint["config"]["pairs.q_ai"] == "verifier"


def two_answers() -> CyclingAnswers:
    """A constant 3 first, then a + b: both pass the visible test (add(1, 2) = 3), only a + b
    the hidden one."""
    return CyclingAnswers([variant("3", 0), variant("a + b", 1)], "two-answers")


def evaluate_bon(store, root: Path, model_dir: Path, out: Path, **evaluate_settings):
    from codeq.evaluate import evaluate

    ctx = context(
        store,
        root / "scratch",
        model_dir,
        search={"rollouts": 1, "rewrites_per_expansion": 1, "bon_samples": 2},
        evaluate={"modes": ["bon"], "rollout_ablation": [1], **evaluate_settings},
    )
    tasks = root / "tasks" / "validation.jsonl"
    tie_break = evaluation_tie_break(ctx)
    results = evaluate(tasks, out, ctx.config, engine=two_answers(), tie_break=tie_break)
    return ctx, results


def test_the_verifier_chooses_among_answers_tied_on_the_visible_tests(
    trained_round, tiny_model_dir
):
    store, root, _ = trained_round
    out = root / "eval"
    _, critique = evaluate_bon(store, root, tiny_model_dir, out / "critique", tie_break="critique")
    assert critique.modes["bon"].solved == 0  # equal critiques: the first sample, a constant
    ctx, verifier = evaluate_bon(
        store, root, tiny_model_dir, out / "candidate" / "validation", tie_break="verifier"
    )
    assert verifier.modes["bon"].solved == len(VALIDATION)
    assert verifier.bon_ablation["1"].solved == 0  # one sample: nothing to choose among

    record = record_evaluation(ctx, root / "tasks", out)
    assert record is not None and record["tie_break"] == "verifier"
    validation = record["validation"]
    assert (validation["programs"], validation["passing"]) == (2 * len(VALIDATION), len(VALIDATION))
    assert validation["auc"] is not None and validation["auc"] >= 0.8
    assert json.loads((out / "verifier.json").read_text()) == record

    from codeq.report import render_report

    report = render_report(root / "report", results=verifier.model_dump(), verifier=record)
    text = (report.parent / "report.md").read_text()
    assert "## Learned verifier" in text and "chose among answers tied" in text
    assert f"{validation['auc']:.3f} over {2 * len(VALIDATION)} programs" in text
    within = validation["within_task"]
    assert within["tasks"] == len(VALIDATION)  # each task: one passing and one failing answer
    assert f"{within['pairs']} passing/failing pairs of {within['tasks']} tasks" in text

    # a record made before the within-task AUC was measured still renders
    older = {**record, "validation": {k: v for k, v in validation.items() if k != "within_task"}}
    report = render_report(root / "report-older", results=verifier.model_dump(), verifier=older)
    assert "– over 0 passing/failing pairs" in (report.parent / "report.md").read_text()


@pytest.mark.parametrize("probes", [0, 8])
def test_a_round_without_a_verifier_records_agreement_only_when_it_chose(tmp_path, probes):
    from test_report import PAIR_STATS

    from codeq.report import render_report

    store = open_store(StoreConfig(uri=f"file://{tmp_path / 'store'}"))
    ctx = context(
        store,
        tmp_path / "scratch",
        tmp_path / "no-model",
        verifier={"enabled": False},
        evaluate={"tie_break": "critique", "agreement_probes": probes},
    )
    record = record_evaluation(ctx, tmp_path / "tasks", tmp_path / "eval")
    if not probes:  # the critique alone chose: nothing to record
        assert record is None and not (tmp_path / "eval" / "verifier.json").exists()
        return
    assert record is not None
    assert (record["tie_break"], record["agreement_probes"]) == ("critique", 8)
    assert "verifier" not in record and "no verifier" in record["missing"]
    report = render_report(tmp_path / "report", pair_stats=PAIR_STATS, verifier=record)
    text = (report.parent / "report.md").read_text()
    ranking = "execution agreement on 8 probe inputs (answered probes, then group size)"
    assert f"{ranking}, then critique" in text
    assert "- verifier: none (the round uses no verifier" in text


class SearchesNothing:
    """An engine for trees that must be read, not searched: any request fails the test."""

    name = "two-answers"  # the engine the trees were searched with

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        raise AssertionError(f"searched again: {len(requests)} request(s)")


def test_trees_searched_under_another_tie_break_are_answered_again_not_searched(
    trained_round, tiny_model_dir
):
    """What an incumbent's evaluation meets each round: its trees were searched when another
    scorer (the critique, or last round's verifier) broke ties. Best-of-N's trees do not depend
    on the tie-break, so they are reused and this round's verifier chooses their answers."""
    from codeq.evaluate import evaluate
    from codeq.evaluate.run import is_resume_file

    store, root, _ = trained_round
    earlier, later = root / "eval-reuse" / "critique", root / "eval-reuse" / "verifier"
    _, critique = evaluate_bon(store, root, tiny_model_dir, earlier, tie_break="critique")
    assert critique.modes["bon"].solved == 0
    later.mkdir(parents=True)
    for path in earlier.iterdir():
        if is_resume_file(path.name):
            shutil.copy(path, later / path.name)
    ctx = context(
        store,
        root / "scratch",
        tiny_model_dir,
        search={"rollouts": 1, "rewrites_per_expansion": 1, "bon_samples": 2},
        evaluate={"modes": ["bon"], "rollout_ablation": [1], "tie_break": "verifier"},
    )
    results = evaluate(
        root / "tasks" / "validation.jsonl",
        later,
        ctx.config,
        engine=SearchesNothing(),
        tie_break=evaluation_tie_break(ctx),
    )
    assert results.modes["bon"].solved == len(VALIDATION)
    before = read_jsonl(earlier / "trajectories-bon.jsonl", Trajectory)
    after = read_jsonl(later / "trajectories-bon.jsonl", Trajectory)
    assert [t.nodes for t in after] == [t.nodes for t in before]  # the same trees
    for tree in after:  # each answered by the verifier: the sum, not the constant
        assert "a + b" in tree.nodes[tree.final_node].program


def test_a_round_without_its_verifier_stops_naming_the_lineage(tmp_path, tiny_model_dir):
    store = collected_store(tmp_path, tiny_model_dir)
    ctx = context(
        store,
        tmp_path / "scratch",
        tiny_model_dir,
        verifier={"enabled": False},
        pairs={"q_ai": "verifier"},
    )
    with pytest.raises(VerifierMissingError) as caught:
        pairs_stage(ctx)
    message = str(caught.value)
    assert base_of(tiny_model_dir).describe() in message
    assert "pairs.q_ai=verifier" in message and "verifier.enabled is false" in message
    assert caught.value.exit_code == EXIT_BAD_INPUT
    assert not store.is_complete(LAYOUT.stage("pairs"))

    fallback = context(
        store,
        tmp_path / "scratch",
        tiny_model_dir,
        verifier={"enabled": False, "fallback": "critique"},
        pairs={"q_ai": "verifier"},
    )
    assert pairs_stage(fallback)["pairs"] > 0
    saved = json.loads((tmp_path / "store" / LAYOUT.stage("pairs") / "stats.json").read_text())
    assert (saved["q_ai"], saved["q_ai_asked"]) == ("critique", "verifier")


def test_a_job_without_its_verifier_prints_one_error_line(tmp_path, tiny_model_dir):
    store = collected_store(tmp_path, tiny_model_dir)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", "/root"),
        "PYTHONPATH": str(REPO),
        "CODEQ_STORE__URI": store.uri,
        "CODEQ_POLICY__MODEL": str(tiny_model_dir),
        "CODEQ_PAIRS__Q_AI": "verifier",
        "CODEQ_VERIFIER__FALLBACK": "error",  # the default, critique, would stand in
    }
    done = subprocess.run(
        [sys.executable, "-m", "jobs.pairs"],
        env=env,
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=600,
    )
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode == EXIT_BAD_INPUT, done.stderr[-2000:]
    assert len(errors) == 1 and base_of(tiny_model_dir).describe() in errors[0], errors


def test_a_verifier_of_another_base_model_is_refused_naming_both(
    trained_round, tiny_model_dir, tmp_path
):
    store, root, _ = trained_round
    other = tmp_path / "other-model"
    shutil.copytree(tiny_model_dir, other)
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "rope_theta": 20000.0}))
    ctx = context(store, tmp_path / "scratch", other, evaluate={"tie_break": "verifier"})
    with pytest.raises(VerifierLineageError) as caught:
        evaluation_tie_break(ctx)
    message = str(caught.value)
    assert base_of(tiny_model_dir).describe() in message and base_of(other).describe() in message
    # the fallback covers a missing verifier, never one of another model
    ctx = context(store, tmp_path / "scratch", other, verifier={"fallback": "critique"})
    with pytest.raises(VerifierLineageError):
        required_verifier(ctx, "pairs.q_ai")
    with pytest.raises(VerifierLineageError):  # nor the scores it wrote of the round's rewrites
        pairs_q_ai(ctx)


def test_a_round_runs_the_verifier_after_collect_unless_disabled():
    assert round_stages(load_config()) == [*STAGES[:2], "verifier", *STAGES[2:]]
    disabled = round_stages(load_config(overrides={"verifier": {"enabled": False}}))
    assert disabled == STAGES


def test_the_bench_measures_the_verifier_on_a_stores_validation_rewrites(tmp_path, tiny_model_dir):
    """bench/verifier_auc.py on a tiny store: trains on the round's collect, scores the
    validation rewrites of its evaluation, each labelled by running it on all its tests."""
    store = collected_store(tmp_path, tiny_model_dir)
    answers = []
    for task in VALIDATION:
        nodes = [Node(id=0, parent=None, depth=0, program=task.buggy_code)]
        for node_id, expression in enumerate(["3", "a + b"], 1):
            program = variant(expression, node_id)
            nodes.append(Node(id=node_id, parent=0, depth=1, program=program, completion=program))
        answers.append(collected(task, base_of(tiny_model_dir)).model_copy(update={"nodes": nodes}))
    folder = tmp_path / "eval" / "candidate" / "validation"
    write_jsonl(folder / "trajectories-bon.jsonl", answers)
    write_jsonl(folder / "trajectories-bon.partial.jsonl", answers[:1])  # resume state: not read
    store.put_dir(LAYOUT.stage("eval"), tmp_path / "eval")
    bench = load_bench("verifier_auc")
    out = tmp_path / "auc.json"
    argv = ["--store", str(tmp_path / "store"), "--train-run", "default", "--eval-run", "default"]
    argv += ["--model", str(tiny_model_dir), "--max-length", "192", "--epochs", "12"]
    argv += ["--learning-rate", "5e-3", "--lora-r", "8", "--eval-fraction", "0.25"]
    argv += ["--work", str(tmp_path / "work"), "--json", str(out)]
    keep = ["--keep", str(tmp_path / "kept")]
    assert bench.main(argv + keep) == 0
    result = json.loads(out.read_text())
    assert result["command"].startswith("python bench/verifier_auc.py --store ")
    assert result["train_programs"]["used"] == 12 * len(TRAIN)
    assert result["train_programs"]["within_task_pairs"] == 16 * len(TRAIN)  # capped per task
    validation = result["validation"]
    assert (validation["programs"], validation["passing"]) == (2 * len(VALIDATION), len(VALIDATION))
    assert validation["auc"] >= 0.8
    low, high = validation["auc_interval_95"]
    assert low <= validation["auc"] <= high
    assert validation["within_task"]["tasks"] == len(VALIDATION)
    assert result["heldout"]["programs"] == result["train_programs"]["held_out"]
    assert result["heldout"]["auc"] == result["heldout_auc"]
    assert result["critique_heldout"]["auc"] == 0.0  # the toy critique is the wrong way round
    assert not result["reused_trained_verifier"]

    assert result["search_validation"] is None and result["decision"] is None

    # scoring again reuses the verifier the same arguments trained, and scores it the same;
    # a search's trees on the validation tasks are ranked within each task (the critique too:
    # here it prefers the wrong rewrite of every task). Both rewrites pass the visible test
    # (3 is 1 + 2), so the tie-break chooses the answer; only a + b passes the hidden one too.
    visible = Verdict(passed=True, n_passed=1, n_total=1, status="passed", backend="subprocess")
    searched = [
        tree.model_copy(
            update={
                "reward_tests": "visible",
                "nodes": [
                    node
                    if node.id == 0
                    else node.model_copy(update={"q_ai": 1.0 / node.id, "verdict": visible})
                    for node in tree.nodes
                ],
            }
        )
        for tree in answers
    ]
    write_jsonl(tmp_path / "search" / "trajectories-bon.jsonl", searched)
    search_args = ["--search-trees", str(tmp_path / "search" / "trajectories-bon.jsonl")]
    assert bench.main(argv + search_args) == 0
    again = json.loads(out.read_text())
    assert again["reused_trained_verifier"] and again["validation"] == validation
    assert again["heldout"] == result["heldout"]
    search = again["search_validation"]
    assert search["tasks_with_both"] == len(VALIDATION) == search["tasks_searched"]
    assert search["verifier"]["within_task"] == validation["within_task"]
    low, high = search["verifier"]["within_task_interval_95"]
    assert low <= search["verifier"]["within_task"]["auc"] <= high
    assert search["critique"]["within_task"]["auc"] == 0.0
    # the answers chosen again: the critique picks the wrong rewrite of every task, the
    # verifier (within-task AUC 1 here) the right one
    (answers,) = search["answers"].values()
    assert answers["tasks"] == answers["tie_broken"] == len(VALIDATION)
    assert answers["critique_solved"] == 0
    assert answers["verifier_solved"] == len(answers["gained"]) == len(VALIDATION)
    # and the declared rule then hands the verifier both choices
    assert again["decision"]["settings"] == {
        "evaluate.tie_break": "verifier",
        "pairs.q_ai": "verifier",
    }

    # a fresh machine: the verifier and its scores kept for git go on there, trained once
    fresh = [*argv[:-4], "--work", str(tmp_path / "fresh"), "--json", str(tmp_path / "fresh.json")]
    assert bench.main(fresh + keep) == 0
    restored = json.loads((tmp_path / "fresh.json").read_text())
    assert restored["reused_trained_verifier"] and restored["validation"] == validation
    assert restored["heldout"] == result["heldout"]
    kept = json.loads((tmp_path / "kept" / "KEPT.json").read_text())
    assert "verifier/adapter_model.safetensors" in kept["files"]
    # other arguments, or a kept file that fails its sha256: refused, nothing trained over it
    with pytest.raises(SystemExit, match="trained with other arguments \\(learning_rate\\)"):
        bench.main([*fresh, "--learning-rate", "1e-3", *keep])
    weights = tmp_path / "kept" / kept["files"]["verifier/adapter_model.safetensors"]["file"]
    third = [*argv[:-4], "--work", str(tmp_path / "third"), "--json", str(out), *keep]
    packed = weights.read_bytes()
    weights.write_bytes(packed[:-1])
    with pytest.raises(SystemExit, match="adapter_model.safetensors.xz is not a readable xz"):
        bench.main(third)
    weights.write_bytes(lzma.compress(lzma.decompress(packed) + b"\0"))
    with pytest.raises(SystemExit, match="adapter_model.safetensors.* fails its sha256"):
        bench.main(third)
    assert not (tmp_path / "third" / "verifier").exists()


def test_a_stopped_verifier_stage_resumes_from_its_checkpoint_in_the_store(
    tmp_path, tiny_model_dir, monkeypatch
):
    import codeq.verifier.train as verifier_train
    from codeq.pipeline.verifier import PROGRESS
    from codeq.train.checkpoints import latest

    store = collected_store(tmp_path, tiny_model_dir)
    short = {"verifier": {"max_steps": 4, "checkpoint_every_s": 1e-9}}
    with preempted_after_checkpoint(monkeypatch, verifier_train, step=2):
        verifier_stage(context(store, tmp_path / "pod-1", tiny_model_dir, **short))
    assert latest(store, LAYOUT.stage(PROGRESS))["step"] == 2
    assert not store.is_complete(LAYOUT.stage("verifier"))

    result = verifier_stage(context(store, tmp_path / "pod-2", tiny_model_dir, **short))
    assert result["trained"] and result["resumed_from_step"] == 2, result
    assert store.marker(LAYOUT.stage("verifier"))["resumed_from_step"] == 2
    assert latest(store, LAYOUT.stage(PROGRESS)) is None  # spent once the verifier is kept
    assert not store.list(LAYOUT.stage(PROGRESS))


def test_the_bench_resumes_a_stopped_run_and_refuses_another_runs_checkpoint(
    tmp_path, tiny_model_dir, monkeypatch
):
    import codeq.verifier.train as verifier_train

    collected_store(tmp_path, tiny_model_dir)
    evaluation = tmp_path / "store" / LAYOUT.stage("eval") / "candidate" / "validation"
    write_jsonl(evaluation / "trajectories-bon.jsonl", [])
    bench = load_bench("verifier_auc")
    argv = ["--store", str(tmp_path / "store"), "--train-run", "default", "--eval-run", "default"]
    argv += ["--model", str(tiny_model_dir), "--max-length", "192", "--epochs", "1"]
    argv += ["--work", str(tmp_path / "work"), "--json", str(tmp_path / "auc.json")]
    argv += ["--checkpoint-every-s", "1e-9"]
    with preempted_after_checkpoint(monkeypatch, verifier_train, step=2):
        bench.main(argv)
    with pytest.raises(SystemExit, match="made with other arguments \\(learning_rate\\)"):
        bench.main([*argv, "--learning-rate", "5e-3"])
    assert bench.main(argv) == 0
    result = json.loads((tmp_path / "auc.json").read_text())
    assert result["resumed_from_step"] == 2 and result["global_steps"] > 2
    assert not (tmp_path / "work" / "progress").exists()  # spent once the verifier is trained


def test_a_keep_folder_git_would_leave_out_is_refused_before_training(tmp_path):
    bench = load_bench("verifier_auc")
    repo = Path(__file__).resolve().parent.parent
    if not (repo / ".git").exists():
        pytest.skip("not a git checkout: nothing is ignored")
    ignored = repo / "codeq-store" / "kept"  # .gitignore: local runs
    with pytest.raises(SystemExit, match=r"error: git ignores .*codeq-store/kept/KEPT\.json"):
        bench.refuse_ignored_keep([ignored / name for name in bench.KEPT_EXAMPLES])
    bench.refuse_ignored_keep([repo / "docs" / "results" / "verifier" / "x" / "KEPT.json"])


def evaluate_cli(monkeypatch, tasks: Path, out: Path, model: Path, *extra: str, **env: str):
    """`codeq evaluate` on one task, best-of-2 only, with the tiny model; returns the exit code."""
    from codeq.cli import run

    settings = {
        "CODEQ_SANDBOX__BACKEND": "subprocess",
        "CODEQ_SANDBOX__WORKERS": "1",
        "CODEQ_POLICY__DEVICE": "cpu",
        "CODEQ_POLICY__MAX_NEW_TOKENS": "24",
        "CODEQ_SEARCH__BON_SAMPLES": "2",
        "CODEQ_SEARCH__REWRITES_PER_EXPANSION": "1",
        "CODEQ_EVALUATE__ROLLOUT_ABLATION": "[1]",
        "CODEQ_EVALUATE__AGREEMENT_PROBES": "0",
        **env,
    }
    for name, value in settings.items():
        monkeypatch.setenv(name, value)
    command = ["evaluate", str(tasks), "--model", str(model), "--out", str(out)]
    return run([*command, "--modes", "bon", "--max-tasks", "1", "--rollouts", "1", *extra])


def evaluate_with_verifier(monkeypatch, tasks: Path, out: Path, model: Path, verifier: Path):
    """`codeq evaluate --verifier DIR` with the verifier breaking ties; returns the exit code."""
    return evaluate_cli(
        monkeypatch,
        tasks,
        out,
        model,
        "--verifier",
        str(verifier),
        CODEQ_EVALUATE__TIE_BREAK="verifier",
    )


def test_codeq_evaluate_chooses_with_a_kept_verifier_and_says_so(
    trained_round, tiny_model_dir, tmp_path, monkeypatch, capsys
):
    store, root, _ = trained_round
    kept = root / "store" / LAYOUT.stage("verifier")  # a verifier folder outside any round
    tasks = root / "tasks" / "validation.jsonl"
    code = evaluate_with_verifier(monkeypatch, tasks, tmp_path / "eval", tiny_model_dir, kept)
    captured = capsys.readouterr()
    assert code == 0, captured.err[-2000:]
    summary = json.loads(captured.out.strip().splitlines()[-1])
    info = json.loads((kept / "VERIFIER.json").read_text())
    assert summary["tie_break"] == f"verifier {kept} ({info['adapter_sha256'][:12]})"
    assert summary["modes"]["bon"]["n"] == 1

    # without one, the self-critique chooses only where verifier.fallback says so, and says so
    code = evaluate_cli(
        monkeypatch,
        tasks,
        tmp_path / "eval-critique",
        tiny_model_dir,
        CODEQ_EVALUATE__TIE_BREAK="verifier",
        CODEQ_VERIFIER__FALLBACK="critique",
    )
    captured = capsys.readouterr()
    assert code == 0, captured.err[-2000:]
    assert json.loads(captured.out.strip().splitlines()[-1])["tie_break"] == "self-critique"
    assert "no --verifier was given: the self-critique is used" in captured.err


def test_codeq_evaluate_reads_a_verifier_kept_in_git_and_refuses_a_changed_file(
    trained_round, tiny_model_dir, tmp_path, monkeypatch, capsys
):
    """A verifier kept as bench/verifier_auc.py --keep keeps it for git (KEPT.json, files
    xz-packed where that pays) is unpacked and checked by its sha256 before it is loaded."""
    from argparse import Namespace

    store, root, _ = trained_round
    work, keep = tmp_path / "work", tmp_path / "kept"
    shutil.copytree(root / "store" / LAYOUT.stage("verifier"), work / "verifier")
    (work / "metrics.json").write_text("{}")
    keep.mkdir()
    load_bench("verifier_auc").keep_trained(Namespace(work=work, keep=keep))
    assert (keep / "verifier" / "tokenizer.json.xz").is_file()
    assert not (keep / "verifier" / "tokenizer.json").exists()
    tasks = root / "tasks" / "validation.jsonl"
    code = evaluate_with_verifier(
        monkeypatch, tasks, tmp_path / "eval", tiny_model_dir, keep / "verifier"
    )
    captured = capsys.readouterr()
    assert code == 0, captured.err[-2000:]
    assert json.loads(captured.out.strip().splitlines()[-1])["tie_break"].startswith("verifier ")

    packed = keep / "verifier" / "tokenizer.json.xz"
    packed.write_bytes(lzma.compress(lzma.decompress(packed.read_bytes()) + b" "))
    code = evaluate_with_verifier(
        monkeypatch, tasks, tmp_path / "eval-changed", tiny_model_dir, keep / "verifier"
    )
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert code != 0 and len(errors) == 1 and f"{packed} fails its sha256" in errors[0], errors


def test_codeq_evaluate_refuses_a_missing_or_foreign_verifier_in_one_line(
    trained_round, tiny_model_dir, tmp_path, monkeypatch, capsys
):
    store, root, _ = trained_round
    kept = root / "store" / LAYOUT.stage("verifier")
    tasks = root / "tasks" / "validation.jsonl"

    def refused(model: Path, *extra: str, **env: str) -> str:
        code = evaluate_cli(monkeypatch, tasks, tmp_path / "eval", model, *extra, **env)
        err = capsys.readouterr().err
        errors = [line for line in err.splitlines() if line.startswith("error: ")]
        assert code == EXIT_BAD_INPUT and len(errors) == 1, err[-2000:]
        assert "Traceback" not in err and not (tmp_path / "eval" / "results.json").exists()
        return errors[0]

    other = tmp_path / "other-model"
    shutil.copytree(tiny_model_dir, other)
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "rope_theta": 20000.0}))
    error = refused(other, "--verifier", str(kept), CODEQ_EVALUATE__TIE_BREAK="verifier")
    assert base_of(tiny_model_dir).describe() in error and base_of(other).describe() in error

    error = refused(
        tiny_model_dir, CODEQ_EVALUATE__TIE_BREAK="verifier", CODEQ_VERIFIER__FALLBACK="error"
    )
    assert base_of(tiny_model_dir).describe() in error and "no --verifier was given" in error

    error = refused(tiny_model_dir, "--verifier", str(kept), CODEQ_EVALUATE__TIE_BREAK="critique")
    assert "evaluate.tie_break is 'critique'" in error


def test_the_search_modes_test_run_answers_by_agreement_then_the_kept_verifier(
    trained_round, tiny_model_dir, tmp_path, monkeypatch
):
    """bench/search_modes.py --test-run with the tiny model on real test tasks, the first left
    out: the three searches at equal programs with every answer chosen by agreement then the
    kept verifier, the same trees answered again by the critique beside it, and never twice."""
    from codeq import cli
    from codeq.schemas import read_jsonl

    store, root, _ = trained_round
    kept = root / "store" / LAYOUT.stage("verifier")
    assert cli.run(["prepare", "--source", "builtin", "--out", str(tmp_path / "tasks")]) == 0
    test = tmp_path / "tasks" / "test.jsonl"
    out = tmp_path / "modes-test.json"
    command = [sys.executable, str(REPO / "bench" / "search_modes.py"), "--tasks", str(test)]
    command += ["--model", str(tiny_model_dir), "--tiny", "--max-new-tokens", "16"]
    command += ["--rewrites", "1", "--rollouts", "2", "--samples", "1", "--turns", "2"]
    command += ["--out", str(tmp_path / "eval"), "--json", str(out)]
    command += ["--test-run", "--verifier", str(kept), "--skip", "1"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(out.read_text())
    searched = [task.task_id for task in read_jsonl(test, Task)][1:]
    assert found["split"] == "test" and found["skip"] == 1 and found["task_ids"] == searched
    info = json.loads((kept / "VERIFIER.json").read_text())
    assert found["verifier"]["adapter_sha256"] == info["adapter_sha256"]
    assert set(found["forests"]) == {"bon", "mt_bon", "mcts"}
    for mode, selection in found["forests"].items():
        assert {"critique", "answered+critique", "answered+verifier"} <= set(
            selection["selectors"]
        ), mode
        # the evaluation's own answers, recomputed from its trees
        solved = sorted(t for t, ok in found["per_task"]["bon"][str(2)].items() if ok)
        if mode == "bon":
            assert selection["per_task"]["answered+verifier"] == solved
        (last,) = [c for c in selection["comparisons"] if c["baseline"] == "critique"][-1:]
        assert (last["baseline"], last["other"]) == ("critique", "answered+verifier")

    # the ledger counts every row on the test split, and per search the verifier's answers
    # against the critique's, each recomputed task by task from the files the run wrote
    paired_tests = load_bench("paired_tests")
    monkeypatch.setattr(paired_tests, "RESULTS", tmp_path)
    entries = paired_tests.search_modes_entries([out.name])
    n = len(searched)
    assert {entry.split for entry in entries} == {f"test{n}"}
    assert not [entry for entry in entries if entry.role == "decided"]
    verifier_entries = [entry for entry in entries if entry.key.endswith("-verifier")]
    assert len(verifier_entries) == 3 and len(entries) == len(found["rows"]) + 3
    for entry in entries:
        backing, problems = paired_tests.check_entry(entry, {(f"test{n}", n): searched})
        assert not problems and backing in ("recomputed", "decision file"), problems

    again = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert again.returncode != 0 and "the test tasks are run once" in again.stderr
