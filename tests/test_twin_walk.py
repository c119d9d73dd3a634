"""The container twin's Argo walk (tests/twin.py) over the rendered chart, without Docker: the
entrypoint DAG, the chain of rounds that calls itself under `when`, each template's scope and
parameters are the twin's own code; only the pods are stand-ins. The round-number steps
(resolve-round, continue) run their rendered command (`python -m jobs.round ...`) in this
process against a local store, a stage Job leaves the markers the chain reads (its promote
decision, its report), and each stage's `finish` is judged by the chart's watch_job.py as in
the twin. So the multi-round path is exercised end to end as Argo would walk it, in seconds."""

from __future__ import annotations

import io
import os
from collections.abc import Mapping, Sequence
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import yaml

from tests import containers, twin

pytest.importorskip("helm_python")

RUN = "twin"  # run.name in helm/codeq/ci/twin-values.yaml
STAGES = ["prepare", "collect", "pairs", "train", "evaluate", "promote", "report"]


class WalkedTwin(twin.Twin):
    """The twin with its pods replaced: containers run in-process, Jobs finish at once."""

    def __init__(
        self,
        work: Path,
        objects: list[dict[str, Any]],
        parameters: Mapping[str, str],
        store: Path,
        promotes: Sequence[bool] = (),
        fail: tuple[int, str] | None = None,
    ) -> None:
        super().__init__(work, objects, parameters)
        self.store_root = store
        self.promotes = list(promotes)  # round n's promote decision: promotes[n]
        self.fail = fail  # (round, stage) whose Job fails
        self.results: list[tuple[str, str]] = []  # (step, result) of the container steps
        (config_map,) = [
            o for o in objects if o["kind"] == "ConfigMap" and "config.yaml" in o.get("data", {})
        ]
        work.mkdir(parents=True, exist_ok=True)
        self.config_file = work / "config.yaml"
        self.config_file.write_text(config_map["data"]["config.yaml"])

    def begin(self) -> dict[str, str]:  # no node, nothing to check before: no pods run
        return self.workflow_scope()

    def store(self) -> Any:
        from codeq.config import StoreConfig
        from codeq.store import open_store

        return open_store(StoreConfig(uri=f"file://{self.store_root}"))

    def run_container_template(
        self, step: str, template: dict[str, Any], scope: Mapping[str, str]
    ) -> str:
        from codeq.errors import CodeQError
        from jobs._runner import round_arguments, round_output

        container = template["container"]
        assert container["command"] == ["python", "-m", "jobs.round"], template["name"]
        args = [containers.substitute(a, scope) for a in container.get("args") or []]
        env = {
            e["name"]: containers.substitute(str(e.get("value", "")), scope)
            for e in container.get("env") or []
            if not e["name"].startswith(("AWS_", "CODEQ_STORE__ENDPOINT", "CODEQ_STORE__REGION"))
            and e["name"] != "CODEQ_STORE__CHECKSUMS"
        }
        env |= {"CODEQ_CONFIG_FILE": str(self.config_file)}
        env |= {"CODEQ_STORE__URI": f"file://{self.store_root}"}
        kept = {k: v for k, v in os.environ.items() if not k.startswith("CODEQ_")}
        output = io.StringIO()
        with mock.patch.dict(os.environ, {**kept, **env}, clear=True), redirect_stdout(output):
            try:
                result = round_output(round_arguments(args))
            except CodeQError as error:
                raise twin.TwinError(
                    f"step {step} (template {template['name']}) failed: exit "
                    f"{error.exit_code}\nerror: {error}"
                ) from None
        self.results.append((step, result))
        return result

    def run_resource(self, step: str, template: dict[str, Any], scope: Mapping[str, str]) -> None:
        from codeq.store import RoundLayout

        manifest = yaml.safe_load(containers.substitute(template["resource"]["manifest"], scope))
        name, labels = manifest["metadata"]["name"], manifest["metadata"]["labels"]
        stage, number = labels["codeq.io/stage"], int(labels["codeq.io/round"])
        assert name not in self.jobs, f"{name} applied twice"
        self.job_metadata[name] = manifest["metadata"]
        self.note_round(manifest)
        layout = RoundLayout(RUN, number)
        if (number, stage) == self.fail:
            reason = {"type": "Failed", "status": "True", "reason": "PodFailurePolicy"}
            status: dict[str, Any] = {"failed": 1, "conditions": [reason]}
        else:
            if stage == "promote":
                decision = {"promote": self.promotes[number]}
                self.store().mark_complete(layout.stage("promote"), decision)
            if stage == "report":
                self.store().mark_complete(layout.stage("report"), {})
            status = {"succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]}
        self.jobs[name] = twin.JobResult(name, status, [], 0.0, "PodFailurePolicy (exit 3)")


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict[str, Any]]]:
    return {
        "default": twin.render(twin.twin_values()),
        "patience 2": twin.render(twin.twin_values({"config": {"promotion": {"patience": 2}}})),
    }


