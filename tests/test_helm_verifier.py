"""The learned verifier in the Helm chart: unless the codeq config's verifier.enabled is false
(codeq's default is true) every round runs the `verifier` stage between collect and pairs, as its
own Job in the train image on the train pool, counted in the workflow's deadline; values that
cannot work fail at render with one line naming the value. The strict schemas and checkov run on
helm/codeq/ci/critique-values.yaml (no verifier) with every other scenario
(tests/test_chart_validation.py)."""

from __future__ import annotations

import json
import math
import os
from typing import Any

import pytest
from test_helm import (
    CHART,
    CRITIQUE_STAGES,
    NAMESPACE,
    RELEASE,
    SCENARIOS,
    STAGES,
    VERIFIER,
    deep_merge,
    effective_values,
    go_duration_seconds,
    objects,
    scenario_stages,
    scenario_values,
    stage_jobs,
    templates,
    workflow_template,
)

helm = pytest.importorskip("helm_python")

DISABLED = {"config": {"verifier": {"enabled": False}}}


def round_tasks(scenario: str, extra: str = "") -> list[str]:
    """The stages of one round of the rendered workflow, in the order its DAG runs them."""
    tasks = templates(scenario, extra)["round"]["dag"]["tasks"]
    order, done = [], set()
    while len(order) < len(tasks):
        ready = [t for t in tasks if t["name"] not in done and t.get("depends", "") in done | {""}]
        assert len(ready) == 1, [t["name"] for t in ready]
        order.append(ready[0]["name"])
        done.add(ready[0]["name"])
    return order


def test_the_verifier_stage_runs_between_collect_and_pairs_unless_the_config_disables_it():
    expected = ["prepare", "collect", VERIFIER, "pairs", "train", "evaluate", "promote", "report"]
    assert round_tasks("default") == expected == STAGES
    assert round_tasks("critique") == CRITIQUE_STAGES
    assert VERIFIER not in templates("critique")
    assert f"{VERIFIER}-start" not in templates("critique")
    assert VERIFIER not in stage_jobs("critique")
    assert round_tasks("default", json.dumps(DISABLED)) == CRITIQUE_STAGES


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_the_charts_round_is_the_round_codeq_runs_for_its_config(scenario, tmp_path, monkeypatch):
    """The workflow's stages are codeq's own for the config in the ConfigMap (round_stages):
    the chart decides from the same key the pipeline does."""
    from codeq.config import load_config
    from codeq.pipeline.stages import round_stages

    for key in [k for k in os.environ if k.startswith("CODEQ_")]:
        monkeypatch.delenv(key)
    (cm,) = [o for o in objects(scenario) if o["metadata"]["name"] == f"{RELEASE}-config"]
    path = tmp_path / "config.yaml"
    path.write_text(cm["data"]["config.yaml"])
    assert round_tasks(scenario) == round_stages(load_config(path))