def submit(rendered, tmp_path, name: str, values: str = "default", **kwargs) -> WalkedTwin:
    parameters = {"rounds": kwargs.pop("rounds")} if "rounds" in kwargs else {}
    return WalkedTwin(tmp_path / name, rendered[values], parameters, tmp_path / "store", **kwargs)


def round_stages(walked: WalkedTwin) -> list[str]:
    return [task["name"] for task in walked.templates["round"]["dag"]["tasks"]]


def test_one_round_per_submission_by_default(rendered, tmp_path):
    """argo/round.yaml sets no `rounds`: a round per submission, as before the chain."""
    first = submit(rendered, tmp_path, "first", promotes=[True, True])
    assert first.run_round()["rounds"] == ["0"]
    assert first.results == [("resolve-round", "0"), ("rounds.continue", "stop")]
    second = submit(rendered, tmp_path, "second", promotes=[True, True])
    assert second.run_round()["rounds"] == ["1"]


def test_one_submission_chains_the_rounds_asked_for(rendered, tmp_path):
    walked = submit(rendered, tmp_path, "chain", rounds="3", promotes=[True] * 3)
    outcome = walked.run_round()
    assert outcome["rounds"] == ["0", "1", "2"]
    assert walked.results == [
        ("resolve-round", "0"),
        ("rounds.continue", "1"),
        ("rounds.next.continue", "2"),
        ("rounds.next.next.continue", "stop"),
    ]
    workflow = outcome["workflow"]
    stages = round_stages(walked)
    assert stages[0] == "prepare" and stages[-1] == "report"
    assert list(walked.jobs) == [f"{workflow}-r{n}-{s}" for n in range(3) for s in stages]
    # The stages of round 2 ran three templates deep in the chain.
    assert "rounds.next.next.round.report" in [path for path, _ in walked.timings]


def test_the_chain_stops_after_patience_rounds_without_a_promotion(rendered, tmp_path):
    promotes = [False, True, False, False, True]
    walked = submit(rendered, tmp_path, "patience", "patience 2", rounds="5", promotes=promotes)
    assert walked.run_round()["rounds"] == ["0", "1", "2", "3"]
    assert walked.results[-1] == ("rounds.next.next.next.continue", "stop")
    # promotion.patience 1 (the default): the first round without a promotion ends it.
    strict = submit(rendered, tmp_path / "default", "strict", rounds="5", promotes=promotes)
    assert strict.run_round()["rounds"] == ["0"]


def test_a_failed_round_fails_the_submission_and_the_next_one_resumes_it(rendered, tmp_path):
    failing = submit(
        rendered, tmp_path, "fails", rounds="3", promotes=[True] * 4, fail=(1, "train")
    )
    with pytest.raises(twin.TwinError) as failure:
        failing.run_round()
    assert f"Job {failing.globals['workflow.name']}-r1-train failed" in str(failure.value)
    assert failing.rounds == ["0", "1"]
    assert not any(step.endswith("continue") and result == "2" for step, result in failing.results)
    again = submit(rendered, tmp_path, "again", rounds="2", promotes=[True] * 4)
    assert again.run_round()["rounds"] == ["1", "2"]
    assert again.results[0] == ("resolve-round", "1")


def test_more_rounds_than_the_deadline_covers_fail_at_once(rendered, tmp_path):
    walked = submit(rendered, tmp_path, "too-many", rounds="11")
    with pytest.raises(twin.TwinError, match=r"step resolve-round .* exit 2\n.*rounds=11"):
        walked.run_round()
    assert walked.jobs == {}


def test_stop_after_ends_the_walk_inside_the_first_round(rendered, tmp_path):
    walked = submit(rendered, tmp_path, "stop", rounds="3", promotes=[True] * 3)
    outcome = walked.run_round(stop_after="prepare")
    assert outcome["rounds"] == ["0"] and list(walked.jobs) == [f"{outcome['workflow']}-r0-prepare"]
    job = walked.job_manifest("collect", outcome["scope"])
    assert job["metadata"]["name"] == f"{outcome['workflow']}-r0-collect"


@pytest.mark.parametrize(
    ("expression", "holds"),
    [
        ("1 != stop", True),
        ("stop != stop", False),
        ("heads == heads", True),
        ("3 == 3.0", True),
        ("'3' == 3", False),
        ('"stop" == stop', True),
    ],
)
def test_when_is_judged_as_argo_judges_it(expression, holds):
    assert twin.when_holds(expression) is holds


@pytest.mark.parametrize("expression", ["a > b", "a == a && b == b", "true"])
def test_a_when_the_twin_cannot_judge_is_refused(expression):
    with pytest.raises(twin.TwinError, match="not modelled"):
        twin.when_holds(expression)