def test_the_verifier_job_trains_in_the_train_image_on_the_train_pool():
    values = effective_values("default")
    conf = values["stages"][VERIFIER]
    job = stage_jobs("default")[VERIFIER]
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    train_image = values["images"]["train"]
    assert container["image"] == f"{train_image['repository']}:{train_image['tag']}"
    assert container["args"] == ["python", "-m", "jobs.verifier"]
    train = values["pools"]["train"]
    assert conf["pool"] == "train"
    assert pod["nodeSelector"] == train["nodeSelector"]
    assert pod["tolerations"] == train["tolerations"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == conf["gpus"] == 1
    assert container["resources"]["requests"] == conf["resources"]["requests"]
    assert job["spec"]["activeDeadlineSeconds"] == conf["activeDeadlineSeconds"]
    assert job["spec"]["backoffLimit"] == conf["backoffLimit"]
    assert "completionMode" not in job["spec"], "one pod"
    # No sandbox: the train image has no runsc, so no seccomp relaxation either.
    assert container["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    annotations = job["metadata"]["annotations"]
    assert "images.train.digest" in annotations["checkov.io/skip1"]
    assert "checkov.io/skip2" not in annotations
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert "CODEQ_TRAIN__PROCESSES" not in env and "JOB_COMPLETION_COUNT" not in env
    sizes = {v["name"]: v["emptyDir"]["sizeLimit"] for v in pod["volumes"] if "emptyDir" in v}
    assert sizes == {
        "scratch": conf["volumes"]["scratch"],
        "tmp": conf["volumes"]["tmp"],
        "dshm": conf["volumes"]["shm"],
    }
    # Pinned by digest, the train image's digest is used.
    digest = "sha256:" + "2" * 64
    pinned = stage_jobs("default", json.dumps({"images": {"train": {"digest": digest}}}))
    (container,) = pinned[VERIFIER]["spec"]["template"]["spec"]["containers"]
    assert container["image"] == f"{train_image['repository']}@{digest}"


def test_pairs_stays_on_the_cpu_pool_and_evaluate_loads_the_verifier_on_its_gpu():
    """Pairs (pairs.q_ai=verifier, codeq's default) reads the scores the verifier stage wrote:
    no GPU, the CPU pool; evaluate (tie_break=verifier) loads the verifier where it runs."""
    from codeq.config import load_config

    config = load_config(None)
    assert config.pairs.q_ai == config.evaluate.tie_break == "verifier"
    jobs = stage_jobs("default")
    pairs = jobs["pairs"]["spec"]["template"]["spec"]
    assert pairs["containers"][0]["resources"]["limits"].get("nvidia.com/gpu", 0) == 0
    assert pairs["nodeSelector"] == effective_values("default")["pools"]["cpu"]["nodeSelector"]
    evaluate = jobs["evaluate"]["spec"]["template"]["spec"]["containers"][0]
    assert evaluate["resources"]["limits"]["nvidia.com/gpu"] == 1


def test_the_workflow_deadline_counts_the_verifier_stage():
    values = effective_values("default")
    rounds = values["workflow"].get("maxRounds", 1)
    start = math.ceil(go_duration_seconds(values["workflow"]["startTimeout"]))
    without = workflow_template("default", json.dumps(DISABLED))["spec"]["activeDeadlineSeconds"]
    with_it = workflow_template("default")["spec"]["activeDeadlineSeconds"]
    verifier = values["stages"][VERIFIER]["activeDeadlineSeconds"]
    assert with_it - without == rounds * (verifier + start)
    longer = {"stages": {VERIFIER: {"activeDeadlineSeconds": 90000}}}
    assert workflow_template("default", json.dumps(longer))["spec"][
        "activeDeadlineSeconds"
    ] - with_it == rounds * (90000 - verifier)


def test_the_notes_list_the_stages_a_round_runs_with_their_pools():
    def notes(extra: dict[str, Any]) -> str:
        with helm.Chart.load(CHART) as chart:
            values = deep_merge(deep_merge(chart.values, scenario_values("default")), extra)
            rendered = chart.render(values=values, name=RELEASE, namespace=NAMESPACE)
        (line,) = [
            ln for ln in rendered["codeq/templates/NOTES.txt"].splitlines() if "Stage pools" in ln
        ]
        return line

    assert notes(DISABLED).split(":", 1)[1].split() == [
        "prepare->cpu",
        "collect->infer",
        "pairs->cpu",
        "train->train",
        "evaluate->infer",
        "promote->cpu",
        "report->cpu",
    ]
    assert "collect->infer verifier->train pairs->cpu" in notes({})


def test_the_cpu_flavor_runs_the_verifier_without_a_gpu():
    """kind's values run everything on the CPU (config.policy.device=cpu): gpus 0 is right."""
    assert scenario_stages("kind") == STAGES
    (container,) = stage_jobs("kind")[VERIFIER]["spec"]["template"]["spec"]["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 0
    assert container["image"].startswith("codeq-train:")


@pytest.mark.parametrize(
    ("extra", "message", "remedy"),
    [
        (
            {"stages": {VERIFIER: {"gpus": 0}}},
            "stages.verifier.gpus=0 but config.policy.device=cuda",
            "give it stages.verifier.gpus=1",
        ),
        (
            deep_merge(DISABLED, {"config": {"verifier": {"fallback": "error"}}}),
            "config.pairs.q_ai=verifier asks for the round's learned verifier, but "
            "config.verifier.enabled is not true",
            "set config.verifier.enabled=true, or config.verifier.fallback=critique",
        ),
        (
            deep_merge(
                DISABLED,
                {"config": {"verifier": {"fallback": "error"}, "pairs": {"q_ai": "critique"}}},
            ),
            "config.evaluate.tie_break=verifier asks for the round's learned verifier",
            "config.verifier.fallback=critique",
        ),
        (
            {"config": {"search": {"reward_tests": "visible"}}},
            "config.search.reward_tests=visible with config.verifier.enabled",
            "collect with config.search.reward_tests=all",
        ),
        (
            {"jobs": {"extraEnv": [{"name": "CODEQ_VERIFIER__ENABLED", "value": "true"}]}},
            "jobs.extraEnv sets CODEQ_VERIFIER__ENABLED",
            "set it there",
        ),
    ],
)
def test_verifier_values_that_cannot_work_fail_the_render_with_one_line(extra, message, remedy):
    values = deep_merge(scenario_values("default"), extra)
    with helm.Chart.load(CHART) as chart, pytest.raises(helm.HelmError) as caught:
        chart.render(values=values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    text = str(caught.value)
    (line,) = [ln for ln in text.splitlines() if message in ln]
    assert remedy in line, text


@pytest.mark.parametrize(
    "extra",
    [
        # The self-critique stands in where config.verifier.fallback says so (its default).
        DISABLED,
        # A sandbox backend the train image can run: the verifier labels programs itself.
        {"config": {"search": {"reward_tests": "visible"}, "sandbox": {"backend": "subprocess"}}},
    ],
)
def test_verifier_values_that_work_render(extra):
    assert stage_jobs("default", json.dumps(extra))


@pytest.mark.parametrize(
    "bad",
    [
        {"stages": {VERIFIER: {"gpus": 2}}},  # one training process
        {"stages": {VERIFIER: {"sandbox": True}}},  # no runsc in the train image
        {"stages": {VERIFIER: {"shards": 2}}},
        {"stages": {VERIFIER: {"volumes": {"scratch": "big"}}}},
        {"stages": {VERIFIER: {"processes": 2}}},  # closed, as every stage
        {"config": {"verifier": {"enabled": "yes"}}},  # the chart reads it: a boolean
    ],
)
def test_the_values_schema_rejects_bad_verifier_values(bad):
    with helm.Chart.load(CHART) as chart, pytest.raises(helm.HelmError):
        chart.validate_schema(deep_merge(chart.values, bad))
