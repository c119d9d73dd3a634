"""The Helm chart's semantics, rendered by real Helm v4 (helm-python-sdk) for every
helm/codeq/ci/*-values.yaml scenario: what each stage Job, the round's DAG, its helper steps and
its exit handler do. The validation an operator's pipeline runs (strict Kubernetes and Argo
schemas, checkov) is tests/test_chart_validation.py; the helpers here are shared by both."""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import math
import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

helm = pytest.importorskip("helm_python")

REPO = Path(__file__).resolve().parent.parent
CHART = REPO / "helm" / "codeq"
SCENARIOS = sorted(
    p.name.removesuffix("-values.yaml") for p in (CHART / "ci").glob("*-values.yaml")
)
VERIFIER = "verifier"  # a stage unless config.verifier.enabled is false (stages_of)
STAGES = ["prepare", "collect", VERIFIER, "pairs", "train", "evaluate", "promote", "report"]
CRITIQUE_STAGES = [stage for stage in STAGES if stage != VERIFIER]  # critique-values.yaml
TRAIN_IMAGE_STAGES = {"train", VERIFIER}
SANDBOX_STAGES = {"prepare", "collect", "evaluate"}
CPU_STAGES = {"prepare", "pairs", "promote", "report"}
RELEASE, NAMESPACE = "codeq", "codeq"
WORKFLOW_NAME = "codeq-round-x7k2p"
# Plausible values for every Argo expression the chart uses, as a submitted workflow would
# substitute them (the spec run and the validation use the same table).
ARGO_SAMPLE = {
    "workflow.name": WORKFLOW_NAME,
    "workflow.parameters.round": "next",
    "workflow.parameters.run": "default",
    "workflow.parameters.force": "false",
    "workflow.parameters.rounds": "1",
    "workflow.status": "Failed",
    "tasks.resolve-round.outputs.result": "3",
    "steps.continue.outputs.result": "4",
    "inputs.parameters.round": "3",
    "inputs.parameters.first": "3",
    "inputs.parameters.job": f"{WORKFLOW_NAME}-r3-collect",
}
ARGO_EXPRESSIONS = set(ARGO_SAMPLE)
# Largest ephemeral-storage request of a stage in the default values: fits the allocatable
# ephemeral storage of a GPU node with a 100 GB boot disk (GKE's default, and the size the EKS
# GPU node group examples use); docs/cluster.md lists the sizes.
COMMON_NODE_EPHEMERAL_GI = 64


def argo_schema_path() -> Path:
    return Path(
        os.environ.get("CODEQ_ARGO_SCHEMA", REPO.parent / "shared" / "argo" / "schema.json")
    )


def scenario_values(scenario: str) -> dict[str, Any]:
    return helm.values_from_yaml((CHART / "ci" / f"{scenario}-values.yaml").read_text())


@functools.cache
def render(scenario: str, extra: str = "") -> dict[str, str]:
    values = scenario_values(scenario)
    if extra:
        values = deep_merge(values, json.loads(extra))
    with helm.Chart.load(CHART) as chart:
        return chart.render(values=values, name=RELEASE, namespace=NAMESPACE, is_install=True)


def render_with(scenario: str, **overrides: Any) -> dict[str, str]:
    return render(scenario, json.dumps(overrides, sort_keys=True))


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Helm's coalescing: maps merge key by key, a null removes a key, anything else replaces."""
    merged = copy.deepcopy(base)
    for key, value in override.items():
        if value is None:
            merged.pop(key, None)
        elif isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def effective_values(scenario: str, extra: str = "") -> dict[str, Any]:
    values = deep_merge(helm.Chart.load(CHART).values, scenario_values(scenario))
    return deep_merge(values, json.loads(extra)) if extra else values


def stages_of(values: dict[str, Any]) -> list[str]:
    """The stages a round of these values runs, in order: STAGES, the learned verifier between
    collect and pairs left out where the chart's config.verifier.enabled is false."""
    if not (values.get("config") or {}).get("verifier", {}).get("enabled", True):
        return list(CRITIQUE_STAGES)
    return list(STAGES)


def scenario_stages(scenario: str, extra: str = "") -> list[str]:
    return stages_of(effective_values(scenario, extra))


def objects(scenario: str, extra: str = "") -> list[dict[str, Any]]:
    found = []
    for path, text in sorted(render(scenario, extra).items()):
        if not path.endswith((".yaml", ".yml")):
            continue
        found.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return found


def workflow_template(scenario: str, extra: str = "") -> dict[str, Any]:
    (wt,) = [o for o in objects(scenario, extra) if o["kind"] == "WorkflowTemplate"]
    return wt


def templates(scenario: str, extra: str = "") -> dict[str, dict[str, Any]]:
    return {t["name"]: t for t in workflow_template(scenario, extra)["spec"]["templates"]}


def substitute(text: str, table: dict[str, str]) -> str:
    return re.sub(r"\{\{\s*([^{}]+?)\s*\}\}", lambda m: table[m.group(1)], text)


def raw_manifests(scenario: str, extra: str = "") -> dict[str, str]:
    """{stage: the Job manifest a resource template creates, Argo expressions unresolved}; every
    stage must have one (keyed by the manifest's codeq.io/stage label)."""
    found = {}
    for template in templates(scenario, extra).values():
        resource = template.get("resource")
        if resource and resource["action"] in ("create", "apply"):
            manifest = yaml.safe_load(resource["manifest"])
            if manifest["kind"] == "Job":
                found[manifest["metadata"]["labels"]["codeq.io/stage"]] = resource["manifest"]
    expected = scenario_stages(scenario, extra)
    assert sorted(found) == sorted(expected), f"stage Jobs found: {sorted(found)}"
    return found


def stage_jobs(scenario: str, extra: str = "", table: dict[str, str] | None = None):
    """{stage: Job dict} from the resource templates, Argo expressions substituted."""
    return {
        stage: yaml.safe_load(substitute(manifest, table or ARGO_SAMPLE))
        for stage, manifest in raw_manifests(scenario, extra).items()
    }


def helper_pods(scenario: str, extra: str = "") -> dict[str, dict[str, Any]]:
    """The pods Argo creates for the container templates (round number, exit handler), built as
    Argo builds them: the template's container, volumes and security context, the workflow's
    pod metadata, service account and placement."""
    wt = workflow_template(scenario, extra)
    spec = wt["spec"]
    pods = {}
    for name, template in templates(scenario, extra).items():
        if "container" not in template:
            continue
        labels = {**spec.get("podMetadata", {}).get("labels", {})}
        labels.update(template.get("metadata", {}).get("labels", {}))
        labels["workflows.argoproj.io/workflow"] = WORKFLOW_NAME
        pod_spec: dict[str, Any] = {
            "restartPolicy": "Never",
            "serviceAccountName": template.get("serviceAccountName", spec["serviceAccountName"]),
            "securityContext": template.get("securityContext", spec.get("securityContext")),
            "containers": [template["container"]],
            "volumes": template.get("volumes", []),
        }
        if "automountServiceAccountToken" in template:
            pod_spec["automountServiceAccountToken"] = template["automountServiceAccountToken"]
        if "activeDeadlineSeconds" in template:  # Argo sets the template's on its pod
            pod_spec["activeDeadlineSeconds"] = int(template["activeDeadlineSeconds"])
        for key in ("nodeSelector", "tolerations", "affinity", "imagePullSecrets"):
            if spec.get(key):
                pod_spec[key] = spec[key]
        if spec.get("podSpecPatch"):
            pod_spec.update(json.loads(spec["podSpecPatch"]))
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"{WORKFLOW_NAME}-{name}-1", "namespace": NAMESPACE},
            "spec": pod_spec,
        }
        pod["metadata"]["labels"] = labels
        annotations = {**spec.get("podMetadata", {}).get("annotations", {})}
        annotations.update(template.get("metadata", {}).get("annotations", {}))
        if annotations:
            pod["metadata"]["annotations"] = annotations
        pods[name] = yaml.safe_load(substitute(yaml.safe_dump(pod), ARGO_SAMPLE))
    return pods


def parse_quantity(text: str | int) -> float:
    """Kubernetes quantity in bytes (binary and decimal suffixes)."""
    match = re.fullmatch(r"([0-9.]+)([KMGTPE]i?|m)?", str(text))
    assert match, text
    units = {"": 1, "m": 1e-3}
    for i, suffix in enumerate("KMGTPE", start=1):
        units[suffix] = 1000**i
        units[suffix + "i"] = 1024**i
    return float(match.group(1)) * units[match.group(2) or ""]


# ----------------------------------------------------------------------------- the round's DAG


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_dag_fences_resolves_the_round_then_runs_the_chain_of_rounds(scenario):
    spec = workflow_template(scenario)["spec"]
    by_name = templates(scenario)
    tasks = by_name[spec["entrypoint"]]["dag"]["tasks"]
    assert [t["name"] for t in tasks] == ["fence", "resolve-round", "rounds"]
    assert "depends" not in tasks[0] and tasks[1]["depends"] == "fence"
    assert tasks[2]["depends"] == "resolve-round" and tasks[2]["template"] == "rounds"
    first = "{{tasks.resolve-round.outputs.result}}"
    assert tasks[2]["arguments"]["parameters"] == [
        {"name": "round", "value": first},
        {"name": "first", "value": first},
    ]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_the_chain_runs_a_round_asks_the_store_and_recurses_until_stop(scenario):
    """Argo's way to loop on a result: a steps template that calls itself under `when`."""
    by_name = templates(scenario)
    chain = by_name["rounds"]
    assert [p["name"] for p in chain["inputs"]["parameters"]] == ["round", "first"]
    groups = chain["steps"]
    assert [[step["name"] for step in group] for group in groups] == [
        ["round"],
        ["continue"],
        ["next"],
    ]
    (round_step,), (go_on,), (recurse,) = groups
    assert round_step["template"] == "round"
    assert round_step["arguments"]["parameters"] == [
        {"name": "round", "value": "{{inputs.parameters.round}}"}
    ]
    assert go_on["template"] == "continue"
    assert go_on["arguments"]["parameters"] == [
        {"name": "round", "value": "{{inputs.parameters.round}}"},
        {"name": "first", "value": "{{inputs.parameters.first}}"},
    ]
    assert recurse["template"] == "rounds", "the recursion"
    assert recurse["when"] == "{{steps.continue.outputs.result}} != stop"
    assert recurse["arguments"]["parameters"] == [
        {"name": "round", "value": "{{steps.continue.outputs.result}}"},
        {"name": "first", "value": "{{inputs.parameters.first}}"},
    ]
    # `continue` is the round-number step's container run with --continue, for the round just run.
    step = by_name["continue"]
    assert step["container"]["command"] == ["python", "-m", "jobs.round"]
    assert step["container"]["args"] == [
        "--continue",
        "--first",
        "{{inputs.parameters.first}}",
        "--rounds",
        "{{workflow.parameters.rounds}}",
    ]
    env = {e["name"]: e.get("value") for e in step["container"]["env"]}
    assert env["CODEQ_STORE__ROUND"] == "{{inputs.parameters.round}}"
    assert env["CODEQ_STORE__RUN"] == "{{workflow.parameters.run}}"
    assert step["serviceAccountName"] == "codeq-jobs" and not step["automountServiceAccountToken"]
    assert "75" in step["retryStrategy"]["expression"], "a store outage is retried"
    for helper in ("resolve-round", "continue"):
        assert by_name[helper]["activeDeadlineSeconds"] == "1800", helper


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_a_round_runs_every_stage_in_order_with_its_round_number(scenario):
    by_name = templates(scenario)
    one_round = by_name["round"]
    assert [p["name"] for p in one_round["inputs"]["parameters"]] == ["round"]
    tasks = one_round["dag"]["tasks"]
    stages = scenario_stages(scenario)
    assert [t["name"] for t in tasks] == stages
    assert "depends" not in tasks[0]
    for before, task in zip(stages[:-1], tasks[1:], strict=True):
        assert task["depends"] == before
    for task in tasks:
        (argument,) = task["arguments"]["parameters"]
        assert argument == {"name": "round", "value": "{{inputs.parameters.round}}"}
    for stage in stages:
        steps = [step for group in by_name[stage]["steps"] for step in group]
        assert [s["name"] for s in steps] == ["start", "finish"]
        assert steps[0]["template"] == f"{stage}-start"
        assert steps[1]["arguments"]["parameters"] == [
            {
                "name": "job",
                "value": f"{{{{workflow.name}}}}-r{{{{inputs.parameters.round}}}}-{stage}",
            }
        ]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_round_defaults_to_next_and_run_to_the_charts_value(scenario):
    values = effective_values(scenario)
    parameters = {
        p["name"]: p for p in workflow_template(scenario)["spec"]["arguments"]["parameters"]
    }
    assert list(parameters) == ["round", "run", "force", "rounds"]
    assert parameters["round"]["value"] == "next"
    assert parameters["run"]["value"] == values["run"]["name"]
    assert parameters["force"]["value"] == "false"
    assert parameters["rounds"]["value"] == "1", "one round per submission, as argo/round.yaml did"
    assert (
        f"workflow.maxRounds={values['workflow']['maxRounds']}"
        in (parameters["rounds"]["description"])
    )
    other = workflow_template(scenario, json.dumps({"run": {"name": "qwen7b-mcts"}}))
    assert other["spec"]["arguments"]["parameters"][1]["value"] == "qwen7b-mcts"


def test_the_round_number_step_runs_jobs_round_with_the_requested_round():
    """The first step prints the round (its stdout is the result every stage receives)."""
    step = templates("default")["resolve-round"]
    container = step["container"]
    assert container["command"] == ["python", "-m", "jobs.round"]
    maximum = str(effective_values("default")["workflow"]["maxRounds"])
    assert container["args"] == [
        "--rounds",
        "{{workflow.parameters.rounds}}",
        "--max-rounds",
        maximum,
    ]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["CODEQ_STORE__ROUND"] == "{{workflow.parameters.round}}"
    assert env["CODEQ_STORE__RUN"] == "{{workflow.parameters.run}}"
    assert env["CODEQ_FORCE"] == "{{workflow.parameters.force}}"  # the workflow's force parameter
    assert env["CODEQ_CONFIG_FILE"] == "/etc/codeq/config.yaml"
    # It reads the store with the jobs' identity; Argo's executor reports with the workflow's.
    assert step["serviceAccountName"] == "codeq-jobs"
    assert step["automountServiceAccountToken"] is False
    assert step["executor"]["serviceAccountName"] == "codeq-workflow"
    assert "75" in step["retryStrategy"]["expression"], "a store outage is retried"


def test_the_round_number_step_resolves_next_and_refuses_an_out_of_order_round(tmp_path):
    """Runs the rendered step's command and env (store swapped for a local folder)."""
    import subprocess
    import sys

    container = templates("default")["resolve-round"]["container"]
    (cm,) = [
        o for o in objects("default") if o["kind"] == "ConfigMap" and "config.yaml" in o["data"]
    ]
    (tmp_path / "config.yaml").write_text(cm["data"]["config.yaml"])
    store = tmp_path / "store"

    def run(requested: str, rounds: str = "1") -> subprocess.CompletedProcess:
        env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO)}
        table = {
            **ARGO_SAMPLE,
            "workflow.parameters.round": requested,
            "workflow.parameters.rounds": rounds,
        }
        for var in container["env"]:
            env[var["name"]] = substitute(var["value"], table)
        env.update(
            CODEQ_CONFIG_FILE=str(tmp_path / "config.yaml"),
            CODEQ_STORE__URI=f"file://{store}",
            HOME=str(tmp_path),
            TMPDIR=str(tmp_path),
        )
        env.pop("AWS_SHARED_CREDENTIALS_FILE", None)
        args = [substitute(arg, table) for arg in container["args"]]
        command = [sys.executable, *container["command"][1:], *args]
        return subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)

    first = run("next")
    assert first.returncode == 0, first.stderr[-2000:]
    assert first.stdout == "0\n"
    marker = store / "runs" / "default" / "round-0" / "report" / "_COMPLETE"
    marker.parent.mkdir(parents=True)
    marker.write_text("{}\n")
    assert run("next").stdout == "1\n"
    assert run("1").stdout == "1\n"
    refused = run("5")
    assert refused.returncode == 2 and refused.stdout == ""
    assert "round 4" in refused.stderr and "has not finished" in refused.stderr
    assert run("next", rounds="10").stdout == "1\n"  # workflow.maxRounds (10)
    too_many = run("next", rounds="11")
    assert too_many.returncode == 2 and too_many.stdout == ""
    assert "error: rounds=11 is more than the 10 round(s)" in too_many.stderr
    assert "workflow.maxRounds" in too_many.stderr
    not_a_number = run("next", rounds="five")
    assert not_a_number.returncode == 2
    assert "error: rounds='five' is not a whole number" in not_a_number.stderr


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_two_rounds_of_one_run_never_overlap(scenario):
    spec = workflow_template(scenario)["spec"]
    assert spec["synchronization"] == {
        "mutexes": [{"name": "codeq-run-{{workflow.parameters.run}}"}]
    }


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_argo_expressions_are_escaped_through_helm_and_known(scenario):
    text = render(scenario)["codeq/templates/workflowtemplate.yaml"]
    found = set(re.findall(r"\{\{\s*([^{}]*?)\s*\}\}", text))
    assert found == ARGO_EXPRESSIONS
    for stage, manifest in raw_manifests(scenario).items():
        assert "{{inputs.parameters.round}}" in manifest, stage
        assert "{{workflow.parameters.round}}" not in manifest, "stages use the resolved round"
        assert "{{workflow.parameters.run}}" in manifest, stage
        assert "{{workflow.name}}" in manifest, stage
    for name, text in render(scenario).items():
        if name != "codeq/templates/workflowtemplate.yaml":
            assert "{{" not in text.replace("{{`", ""), name


# ----------------------------------------------------------------------------- stage steps


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_a_retried_step_adopts_its_job_instead_of_creating_a_second(scenario):
    """Fixed Job names (workflow + stage) and `apply`: the retry finds the Job it made."""
    by_name = templates(scenario)
    values = effective_values(scenario)
    creating = {
        yaml.safe_load(t["resource"]["manifest"])["metadata"]["labels"]["codeq.io/stage"]: t
        for t in by_name.values()
        if t.get("resource", {}).get("action") in ("create", "apply")
        and yaml.safe_load(t["resource"]["manifest"])["kind"] == "Job"
    }
    assert sorted(creating) == sorted(scenario_stages(scenario))
    for stage, start in creating.items():
        resource = start["resource"]
        assert resource["action"] == "apply"
        assert resource["setOwnerReference"] is True
        job = yaml.safe_load(resource["manifest"])
        # One Job per stage and round: a later round of the workflow never adopts an earlier one's.
        assert (
            job["metadata"]["name"]
            == f"{{{{workflow.name}}}}-r{{{{inputs.parameters.round}}}}-{stage}"
        )
        assert "generateName" not in job["metadata"]
        assert "{{retries}}" not in resource["manifest"]
        assert "suspend" not in job["spec"], "Kueue owns spec.suspend; a re-apply must not flip it"
        assert "retryStrategy" in start, f"{stage}: no retry of a lost executor"
        assert start["retryStrategy"]["retryPolicy"] == "OnError"
        assert start["retryStrategy"]["limit"] == str(values["workflow"]["stepRetries"])
    finish = by_name["finish"]
    assert finish["container"]["command"][:3] == [
        "python",
        "/etc/codeq-scripts/watch_job.py",
        "{{inputs.parameters.job}}",
    ]
    # A lost pod (Error) or exit 75 (its node drained while the round goes on) is retried and
    # watches the same Job again; exit 1 (the Job failed) is final.
    retry = finish["retryStrategy"]
    assert retry["retryPolicy"] == "Always"
    assert retry["expression"] == 'lastRetry.status == "Error" || asInt(lastRetry.exitCode) == 75'
    assert retry["limit"] == str(values["workflow"]["stepRetries"])
    # Long enough names still fit: Indexed pods are named <job>-<index>-<suffix> (<= 63).
    longest = max(len(f"{WORKFLOW_NAME}-r999-{stage}") for stage in [*STAGES, VERIFIER])
    assert longest + len("-999-abcde") <= 63


def go_duration_seconds(text: str) -> float:
    units = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1, "m": 60, "h": 3600}
    parts = re.findall(r"([0-9]+(?:\.[0-9]+)?)(ns|us|ms|s|m|h)", text)
    assert "".join(n + u for n, u in parts) == text, text
    return sum(float(n) * units[u] for n, u in parts)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_start_only_applies_the_job_and_finish_waits_with_the_start_timeout(scenario):
    """Argo's resource steps log every requirement of their conditions at every poll (about 26
    lines every 5 s); the waiting is the finish script's, which logs changes only."""
    values = effective_values(scenario)
    for stage in stages_of(values):
        start = templates(scenario)[f"{stage}-start"]
        assert not {"successCondition", "failureCondition"} & set(start["resource"]), stage
        assert "timeout" not in start
    finish = templates(scenario)["finish"]
    assert "timeout" not in finish, "the Job's own deadline bounds a run"
    seconds = go_duration_seconds(values["workflow"]["startTimeout"])
    assert finish["container"]["command"][3:] == ["{{workflow.name}}", str(math.ceil(seconds))]


@pytest.mark.parametrize(
    ("text", "seconds"), [("6h", 21600), ("90m", 5400), ("1h30m15s", 5415), ("1.5h", 5400)]
)
def test_the_start_timeout_is_read_as_a_go_duration(text, seconds):
    finish = templates("default", json.dumps({"workflow": {"startTimeout": text}}))["finish"]
    assert finish["container"]["command"][-1] == str(seconds) == str(int(go_duration_seconds(text)))


# ----------------------------------------------------------------------------- stage Jobs


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_collect_is_an_indexed_job_with_per_index_retries(scenario):
    values = effective_values(scenario)
    shards = values["stages"]["collect"]["shards"]
    spec = stage_jobs(scenario)["collect"]["spec"]
    assert spec["completionMode"] == "Indexed"
    assert spec["completions"] == spec["parallelism"] == shards
    assert spec["backoffLimitPerIndex"] == values["stages"]["collect"]["backoffLimitPerIndex"]
    assert "backoffLimit" not in spec
    assert spec["podReplacementPolicy"] == "Failed"
    rules = spec["podFailurePolicy"]["rules"]
    assert rules[0] == {
        "action": "Ignore",
        "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
    }
    assert rules[1]["action"] == "FailIndex"
    assert rules[1]["onExitCodes"] == {"containerName": "main", "operator": "In", "values": [2, 3]}
    env = {e["name"]: e.get("value") for e in spec["template"]["spec"]["containers"][0]["env"]}
    assert env["JOB_COMPLETION_COUNT"] == str(shards)
    if values["stages"]["collect"]["maxFailedIndexes"] is not None:
        assert spec["maxFailedIndexes"] == values["stages"]["collect"]["maxFailedIndexes"]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_evaluate_is_one_pod_or_an_indexed_job_of_its_shards(scenario):
    """stages.evaluate.shards above 1: an Indexed Job with that many completions and pods at
    once, JOB_COMPLETION_COUNT for the stage, each shard retried on its own and the first shard
    that fails for good failing the Job (the merge needs them all); 1: the plain Job it was."""
    values = effective_values(scenario)
    conf = values["stages"]["evaluate"]
    spec = stage_jobs(scenario)["evaluate"]["spec"]
    env = {e["name"]: e.get("value") for e in spec["template"]["spec"]["containers"][0]["env"]}
    rule = spec["podFailurePolicy"]["rules"][1]
    if conf["shards"] == 1:
        assert "completionMode" not in spec and "JOB_COMPLETION_COUNT" not in env
        assert spec["completions"] == spec["parallelism"] == 1
        assert spec["backoffLimit"] == conf["backoffLimit"] and rule["action"] == "FailJob"
        return
    assert spec["completionMode"] == "Indexed"
    assert spec["completions"] == spec["parallelism"] == conf["shards"]
    assert env["JOB_COMPLETION_COUNT"] == str(conf["shards"])
    assert spec["backoffLimitPerIndex"] == conf["backoffLimit"] and "backoffLimit" not in spec
    assert spec["maxFailedIndexes"] == 0
    assert rule["action"] == "FailIndex"


def test_a_scenario_shards_evaluate():
    """Some scenario (the twin's among them) renders evaluate as an Indexed Job."""
    sharded = [s for s in SCENARIOS if effective_values(s)["stages"]["evaluate"]["shards"] > 1]
    assert "twin" in sharded and len(sharded) >= 2, sharded


def test_evaluate_shards_set_on_the_default_install():
    spec = stage_jobs("default", json.dumps({"stages": {"evaluate": {"shards": 3}}}))["evaluate"]
    assert spec["spec"]["completionMode"] == "Indexed"
    assert spec["spec"]["completions"] == spec["spec"]["parallelism"] == 3


def expected_sandbox_profile(values: dict[str, Any]) -> dict[str, str]:
    """The sandbox containers' seccompProfile: sandbox.seccompProfile, an empty Localhost path
    filled in with where sandbox.seccompInstall puts the chart's profile."""
    profile = {k: v for k, v in values["sandbox"]["seccompProfile"].items() if v}
    if profile["type"] == "Localhost" and "localhostProfile" not in profile:
        method = values["sandbox"]["seccompInstall"]["method"]
        folder = {"daemonset": f"codeq/{NAMESPACE}", "operator": f"operator/{NAMESPACE}"}[method]
        profile["localhostProfile"] = f"{folder}/{RELEASE}-sandbox.json"
    return profile


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_job_has_placement_gpus_deadlines_and_restricted_security(scenario):
    values = effective_values(scenario)
    for stage, job in stage_jobs(scenario).items():
        conf = values["stages"][stage]
        pool = values["pools"][conf["pool"]]
        spec = job["spec"]
        pod = spec["template"]["spec"]
        (container,) = pod["containers"]
        assert spec["activeDeadlineSeconds"] == conf["activeDeadlineSeconds"]
        assert spec["ttlSecondsAfterFinished"] == values["jobs"]["ttlSecondsAfterFinished"]
        if stage != "collect" and conf.get("shards", 1) == 1:
            assert spec["backoffLimit"] == conf["backoffLimit"]
            assert spec["podFailurePolicy"]["rules"][1]["action"] == "FailJob"
        selector = pool["nodeSelector"] if conf["nodeSelector"] is None else conf["nodeSelector"]
        tolerations = pool["tolerations"] if conf["tolerations"] is None else conf["tolerations"]
        assert pod.get("nodeSelector", {}) == selector
        assert pod.get("tolerations", []) == tolerations
        assert container["resources"]["limits"]["nvidia.com/gpu"] == conf["gpus"]
        image = values["images"]["train" if stage in TRAIN_IMAGE_STAGES else "infer"]
        assert container["image"].startswith(image["repository"])
        if image["digest"]:
            assert container["image"] == f"{image['repository']}@{image['digest']}"
        assert pod["restartPolicy"] == "Never"
        assert pod["automountServiceAccountToken"] is False
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert pod["serviceAccountName"].endswith("-jobs")
        sc = container["securityContext"]
        assert sc["runAsNonRoot"] is True and sc["runAsUser"] >= 10000
        assert sc["readOnlyRootFilesystem"] is True
        assert sc["allowPrivilegeEscalation"] is False and sc["privileged"] is False
        assert sc["capabilities"] == {"drop": ["ALL"]}
        if stage in SANDBOX_STAGES:
            assert sc["seccompProfile"] == expected_sandbox_profile(values)
        else:
            assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
        labels = spec["template"]["metadata"]["labels"]
        assert labels["workflows.argoproj.io/workflow"] == WORKFLOW_NAME
        assert labels["codeq.io/round"] == ARGO_SAMPLE["inputs.parameters.round"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert volumes["dshm"]["emptyDir"]["medium"] == "Memory"
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        assert mounts["/dev/shm"] == "dshm" and mounts["/etc/codeq"] == "config"
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["CODEQ_CONFIG_FILE"] == "/etc/codeq/config.yaml"
        assert env["CODEQ_STORE__ROUND"] == ARGO_SAMPLE["inputs.parameters.round"]
        assert env["CODEQ_STORE__RUN"] == ARGO_SAMPLE["workflow.parameters.run"]
        assert env["CODEQ_STORE__URI"] == values["store"]["uri"]
        assert not [e for e in container["env"] if "secretKeyRef" in e.get("valueFrom", {})]
        if values["s3Credentials"]["mode"] == "secret":
            assert "s3-credentials" in volumes
            assert not [k for k in env if k.startswith("AWS_SECRET")], "keys only as a file"
        else:
            assert "s3-credentials" not in volumes
            assert "AWS_SHARED_CREDENTIALS_FILE" not in env


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_argo_logs_finds_the_stage_container(scenario):
    """`argo logs` lists the workflow's pods by label and reads the container named main."""
    for stage, job in stage_jobs(scenario).items():
        pod = job["spec"]["template"]
        assert [c["name"] for c in pod["spec"]["containers"]] == ["main"], stage
        assert pod["metadata"]["labels"]["workflows.argoproj.io/workflow"] == WORKFLOW_NAME
        rule = job["spec"]["podFailurePolicy"]["rules"][1]
        assert rule["onExitCodes"]["containerName"] == "main"


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_stages_start_through_the_image_entrypoint_so_sigterm_reaches_python(scenario):
    values = effective_values(scenario)
    for stage, job in stage_jobs(scenario).items():
        pod = job["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        assert "command" not in container, f"{stage}: a command would bypass the entrypoint"
        assert container["args"] == ["python", "-m", f"jobs.{stage}"]
        assert (
            pod["terminationGracePeriodSeconds"]
            == (values["jobs"]["terminationGracePeriodSeconds"])
        )


def test_cpu_stages_run_on_the_cpu_pool_and_gpu_stages_on_their_gpu_pools():
    jobs = stage_jobs("default")
    for stage, job in jobs.items():
        pod = job["spec"]["template"]["spec"]
        gpus = pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]
        tolerated = {t["key"] for t in pod.get("tolerations", [])}
        if stage in CPU_STAGES:
            assert pod["nodeSelector"] == {"codeq.io/pool": "cpu"}, stage
            assert gpus == 0 and "nvidia.com/gpu" not in tolerated, stage
        else:
            assert gpus == 1 and "nvidia.com/gpu" in tolerated, stage
    assert jobs["train"]["spec"]["template"]["spec"]["nodeSelector"] == {"codeq.io/pool": "train"}
    for stage in ("collect", "evaluate"):
        assert jobs[stage]["spec"]["template"]["spec"]["nodeSelector"] == {"codeq.io/pool": "infer"}
    # The workflow's own pods (executors, round number, exit handler) stay off the GPU pools.
    assert workflow_template("default")["spec"]["nodeSelector"] == {"codeq.io/pool": "cpu"}
    # A stage can be placed on its own: the kueue scenario moves train by label.
    train = stage_jobs("kueue")["train"]["spec"]["template"]["spec"]
    assert train["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert train["priorityClassName"] == "batch-critical"


def test_an_unknown_pool_fails_the_render_with_a_clear_message():
    with pytest.raises(helm.HelmError, match='pool "h200" is not defined under `pools`'):
        render_with("default", stages={"train": {"pool": "h200"}})


def test_kind_pods_carry_no_node_selector():
    """kind's one node has no pool labels: null removes the defaults (an empty map would not)."""
    for stage, job in stage_jobs("kind").items():
        assert "nodeSelector" not in job["spec"]["template"]["spec"], stage
    assert "nodeSelector" not in workflow_template("kind")["spec"]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_emptydir_sizes_are_per_stage_and_fit_the_stage_and_common_nodes(scenario):
    values = effective_values(scenario)
    for stage, job in stage_jobs(scenario).items():
        pod = job["spec"]["template"]["spec"]
        volumes = {v["name"]: v["emptyDir"] for v in pod["volumes"] if "emptyDir" in v}
        disk = sum(parse_quantity(v["sizeLimit"]) for v in volumes.values() if "medium" not in v)
        resources = pod["containers"][0]["resources"]
        limit = parse_quantity(resources["limits"]["ephemeral-storage"])
        assert disk <= limit, (
            f"{stage}: emptyDirs of {disk / 1024**3:.0f}Gi, limit {limit / 1024**3:.0f}Gi"
        )
        shm = parse_quantity(volumes["dshm"]["sizeLimit"])
        assert shm < parse_quantity(resources["limits"]["memory"]), stage
        if scenario == "default":
            request = parse_quantity(resources["requests"]["ephemeral-storage"])
            assert request <= COMMON_NODE_EPHEMERAL_GI * 1024**3, stage
            assert disk <= COMMON_NODE_EPHEMERAL_GI * 1024**3, stage
        sizes = values["stages"][stage].get("volumes")
        assert sizes, f"{stage}: sizes are per stage (stages.{stage}.volumes)"
        expected = {"scratch": sizes["scratch"], "tmp": sizes["tmp"], "dshm": sizes["shm"]}
        # An extra volume mounted at one of these paths replaces the chart's emptyDir there.
        kept = [name for name in expected if name in volumes]
        assert {name: volumes[name]["sizeLimit"] for name in kept} == {
            name: expected[name] for name in kept
        }
        mounts = {m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
        assert {"/scratch", "/tmp", "/dev/shm"} <= mounts, stage


# Qwen2.5-Coder-7B-Instruct's config.json: the shapes the stages' disk use is computed from.
QWEN_7B = {
    "vocab_size": 152064,
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "tie_word_embeddings": False,
}
# Qwen2.5-Coder-0.5B-Instruct's config.json (the first run's model, ci/first-run-values.yaml):
# 24 layers, hidden 896, 14 query and 2 KV heads, the output layer tied to the embeddings.
QWEN_05B = {
    "vocab_size": 151936,
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "tie_word_embeddings": True,
}
# Tokenizer and config files next to the weights (tokenizer.json 7.0 MB, vocab.json 2.8 MB,
# merges.txt 1.7 MB, the rest a few kB); each merged folder and each adapter has a copy.
TOKENIZER_FILES = 12_000_000
# A run of this many promoted rounds: each one adds an adapter every later stage downloads.
PROMOTED_ADAPTERS = 10
# Room for what is not weights (tasks, trajectories, pairs, evaluation trees, logs): an
# allowance, not a measurement; these files do not grow with the model.
WORK_FILES = {"prepare": 1e9, "collect": 1e9, "pairs": 1e9, "train": 1e9, "evaluate": 1e9}
WORK_FILES |= {"promote": 0.5e9, "report": 0.5e9, VERIFIER: 1e9}


def linear_shapes(config: dict[str, int]) -> dict[str, tuple[int, int]]:
    """(in, out) of each linear layer of one decoder layer (Qwen2/Llama layout)."""
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    kv = hidden // config["num_attention_heads"] * config["num_key_value_heads"]
    return {
        "q_proj": (hidden, hidden),
        "k_proj": (hidden, kv),
        "v_proj": (hidden, kv),
        "o_proj": (hidden, hidden),
        "gate_proj": (hidden, inter),
        "up_proj": (hidden, inter),
        "down_proj": (inter, hidden),
    }


def weight_bytes(config: dict[str, int], bytes_per_param: int = 2) -> int:
    """The safetensors weights of the model in bf16: embeddings, attention (q, k, v with
    biases), MLP, norms and the untied output layer."""
    shapes = linear_shapes(config)
    hidden = config["hidden_size"]
    per_layer = sum(i * o for i, o in shapes.values())
    per_layer += shapes["q_proj"][1] + shapes["k_proj"][1] + shapes["v_proj"][1]  # biases
    per_layer += 2 * hidden  # the two RMSNorms
    embeddings = config["vocab_size"] * hidden * (1 if config["tie_word_embeddings"] else 2)
    params = config["num_hidden_layers"] * per_layer + embeddings + hidden
    return params * bytes_per_param


def adapter_bytes(config: dict[str, int], rank: int, modules: list[str]) -> int:
    """A LoRA adapter's safetensors in fp32 (A: in x r, B: r x out per adapted layer) plus its
    tokenizer files."""
    shapes = linear_shapes(config)
    per_layer = sum(rank * (shapes[m][0] + shapes[m][1]) for m in modules)
    return config["num_hidden_layers"] * per_layer * 4 + TOKENIZER_FILES


def peak_scratch(
    stage: str,
    train: dict[str, Any],
    model_cached: bool,
    shapes: dict[str, Any] = QWEN_7B,
    verifier: dict[str, Any] | None = None,
) -> float:
    """Bytes on a stage's /scratch at its peak, a run of PROMOTED_ADAPTERS promoted rounds in:
    the base model downloaded into the Hugging Face cache (unless the model cache serves it),
    one merged folder per policy the stage loads (collect and train: the promoted lineage;
    evaluate: it and the candidate, which adds this round's adapter), every adapter of those
    lineages, and the stage's work files. `shapes`: the model's config.json (default the 7B).
    `verifier` (verifier_disk; None: the round trains no verifier): the stages in its `stages`
    hold its LoRA too (the verifier stage writes it on the base model and evaluate loads it;
    pairs reads the scores the verifier stage wrote, no model)."""
    model = weight_bytes(shapes) + TOKENIZER_FILES
    adapter = adapter_bytes(shapes, train["lora_r"], train["target_modules"])
    policies = {"collect": 1, "train": 1, "evaluate": 2}.get(stage, 0)
    adapters = PROMOTED_ADAPTERS + (1 if stage in ("train", "evaluate") else 0)
    weights = 0.0
    if policies:
        weights = (0 if model_cached else model) + policies * model + adapters * adapter
    if verifier and stage in verifier["stages"]:
        if not policies:
            weights += 0 if model_cached else model
        weights += adapter_bytes(shapes, verifier["lora_r"], verifier["target_modules"])
    return weights + WORK_FILES[stage]


def verifier_disk(values: dict[str, Any]) -> dict[str, Any] | None:
    """The chart config's verifier settings (codeq's defaults under them) and the stages that
    hold its weights on /scratch; None when the rounds train no verifier."""
    from codeq.config import load_config

    config = values["config"]
    if VERIFIER not in stages_of(values):
        return None
    settings = load_config(None).verifier.model_dump()
    settings.update(config.get("verifier", {}))
    return {**settings, "stages": {VERIFIER, "evaluate"}}


def scratch_capacity(pod: dict[str, Any]) -> float:
    """What /scratch holds: its emptyDir's sizeLimit, or the claim of an ephemeral volume."""
    (container,) = pod["containers"]
    (name,) = [m["name"] for m in container["volumeMounts"] if m["mountPath"] == "/scratch"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == name]
    if "emptyDir" in volume:
        return parse_quantity(volume["emptyDir"]["sizeLimit"])
    claim = volume["ephemeral"]["volumeClaimTemplate"]["spec"]
    return parse_quantity(claim["resources"]["requests"]["storage"])


def test_the_7b_sizes_are_the_known_ones():
    """Qwen2.5-Coder-7B-Instruct has 7.62 B parameters: 15.23 GB of bf16 safetensors."""
    assert weight_bytes(QWEN_7B) == 15_231_233_024
    assert adapter_bytes(QWEN_7B, 32, list(linear_shapes(QWEN_7B))) == 334_961_408


@pytest.mark.parametrize("scenario", ["default", "irsa", "kueue", "gke", "karpenter", "critique"])
def test_every_stage_has_the_disk_its_7b_peak_needs(scenario):
    """Each stage's /scratch holds its peak at the 7B's shapes (the base model, the merged
    policies, the adapters of a 10-round lineage, its work files), and its ephemeral-storage
    limit holds its disk emptyDirs."""
    from codeq.config import load_config

    values = effective_values(scenario)
    assert "7B" in values["config"]["policy"]["model"], "a scenario of the 7B"
    cached = values["config"]["policy"]["model"].startswith("/models/")
    assert (
        not cached
        or values["model"]["cache"]["existingClaim"]
        or values["model"]["cache"]["create"]
    )
    train = load_config(None).train.model_dump()
    train.update(values["config"].get("train", {}))
    for stage, job in stage_jobs(scenario).items():
        pod = job["spec"]["template"]["spec"]
        need = peak_scratch(stage, train, cached, verifier=verifier_disk(values))
        have = scratch_capacity(pod)
        assert have >= need, (
            f"{scenario}/{stage}: /scratch holds {have / 1e9:.1f} GB, its 7B peak is "
            f"{need / 1e9:.1f} GB"
        )


def test_the_disk_table_in_the_docs_is_the_computed_one():
    text = (REPO / "docs" / "cluster.md").read_text().split("### Disk", 1)[1].split("\n## ")[0]
    train = {"lora_r": 32, "target_modules": list(linear_shapes(QWEN_7B))}
    values = effective_values("default")
    # The verifier's row: what its stage needs once config.verifier.enabled adds it.
    verifier = verifier_disk(deep_merge(values, {"config": {"verifier": {"enabled": True}}}))
    assert verifier
    verifier["stages"] = {VERIFIER}
    for stage in values["stages"]:
        row = re.search(rf"^\| {stage} [^\n]*$", text, flags=re.M)
        assert row, stage
        cells = [c.strip() for c in row.group(0).strip("|").split("|")]
        for cached, cell in ((False, cells[1]), (True, cells[2])):
            need = peak_scratch(stage, train, cached, verifier=verifier)
            assert cell == f"{need / 1e9:.1f} GB", (stage, cells)
        assert cells[3] == values["stages"][stage]["volumes"]["scratch"], (stage, cells)


SECCOMP_FILE = CHART / "files" / "seccomp" / "codeq-sandbox.json"


def test_the_sandbox_profile_is_one_file_installed_on_the_sandbox_nodes_by_a_daemonset():
    """By default the sandbox stages use the chart's Localhost profile, which a DaemonSet writes,
    byte for byte from files/seccomp/codeq-sandbox.json (the file the image tests use too), to the
    path under the kubelet's seccomp root that the stages name; it runs on the nodes of every
    sandbox stage (their pools' selectors ORed, their tolerations joined) and nowhere else."""
    found = objects("default")
    values = effective_values("default")
    (config_map,) = [
        o for o in found if o["kind"] == "ConfigMap" and "sandbox" in o["metadata"]["name"]
    ]
    ((file_name, content),) = config_map["data"].items()
    assert content.encode() == SECCOMP_FILE.read_bytes()
    (daemonset,) = [o for o in found if o["kind"] == "DaemonSet"]
    pod = daemonset["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["profile"]["configMap"]["name"] == config_map["metadata"]["name"]
    folder = volumes["node-seccomp"]["hostPath"]["path"]
    root = values["sandbox"]["seccompInstall"]["kubeletSeccompRoot"]
    for stage, job in stage_jobs("default").items():
        sc = job["spec"]["template"]["spec"]["containers"][0]["securityContext"]
        if stage in SANDBOX_STAGES:
            assert sc["seccompProfile"]["type"] == "Localhost"
            assert f"{root}/{sc['seccompProfile']['localhostProfile']}" == f"{folder}/{file_name}"
    (install,) = pod["initContainers"]
    assert {e["name"]: e["value"] for e in install["env"]}["PROFILE"] == file_name
    assert install["securityContext"]["runAsUser"] == 0
    assert install["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert install["securityContext"]["allowPrivilegeEscalation"] is False
    assert install["securityContext"]["readOnlyRootFilesystem"] is True
    (main,) = pod["containers"]
    assert main["securityContext"]["runAsNonRoot"] is True
    assert next(m for m in main["volumeMounts"] if m["name"] == "node-seccomp")["readOnly"]
    # A new profile rolls the pods.
    sha = daemonset["spec"]["template"]["metadata"]["annotations"]["codeq.io/seccomp-sha256"]
    assert sha == hashlib.sha256(SECCOMP_FILE.read_bytes()).hexdigest()
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    pools = {values["stages"][s]["pool"] for s in SANDBOX_STAGES}
    assert sorted(map(json.dumps, terms["nodeSelectorTerms"])) == sorted(
        json.dumps(
            {"matchExpressions": [{"key": "codeq.io/pool", "operator": "In", "values": [p]}]}
        )
        for p in pools
    )
    expected = [t for p in sorted(pools) for t in values["pools"][p]["tolerations"]]
    assert sorted(map(json.dumps, pod["tolerations"])) == sorted(set(map(json.dumps, expected)))
    # kind: one unlabelled node, so no affinity at all.
    (kind,) = [o for o in objects("kind") if o["kind"] == "DaemonSet"]
    assert "affinity" not in kind["spec"]["template"]["spec"]


def test_unconfined_is_the_fallback_and_installs_nothing():
    found = objects("default", json.dumps({"sandbox": {"seccompProfile": {"type": "Unconfined"}}}))
    assert not [o for o in found if o["kind"] in ("DaemonSet", "SeccompProfile")]
    jobs = stage_jobs(
        "default", json.dumps({"sandbox": {"seccompProfile": {"type": "Unconfined"}}})
    )
    for stage in SANDBOX_STAGES:
        sc = jobs[stage]["spec"]["template"]["spec"]["containers"][0]["securityContext"]
        assert sc["seccompProfile"] == {"type": "Unconfined"}
        assert sc["capabilities"] == {"drop": ["ALL"]} and sc["allowPrivilegeEscalation"] is False


def test_a_localhost_profile_nobody_installs_must_be_named():
    extra = {"sandbox": {"seccompInstall": {"method": "none"}}}
    with pytest.raises(helm.HelmError, match="localhostProfile"):
        objects("default", json.dumps(extra))
    extra["sandbox"]["seccompProfile"] = {"type": "Localhost", "localhostProfile": "mine.json"}
    found = objects("default", json.dumps(extra))
    assert not [o for o in found if o["kind"] in ("DaemonSet", "SeccompProfile")]
    sc = stage_jobs("default", json.dumps(extra))["collect"]["spec"]["template"]["spec"][
        "containers"
    ][0]["securityContext"]
    assert sc["seccompProfile"] == {"type": "Localhost", "localhostProfile": "mine.json"}


def test_apparmor_is_only_set_where_asked_for():
    """Nodes without AppArmor reject pods naming a RuntimeDefault or Localhost profile; sandbox
    stages use Unconfined (accepted everywhere), the others none unless jobs.appArmorProfile."""
    for stage, job in stage_jobs("default").items():
        pod = job["spec"]["template"]["spec"]
        sc = pod["containers"][0]["securityContext"]
        assert "appArmorProfile" not in pod["securityContext"]
        if stage in SANDBOX_STAGES:
            assert sc["appArmorProfile"] == {"type": "Unconfined"}
        else:
            assert "appArmorProfile" not in sc, stage
    for pod in helper_pods("default").values():
        assert "appArmorProfile" not in pod["spec"]["containers"][0]["securityContext"]
    irsa = stage_jobs("irsa")["pairs"]["spec"]["template"]["spec"]["containers"][0]
    assert irsa["securityContext"]["appArmorProfile"] == {"type": "RuntimeDefault"}


# ----------------------------------------------------------------------------- operator features


def test_kueue_queue_and_priorities_are_optional():
    for stage, job in stage_jobs("default").items():
        labels = job["metadata"]["labels"]
        assert not [k for k in labels if k.startswith("kueue.x-k8s.io/")], stage
        assert "priorityClassName" not in job["spec"]["template"]["spec"]
    for stage, job in stage_jobs("kueue").items():
        assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "codeq"
        assert job["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] == "research"
        expected = "batch-critical" if stage == "train" else "batch-high"
        assert job["spec"]["template"]["spec"]["priorityClassName"] == expected
    assert templates("kueue")["finish"]["container"]["command"][-1] == str(12 * 3600)


KUEUE_EXAMPLE = REPO / "docs" / "kueue" / "queues.yaml"


def tolerated(taint: dict[str, str], tolerations: list[dict[str, str]]) -> bool:
    """Kubernetes' toleration match (the part Kueue uses for NoSchedule/NoExecute taints)."""
    for toleration in tolerations:
        if toleration.get("effect") and toleration["effect"] != taint["effect"]:
            continue
        if not toleration.get("key") and toleration.get("operator") == "Exists":
            return True
        if toleration.get("key") != taint["key"]:
            continue
        if toleration.get("operator") == "Exists" or toleration.get("value") == taint.get("value"):
            return True
    return False


def flavor_fits_pod(flavor: dict[str, Any], pod: dict[str, Any], keys: set[str]) -> bool:
    """Kueue's checkFlavorForPodSets: taints tolerated, and the pod's nodeSelector and required
    node affinity, restricted to `keys`, matched against the flavor's nodeLabels."""
    labels = flavor["spec"].get("nodeLabels", {})
    taints = flavor["spec"].get("nodeTaints", [])
    if not all(tolerated(t, pod.get("tolerations", [])) for t in taints):
        return False
    for key, value in pod.get("nodeSelector", {}).items():
        if key in keys and labels.get(key) != value:
            return False
    affinity = pod.get("affinity", {}).get("nodeAffinity", {})
    terms = affinity.get("requiredDuringSchedulingIgnoredDuringExecution", {})
    kept = [
        [e for e in term.get("matchExpressions", []) if e["key"] in keys]
        for term in terms.get("nodeSelectorTerms", [])
    ]
    if not kept or any(not term for term in kept):
        return True
    operators = {
        "In": lambda e: labels.get(e["key"]) in e["values"],
        "NotIn": lambda e: labels.get(e["key"]) not in e["values"],
        "Exists": lambda e: e["key"] in labels,
        "DoesNotExist": lambda e: e["key"] not in labels,
    }
    return any(all(operators[e["operator"]](e) for e in term) for term in kept)


def job_requests(job: dict[str, Any]) -> dict[str, float]:
    """What Kueue counts for a Job: per pod, requests (limits where a resource has no request,
    as the API server defaults them), times parallelism."""
    (container,) = job["spec"]["template"]["spec"]["containers"]
    resources = container["resources"]
    per_pod = {**resources.get("limits", {}), **resources.get("requests", {})}
    pods = job["spec"].get("parallelism", 1)
    return {name: parse_quantity(value) * pods for name, value in per_pod.items()}


def test_the_kueue_example_admits_every_stage_on_its_own_flavor():
    """docs/kueue/queues.yaml against the kueue scenario's Jobs, as Kueue assigns flavors: every
    requested resource covered (nvidia.com/gpu: 0 included), the first flavor in order whose
    labels and taints fit the Job and whose quota holds its requests. Both of Kueue's ways of
    choosing which label keys count (each flavor's own, newer releases; all of the resource
    group's, older ones) give the same flavor."""
    docs = [d for d in yaml.safe_load_all(KUEUE_EXAMPLE.read_text()) if d]
    kinds = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    values = effective_values("kueue")
    queue = values["scheduling"]["kueue"]
    local = kinds[("LocalQueue", queue["queueName"])]
    assert local["metadata"]["namespace"] == NAMESPACE
    (cluster_queue,) = [d for d in docs if d["kind"] == "ClusterQueue"]
    assert local["spec"]["clusterQueue"] == cluster_queue["metadata"]["name"]
    assert ("WorkloadPriorityClass", queue["priorityClass"]) in kinds
    (group,) = cluster_queue["spec"]["resourceGroups"]
    covered = set(group["coveredResources"])
    flavors = [kinds[("ResourceFlavor", f["name"])] for f in group["flavors"]]
    quotas = {
        f["name"]: {r["name"]: parse_quantity(r["nominalQuota"]) for r in f["resources"]}
        for f in group["flavors"]
    }
    union = {key for flavor in flavors for key in flavor["spec"].get("nodeLabels", {})}
    expected = {"collect": "infer", "evaluate": "infer", "train": "h100-train"}
    expected[VERIFIER] = "h100-train"  # placed where train is
    for stage, job in stage_jobs("kueue").items():
        requests = job_requests(job)
        assert set(requests) <= covered, (stage, set(requests) - covered)
        assert "nvidia.com/gpu" in requests, "the CPU stages ask for nvidia.com/gpu: 0 too"
        pod = job["spec"]["template"]["spec"]
        picked = []
        for keys_of in (lambda f: set(f["spec"].get("nodeLabels", {})), lambda f: union):
            fits = [
                f["metadata"]["name"]
                for f in flavors
                if flavor_fits_pod(f, pod, keys_of(f))
                and all(v <= quotas[f["metadata"]["name"]][r] for r, v in requests.items())
            ]
            picked.append(fits[0] if fits else None)
        assert picked[0] == picked[1] == expected.get(stage, "cpu"), (stage, picked)


def test_huggingface_token_is_a_mounted_file():
    for _stage, job in stage_jobs("kueue").items():
        pod = job["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["HF_TOKEN_PATH"] == "/var/run/secrets/codeq/huggingface/token"
        (volume,) = [v for v in pod["volumes"] if v["name"] == "huggingface-token"]
        assert volume["secret"]["secretName"] == "codeq-hf-token"
        assert volume["secret"]["items"] == [{"key": "token", "path": "token"}]
        assert "HF_TOKEN" not in env
    for job in stage_jobs("default").values():
        env = {e["name"] for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
        assert "HF_TOKEN_PATH" not in env


def test_model_cache_is_mounted_read_only_in_every_stage():
    (claim,) = [o for o in objects("kueue") if o["kind"] == "PersistentVolumeClaim"]
    assert claim["metadata"]["name"] == "codeq-models"
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    assert claim["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    for scenario, name in (("kueue", "codeq-models"), ("irsa", "codeq-models")):
        for _stage, job in stage_jobs(scenario).items():
            pod = job["spec"]["template"]["spec"]
            (volume,) = [v for v in pod["volumes"] if v["name"] == "models"]
            assert volume["persistentVolumeClaim"] == {"claimName": name, "readOnly": True}
            (mount,) = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "models"]
            assert mount["mountPath"] == "/models" and mount["readOnly"] is True
    assert not [o for o in objects("irsa") if o["kind"] == "PersistentVolumeClaim"]
    for job in stage_jobs("default").values():
        assert "models" not in {v["name"] for v in job["spec"]["template"]["spec"]["volumes"]}


def test_model_download_job_fills_the_cache_once():
    (job,) = [o for o in objects("kueue") if o["kind"] == "Job"]
    annotations = job["metadata"]["annotations"]
    assert annotations["helm.sh/hook"] == "post-install,post-upgrade"
    assert "hook-succeeded" in annotations["helm.sh/hook-delete-policy"]
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["args"] == ["python", "/etc/codeq-scripts/download_models.py"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert json.loads(env["CODEQ_MODEL_REPOS"]) == [
        "Qwen/Qwen2.5-Coder-7B-Instruct",
        "meta-llama/Llama-3.1-8B-Instruct@main",
    ]
    assert env["HF_TOKEN_PATH"] == "/var/run/secrets/codeq/huggingface/token"
    (models,) = [m for m in container["volumeMounts"] if m["name"] == "models"]
    assert "readOnly" not in models, "the download writes into the cache"
    assert job["spec"]["template"]["metadata"]["labels"]["codeq.io/job"] == "true"
    with pytest.raises(helm.HelmError, match="needs a cache"):
        render_with("default", model={"download": {"enabled": True, "repos": ["a/b"]}})


def test_model_download_script_puts_each_repository_under_models(tmp_path):
    """The script shipped in the chart's ConfigMap, run with a recording stand-in for
    huggingface_hub (the Hub itself is not reachable from tests)."""
    import subprocess
    import sys

    (scripts,) = [o for o in objects("kueue") if o["metadata"]["name"] == "codeq-scripts"]
    (tmp_path / "download_models.py").write_text(scripts["data"]["download_models.py"])
    fake = tmp_path / "fake" / "huggingface_hub"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(
        "import json, os\n"
        "def snapshot_download(repo_id, revision, local_dir):\n"
        "    with open(os.environ['CALLS'], 'a') as f:\n"
        "        f.write(json.dumps([repo_id, revision, local_dir]) + '\\n')\n"
    )
    calls = tmp_path / "calls.jsonl"

    def run(repos: list[str]) -> subprocess.CompletedProcess:
        env = {
            "PATH": os.environ["PATH"],
            "PYTHONPATH": str(tmp_path / "fake"),
            "CODEQ_MODEL_REPOS": json.dumps(repos),
            "MODELS_DIR": "/models",
            "CALLS": str(calls),
        }
        return subprocess.run(
            [sys.executable, str(tmp_path / "download_models.py")],
            env=env,
            capture_output=True,
            text=True,
        )

    assert run(["Qwen/Qwen2.5-Coder-7B-Instruct", "org/m@v1.0"]).returncode == 0
    assert [json.loads(line) for line in calls.read_text().splitlines()] == [
        ["Qwen/Qwen2.5-Coder-7B-Instruct", None, "/models/Qwen/Qwen2.5-Coder-7B-Instruct"],
        ["org/m", "v1.0", "/models/org/m"],
    ]
    escaped = run(["../etc"])
    assert escaped.returncode != 0 and "not a Hugging Face repository id" in escaped.stderr


@pytest.mark.parametrize("report_to", ["wandb", "mlflow"])
def test_experiment_tracking_reaches_the_train_stage_only(report_to):
    extra = {"tracking": {"reportTo": report_to, "existingSecret": "tracking", "env": {"K": "v"}}}
    jobs = stage_jobs("default", json.dumps(extra))
    for stage, job in jobs.items():
        container = job["spec"]["template"]["spec"]["containers"][0]
        env = {e["name"]: e.get("value") for e in container["env"]}
        annotations = job["metadata"]["annotations"]
        if stage == "train":
            assert env["CODEQ_TRAIN__REPORT_TO"] == report_to and env["K"] == "v"
            assert container["envFrom"] == [{"secretRef": {"name": "tracking"}}]
            assert annotations["checkov.io/skip4"].startswith("CKV_K8S_35=")
        else:
            assert "CODEQ_TRAIN__REPORT_TO" not in env and "envFrom" not in container
            assert "checkov.io/skip4" not in annotations
    for job in stage_jobs("default").values():
        env = {e["name"] for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
        assert "CODEQ_TRAIN__REPORT_TO" not in env, "tracking is off by default"


def test_the_tracking_setting_is_one_codeq_accepts(monkeypatch):
    from codeq.config import load_config

    for key in [k for k in os.environ if k.startswith("CODEQ_")]:
        monkeypatch.delenv(key)
    train = stage_jobs("kueue")["train"]["spec"]["template"]["spec"]["containers"][0]
    (value,) = [e["value"] for e in train["env"] if e["name"] == "CODEQ_TRAIN__REPORT_TO"]
    monkeypatch.setenv("CODEQ_TRAIN__REPORT_TO", value)
    assert load_config(None).train.report_to == "wandb"


def test_pinned_digests_replace_tags():
    digest = "sha256:" + "ab" * 32
    jobs = stage_jobs("default", json.dumps({"images": {"train": {"digest": digest}}}))
    assert jobs["train"]["spec"]["template"]["spec"]["containers"][0]["image"] == (
        f"ghcr.io/codeq/codeq-train@{digest}"
    )
    assert "checkov.io/skip1" not in jobs["train"]["metadata"]["annotations"]
    assert jobs["collect"]["metadata"]["annotations"]["checkov.io/skip1"].startswith("CKV_K8S_43")
    for job in stage_jobs("irsa").values():
        assert "@sha256:" in job["spec"]["template"]["spec"]["containers"][0]["image"]
        assert "checkov.io/skip1" not in job["metadata"]["annotations"]


# ----------------------------------------------------------------------------- clusters as they are


def every_pod_spec(scenario: str, extra: str = "") -> dict[str, dict[str, Any]]:
    """Every pod spec the chart or its workflow makes: stage Jobs, the workflow's own pods (as
    Argo builds them, Argo's executors included: they take the workflow spec's settings), and
    the chart's other Jobs and DaemonSets."""
    found = {
        f"job/{stage}": job["spec"]["template"]["spec"]
        for stage, job in stage_jobs(scenario, extra).items()
    }
    found.update(
        {f"step/{name}": pod["spec"] for name, pod in helper_pods(scenario, extra).items()}
    )
    for obj in objects(scenario, extra):
        if obj["kind"] in ("Job", "DaemonSet"):
            found[f"{obj['kind']}/{obj['metadata']['name']}"] = obj["spec"]["template"]["spec"]
    return found


@pytest.mark.parametrize("scenario", ["default", "kueue", "gke"])
def test_every_pod_pulls_with_the_registry_secrets(scenario):
    """A private registry needs its pull Secret on every pod: the round's own steps too."""
    extra = json.dumps({"images": {"pullSecrets": ["regcred", "mirror"]}})
    pods = every_pod_spec(scenario, extra)
    assert {"step/fence", "step/resolve-round", "step/finish", "step/release-jobs"} <= set(pods)
    for name, pod in pods.items():
        assert pod.get("imagePullSecrets") == [{"name": "regcred"}, {"name": "mirror"}], name
    assert workflow_template(scenario, extra)["spec"]["imagePullSecrets"] == [
        {"name": "regcred"},
        {"name": "mirror"},
    ], "Argo's executor pods take the workflow's pull secrets"
    assert "imagePullSecrets" not in workflow_template("default")["spec"]


def test_pod_annotations_runtime_class_and_affinity_reach_the_pods():
    values = effective_values("karpenter")
    jobs = stage_jobs("karpenter")
    for stage, job in jobs.items():
        pod = job["spec"]["template"]
        pool = values["pools"][values["stages"][stage]["pool"]]
        assert pod["spec"].get("runtimeClassName", "") == pool.get("runtimeClassName", ""), stage
        assert pod["spec"].get("affinity", {}) == pool.get("affinity", {}), stage
        annotations = pod["metadata"].get("annotations", {})
        long_running = stage in ("collect", "train", "evaluate")
        assert (annotations.get("karpenter.sh/do-not-disrupt") == "true") == long_running, stage
    assert jobs["collect"]["spec"]["template"]["spec"]["runtimeClassName"] == "nvidia"
    assert "runtimeClassName" not in jobs["pairs"]["spec"]["template"]["spec"]
    for name, pod in helper_pods("karpenter").items():
        assert pod["metadata"]["annotations"]["karpenter.sh/do-not-disrupt"] == "true", name
    # jobs.podAnnotations reach every stage; a stage's own win.
    extra = json.dumps(
        {
            "jobs": {"podAnnotations": {"example.com/team": "ml", "example.com/tier": "batch"}},
            "stages": {"train": {"podAnnotations": {"example.com/tier": "gpu"}}},
            "pools": {"cpu": {"runtimeClassName": "gvisor-free"}},
        }
    )
    for stage, job in stage_jobs("default", extra).items():
        annotations = job["spec"]["template"]["metadata"]["annotations"]
        assert annotations["example.com/team"] == "ml"
        assert annotations["example.com/tier"] == ("gpu" if stage == "train" else "batch")
    # The workflow pool's RuntimeClass reaches Argo's pods through the workflow's podSpecPatch.
    spec = workflow_template("default", extra)["spec"]
    assert json.loads(spec["podSpecPatch"]) == {"runtimeClassName": "gvisor-free"}
    assert "podSpecPatch" not in workflow_template("default")["spec"]
    for job in stage_jobs("default").values():
        assert "annotations" not in job["spec"]["template"]["metadata"]


def test_an_extra_mount_at_scratch_replaces_the_charts_emptydir():
    for stage, job in stage_jobs("karpenter").items():
        pod = job["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        mounts = {m["mountPath"]: m["name"] for m in pod["containers"][0]["volumeMounts"]}
        if stage in ("collect", "train"):
            assert "scratch" not in volumes
            assert mounts["/scratch"] == "nvme-scratch"
            claim = volumes["nvme-scratch"]["ephemeral"]["volumeClaimTemplate"]["spec"]
            assert claim["storageClassName"] == "local-nvme"
        else:
            assert mounts["/scratch"] == "scratch" and "emptyDir" in volumes["scratch"]
        assert mounts["/tmp"] == "tmp" and mounts["/dev/shm"] == "dshm"
    # jobs.extraVolumes/extraVolumeMounts reach every stage, next to the stage's own.
    extra = {
        "jobs": {
            "extraVolumes": [{"name": "ca", "configMap": {"name": "corporate-ca"}}],
            "extraVolumeMounts": [
                {"name": "ca", "mountPath": "/etc/ssl/corporate", "readOnly": True}
            ],
        }
    }
    for job in stage_jobs("karpenter", json.dumps(extra)).values():
        pod = job["spec"]["template"]["spec"]
        assert {"name": "ca", "configMap": {"name": "corporate-ca"}} in pod["volumes"]
        mounts = {m["mountPath"]: m["name"] for m in pod["containers"][0]["volumeMounts"]}
        assert mounts["/etc/ssl/corporate"] == "ca"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            {
                "stages": {
                    "train": {"extraVolumeMounts": [{"name": "nvme", "mountPath": "/scratch"}]}
                }
            },
            'stages.train: extra volume mount "nvme" at /scratch names no volume',
        ),
        (
            {"stages": {"collect": {"extraVolumes": [{"name": "scratch", "emptyDir": {}}]}}},
            'stages.collect: extra volume "scratch" is used twice or is one of the chart\'s own',
        ),
        (
            {
                "jobs": {
                    "extraVolumes": [{"name": "a", "emptyDir": {}}, {"name": "b", "emptyDir": {}}],
                    "extraVolumeMounts": [
                        {"name": "a", "mountPath": "/data"},
                        {"name": "b", "mountPath": "/data"},
                    ],
                }
            },
            "two extra volume mounts at /data",
        ),
    ],
)
def test_extra_volumes_that_cannot_work_fail_the_render(extra, message):
    with pytest.raises(helm.HelmError, match=re.escape(message)):
        render_with("default", **extra)


def stage_deadline_sum(values: dict[str, Any]) -> int:
    return sum(values["stages"][stage]["activeDeadlineSeconds"] for stage in stages_of(values))


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_the_workflow_deadline_covers_max_rounds_of_every_stage_deadline_and_start_timeout(
    scenario,
):
    """A round may run each stage to its deadline after waiting workflow.startTimeout to start;
    a submission may ask for workflow.maxRounds rounds. The workflow's deadline is derived from
    both, so it never cuts a legitimate chain of rounds short."""
    values = effective_values(scenario)
    start = go_duration_seconds(values["workflow"]["startTimeout"])
    one_round = stage_deadline_sum(values) + len(stages_of(values)) * math.ceil(start) + 3600
    deadline = workflow_template(scenario)["spec"]["activeDeadlineSeconds"]
    assert deadline == values["workflow"]["maxRounds"] * one_round
    assert deadline > stage_deadline_sum(values)


def test_the_workflow_deadline_grows_with_max_rounds():
    three = workflow_template("default", json.dumps({"workflow": {"maxRounds": 3}}))
    one = workflow_template("default", json.dumps({"workflow": {"maxRounds": 1}}))
    assert three["spec"]["activeDeadlineSeconds"] == 3 * one["spec"]["activeDeadlineSeconds"]
    # resolve-round refuses a submission asking for more rounds than that deadline covers.
    (step,) = [t for t in three["spec"]["templates"] if t["name"] == "resolve-round"]
    assert step["container"]["args"][-2:] == ["--max-rounds", "3"]


def test_the_default_deadline_is_the_sum_documented():
    deadline = workflow_template("default")["spec"]["activeDeadlineSeconds"]
    assert deadline == 10 * 450000  # 10 rounds of 125 h: values.yaml and docs/cluster.md say so
    values_text = (CHART / "values.yaml").read_text()
    assert "125 h with the defaults" in values_text and "1250 h with the defaults" in values_text
    assert "maxRounds: 10" in values_text


def test_a_deadline_shorter_than_max_rounds_of_stages_fails_the_install():
    with pytest.raises(helm.HelmError) as caught:
        render_with("default", workflow={"activeDeadlineSeconds": 440000})
    message = str(caught.value)
    assert (
        "workflow.activeDeadlineSeconds=440000 is shorter than workflow.maxRounds=10 round(s) "
        "may take (4500000 s: 450000 s a round" in message
    )
    one = {"activeDeadlineSeconds": 460000, "maxRounds": 1}
    longer = workflow_template("default", json.dumps({"workflow": one}))
    assert longer["spec"]["activeDeadlineSeconds"] == 460000


def test_logs_are_kept_for_a_week_and_argo_can_archive_its_own():
    values = effective_values("default")
    week = 7 * 24 * 3600
    assert values["jobs"]["ttlSecondsAfterFinished"] >= week
    spec = workflow_template("default")["spec"]
    assert spec["ttlStrategy"]["secondsAfterSuccess"] >= week
    for job in stage_jobs("default").values():
        assert job["spec"]["ttlSecondsAfterFinished"] >= week
    assert "archiveLogs" not in spec
    archived = workflow_template("default", json.dumps({"workflow": {"archiveLogs": True}}))
    assert archived["spec"]["archiveLogs"] is True


# ----------------------------------------------------------------------------- store and identity


def test_the_checksum_setting_reaches_every_stage_as_one_codeq_accepts(monkeypatch):
    from codeq.config import load_config

    for key in [k for k in os.environ if k.startswith("CODEQ_")]:
        monkeypatch.delenv(key)
    for scenario, expected in (("default", "when_supported"), ("gke", "when_required")):
        for stage, job in stage_jobs(scenario).items():
            container = job["spec"]["template"]["spec"]["containers"][0]
            env = {e["name"]: e.get("value") for e in container["env"]}
            assert env["CODEQ_STORE__CHECKSUMS"] == expected, (scenario, stage)
        monkeypatch.setenv("CODEQ_STORE__CHECKSUMS", expected)
        assert load_config(None).store.checksums == expected
    step = templates("gke")["resolve-round"]["container"]
    assert {"name": "CODEQ_STORE__CHECKSUMS", "value": "when_required"} in step["env"]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            {
                "serviceAccount": {
                    "jobs": {
                        "annotations": {
                            "iam.gke.io/gcp-service-account": "x@p.iam.gserviceaccount.com"
                        }
                    }
                }
            },
            "serviceAccount.jobs.annotations.iam.gke.io/gcp-service-account: GKE Workload Identity",
        ),
        (
            {"s3Credentials": {"mode": "serviceAccount"}},
            "s3Credentials.mode=serviceAccount needs serviceAccount.jobs.annotations.eks.amazonaws.com/role-arn",
        ),
        (
            {
                "s3Credentials": {"mode": "serviceAccount"},
                "serviceAccount": {
                    "jobs": {"annotations": {"eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/r"}}
                },
                "store": {
                    "endpointUrl": "https://storage.googleapis.com",
                    "checksums": "when_required",
                },
            },
            "store.endpointUrl=https://storage.googleapis.com cannot be reached with s3Credentials.mode=serviceAccount",
        ),
        (
            {
                "s3Credentials": {"mode": "serviceAccount"},
                "serviceAccount": {
                    "jobs": {"annotations": {"eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/r"}}
                },
                "store": {"endpointUrl": "http://minio.codeq.svc:9000"},
            },
            "store.endpointUrl=http://minio.codeq.svc:9000 cannot be reached with s3Credentials.mode=serviceAccount",
        ),
        (
            {"store": {"endpointUrl": "https://storage.googleapis.com"}},
            "store.checksums=when_supported: GCS's S3 interface (store.endpointUrl=https://storage.googleapis.com) refuses",
        ),
    ],
)
def test_a_store_the_identity_cannot_reach_fails_the_install_with_one_line(extra, message):
    values = deep_merge(scenario_values("default"), extra)
    with helm.Chart.load(CHART) as chart, pytest.raises(helm.HelmError) as caught:
        chart.render(values=values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    text = str(caught.value)
    assert message in text, text
    (line,) = [ln for ln in text.splitlines() if message in ln]
    assert "\n" not in line


def test_identities_the_store_can_use_install():
    irsa = objects("irsa")
    assert [o for o in irsa if o["kind"] == "WorkflowTemplate"]
    endpoint = {"store": {"endpointUrl": "https://s3.eu-west-1.amazonaws.com"}}
    assert objects("irsa", json.dumps(endpoint))
    assert objects("gke")


# ----------------------------------------------------------------------------- other objects


def test_identity_mode_annotates_the_service_account_and_creates_no_secret():
    objs = objects("irsa")
    assert not [o for o in objs if o["kind"] == "Secret"]
    (sa,) = [
        o for o in objs if o["kind"] == "ServiceAccount" and o["metadata"]["name"].endswith("-jobs")
    ]
    assert sa["metadata"]["annotations"]["eks.amazonaws.com/role-arn"].startswith("arn:aws:iam::")
    assert sa["automountServiceAccountToken"] is False


def test_network_policies_deny_by_default_and_allow_dns_s3_and_for_helpers_the_api():
    policies = {
        o["metadata"]["name"]: o["spec"] for o in objects("default") if o["kind"] == "NetworkPolicy"
    }
    jobs, helpers = policies["codeq-jobs"], policies["codeq-workflow"]
    for spec in (jobs, helpers):
        assert spec["policyTypes"] == ["Ingress", "Egress"] and spec["ingress"] == []
        assert [p["port"] for p in spec["egress"][0]["ports"]] == [53, 53]
        assert spec["egress"][1]["ports"] == [{"protocol": "TCP", "port": 443}]
        assert "169.254.169.254/32" in spec["egress"][1]["to"][0]["ipBlock"]["except"]
    assert len(jobs["egress"]) == 2, "stage pods never reach the Kubernetes API"
    assert [p["port"] for p in helpers["egress"][2]["ports"]] == [443, 6443]
    job_labels = stage_jobs("default")["collect"]["spec"]["template"]["metadata"]["labels"]
    assert jobs["podSelector"]["matchLabels"].items() <= job_labels.items()
    for pod in helper_pods("default").values():
        assert helpers["podSelector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    (kind_policy,) = [
        o
        for o in objects("kind")
        if o["kind"] == "NetworkPolicy" and o["metadata"]["name"] == "codeq-jobs"
    ]
    assert kind_policy["spec"]["egress"][1]["to"][0]["podSelector"] == {
        "matchLabels": {"app": "minio"}
    }


def test_workflow_rbac_is_namespaced_and_minimal():
    objs = objects("default")
    assert not [o for o in objs if o["kind"] in ("ClusterRole", "ClusterRoleBinding")]
    (role,) = [o for o in objs if o["kind"] == "Role"]
    resources = {r for rule in role["rules"] for r in rule["resources"]}
    assert resources == {
        "jobs",
        "workflowtaskresults",
        "workflowtasksets",
        "workflowtasksets/status",
        "workflows",
    }
    (jobs_rule,) = [r for r in role["rules"] if r["resources"] == ["jobs"]]
    # apply = get + create/patch; the exit handler lists, patches and deletes.
    assert {"create", "get", "list", "watch", "patch", "delete"} <= set(jobs_rule["verbs"])
    assert not [r for r in role["rules"] if "*" in r["verbs"] or "secrets" in r["resources"]]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_configmap_holds_a_config_codeq_accepts(scenario, tmp_path, monkeypatch):
    from codeq.config import load_config

    for key in [k for k in os.environ if k.startswith("CODEQ_")]:
        monkeypatch.delenv(key)
    (cm,) = [o for o in objects(scenario) if o["metadata"]["name"] == "codeq-config"]
    path = tmp_path / "config.yaml"
    path.write_text(cm["data"]["config.yaml"])
    config = load_config(path)
    assert config.policy.model == effective_values(scenario)["config"]["policy"]["model"]


@pytest.mark.parametrize(
    "bad",
    [
        {"stages": {"collect": {"shards": 0}}},
        {"stages": {"evaluate": {"shards": 0}}},
        {"stages": {"evaluate": {"shards": "2"}}},
        {"stages": {"evaluate": {"backoffLimitPerIndex": 2}}},
        {"s3Credentials": {"mode": "env"}},
        {"unknownTopLevel": 1},
        {"pools": {"infer": {"gpuType": "h100"}}},
        {"store": {"uri": "gs://bucket/x"}},
        {"stages": {"prepare": {"volumes": {"scratch": "lots"}}}},
        {"tracking": {"reportTo": "tensorboard"}},
        {"workflow": {"startTimeout": "six hours"}},
        {"model": {"download": {"repos": ["not-a-repo-id"]}}},
        {"store": {"checksums": "never"}},
        {"pools": {"infer": {"runtimeClassName": "NVIDIA"}}},
        {"pools": {"infer": {"affinity": {"nodeAfinity": {}}}}},
        {"jobs": {"podAnnotations": {"karpenter.sh/do-not-disrupt": True}}},
        {"stages": {"collect": {"extraVolumeMounts": [{"name": "nvme"}]}}},
        {"stages": {"train": {"extraVolumeMounts": [{"name": "n", "mountPath": "scratch"}]}}},
        {"stages": {"train": {"extraVolumes": [{"name": "n", "emptyDir": {}, "hostPath": {}}]}}},
        {"stages": {"train": {"extraVolumes": [{"emptyDir": {}}]}}},
        {"workflow": {"activeDeadlineSeconds": "2d"}},
        {"workflow": {"maxRounds": 0}},
        {"workflow": {"maxRounds": 65}},
        {"workflow": {"maxRounds": "10"}},
        {"workflow": {"maxRound": 10}},
        {"workflow": {"podAnnotations": {"bad key with spaces": "x"}}},
    ],
)
def test_values_schema_rejects_bad_values(bad):
    with helm.Chart.load(CHART) as chart, pytest.raises(helm.HelmError):
        chart.validate_schema(deep_merge(chart.values, bad))


def test_secret_mode_without_credentials_fails_with_a_clear_message():
    with helm.Chart.load(CHART) as chart, pytest.raises(helm.HelmError, match="existingSecret"):
        chart.render(values={}, name=RELEASE, namespace=NAMESPACE)


def test_values_yaml_documents_every_value():
    """helm-docs style: every leaf value (or the section holding it) has a `# --` comment."""
    lines = (CHART / "values.yaml").read_text().splitlines()
    undocumented = []
    covered_indent: int | None = None
    for i, line in enumerate(lines):
        match = re.match(r"^(\s*)([A-Za-z0-9_.-]+):(.*)$", line)
        if not match:
            continue
        indent = len(match.group(1))
        if covered_indent is not None and indent > covered_indent:
            continue
        covered_indent = None
        j = i - 1
        comments = []
        while j >= 0 and lines[j].strip().startswith("#"):
            comments.append(lines[j].strip())
            j -= 1
        documented = any(c.startswith("# --") for c in comments)
        following = next(
            (ln for ln in lines[i + 1 :] if ln.strip() and not ln.strip().startswith("#")), ""
        )
        child_indent = len(following) - len(following.lstrip())
        is_section = (
            match.group(3).strip() == ""
            and child_indent > indent
            and not following.strip().startswith("-")
        )
        if documented:
            covered_indent = indent
        elif not is_section:
            undocumented.append(f"line {i + 1}: {line.strip()}")
    assert not undocumented, undocumented


def test_notes_say_how_to_follow_read_logs_and_stop_a_round():
    with helm.Chart.load(CHART) as chart:
        notes = chart.render(
            values=deep_merge(chart.values, scenario_values("default")),
            name=RELEASE,
            namespace=NAMESPACE,
            is_install=True,
        )["codeq/templates/NOTES.txt"]
    for text in (
        "argo submit -n codeq --from workflowtemplate/codeq-round",
        "argo logs -n codeq",
        "-l codeq.io/stage=",
        "argo stop -n codeq",
        "codeq.io/outcome=failed",
        "argo delete",
    ):
        assert text in notes, text
    assert "-p round=0" not in notes, "the round number defaults to the next one"
    assert "-p rounds=<K>" in notes and "workflow.maxRounds=10" in notes
    assert "Deadline:         4500000 s (workflow.maxRounds=10 rounds of 450000 s" in notes


# ----------------------------------------------------------------------------- the first run on EKS

EKS_DOC = REPO / "docs" / "eks.md"
# The boto3 calls of codeq/store.py and the IAM actions each needs on AWS S3. HeadObject answers
# 404 for a missing key only to a caller with s3:ListBucket (403 otherwise), and the store's
# exists() tells a missing marker by that 404; a multipart upload that stops is aborted.
STORE_CALL_ACTIONS = {
    "put_object": {"s3:PutObject"},
    "get_object": {"s3:GetObject"},
    "head_object": {"s3:GetObject", "s3:ListBucket"},
    "delete_object": {"s3:DeleteObject"},
    "upload_file": {"s3:PutObject", "s3:AbortMultipartUpload"},
    "download_file": {"s3:GetObject"},
    "list_objects_v2": {"s3:ListBucket"},
}
# docs/eks.md's shell variables, as its commands would set them.
EKS_SHELL = {
    "REGISTRY": "123456789012.dkr.ecr.us-east-1.amazonaws.com",
    "INFER_DIGEST": "sha256:" + "1" * 64,
    "TRAIN_DIGEST": "sha256:" + "2" * 64,
    "ACCOUNT": "123456789012",
    "REGION": "us-east-1",
}


def eks_doc_json() -> list[dict[str, Any]]:
    """Every ```json block of docs/eks.md, parsed (a block that is not JSON fails here)."""
    blocks = re.findall(r"```json\n(.*?)```", EKS_DOC.read_text(), flags=re.S)
    return [json.loads(block) for block in blocks]


def iam_statements(document: dict[str, Any]) -> list[dict[str, Any]]:
    return list(document.get("Statement", []))


def eks_doc_values() -> dict[str, Any]:
    """The values file the walkthrough writes (`cat > my-eks-values.yaml <<EOF`), its shell
    variables expanded."""
    (body,) = re.findall(
        r"cat > my-eks-values\.yaml <<EOF\n(.*?)\nEOF\n", EKS_DOC.read_text(), flags=re.S
    )
    expanded = re.sub(r"\$([A-Z_]+)", lambda m: EKS_SHELL[m.group(1)], body)
    return yaml.safe_load(expanded)


def test_the_0_5b_sizes_are_the_known_ones():
    """Qwen2.5-Coder-0.5B-Instruct has 0.49 B parameters: 0.99 GB of bf16 safetensors."""
    assert weight_bytes(QWEN_05B) == 988_065_536


def test_the_first_run_is_the_0_5b_on_one_gpu_node_with_the_disk_it_needs():
    """ci/first-run-values.yaml: the 0.5B, every GPU stage placed alike (one node group, one
    GPU each, one shard), requests that fit a g6.2xlarge (8 vCPU, 32 GiB) and the CPU stages a
    4-vCPU, 16-GiB node, each less an allowance for the kubelet and DaemonSets, /scratch that holds
    each stage's peak at the 0.5B's shapes, and a round deadline of hours, not days."""
    from codeq.config import load_config

    values = effective_values("first-run")
    config = values["config"]
    assert config["policy"]["model"] == "Qwen/Qwen2.5-Coder-0.5B-Instruct"
    assert values["stages"]["collect"]["shards"] == 1
    train = load_config(None).train.model_dump()
    train.update(config["train"])
    placements = set()
    fits = {True: (7.5, 28 * 1024**3), False: (3.5, 12 * 1024**3)}  # GPU node, CPU node
    for stage, job in stage_jobs("first-run").items():
        pod = job["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        gpus = container["resources"]["limits"]["nvidia.com/gpu"]
        requests = container["resources"]["requests"]
        cpu, memory = fits[gpus > 0]
        assert parse_quantity(requests["cpu"]) <= cpu, stage
        assert parse_quantity(requests["memory"]) <= memory, stage
        if gpus:
            assert gpus == 1, stage
            placements.add(
                json.dumps({k: pod.get(k) for k in ("nodeSelector", "tolerations")}, sort_keys=True)
            )
        need = peak_scratch(stage, train, False, QWEN_05B)
        assert scratch_capacity(pod) >= need, (stage, need / 1e9)
    assert len(placements) == 1, f"the GPU stages land on different node groups: {placements}"
    assert workflow_template("first-run")["spec"]["activeDeadlineSeconds"] <= 12 * 3600


def test_the_eks_walkthrough_trusts_the_service_account_the_chart_renders():
    """The IRSA trust policy in docs/eks.md names the ServiceAccount the stage pods and the
    round-number step run as, in the chart's namespace; every concrete subject the page names is
    a ServiceAccount the chart renders; the role it creates is the one the values annotate."""
    jobs = stage_jobs("first-run")
    (account,) = {job["spec"]["template"]["spec"]["serviceAccountName"] for job in jobs.values()}
    assert helper_pods("first-run")["resolve-round"]["spec"]["serviceAccountName"] == account
    subject = f"system:serviceaccount:{NAMESPACE}:{account}"

    trusts = [
        doc
        for doc in eks_doc_json()
        if any(s["Action"] == "sts:AssumeRoleWithWebIdentity" for s in iam_statements(doc))
    ]
    assert len(trusts) == 1, "one IRSA trust policy in docs/eks.md"
    (statement,) = iam_statements(trusts[0])
    condition = statement["Condition"]["StringEquals"]
    assert [v for k, v in condition.items() if k.endswith(":sub")] == [subject]
    assert [v for k, v in condition.items() if k.endswith(":aud")] == ["sts.amazonaws.com"]
    issuer = statement["Principal"]["Federated"].split(":oidc-provider/", 1)[1]
    assert set(condition) == {f"{issuer}:sub", f"{issuer}:aud"}

    text = EKS_DOC.read_text()
    rendered = {
        f"system:serviceaccount:{o['metadata']['namespace']}:{o['metadata']['name']}"
        for o in objects("first-run")
        if o["kind"] == "ServiceAccount"
    }
    named = set(re.findall(r"system:serviceaccount:[a-z0-9-]+:[a-z0-9-]+\b", text))
    assert subject in named and named <= rendered, named - rendered

    (sa,) = [
        o
        for o in objects("first-run")
        if o["kind"] == "ServiceAccount" and o["metadata"]["name"] == account
    ]
    role = sa["metadata"]["annotations"]["eks.amazonaws.com/role-arn"].rsplit("/", 1)[1]
    assert f"--role-name {role} --assume-role-policy-document" in text


def test_the_eks_walkthrough_s3_policy_grants_each_store_call_on_the_store_prefix():
    """The IAM policy in docs/eks.md grants exactly the actions codeq/store.py's S3 calls need,
    on the bucket and prefix of the first run's store.uri; a new call in the store fails here
    until its actions are added (here and in the page)."""
    source = (REPO / "codeq" / "store.py").read_text()
    calls = set(re.findall(r"self\.client\.([a-z_0-9]+)", source)) - {"meta", "get_paginator"}
    calls |= set(re.findall(r'get_paginator\("([a-z_0-9]+)"\)', source))
    assert calls, "the store's S3 calls were not found"
    unknown = calls - set(STORE_CALL_ACTIONS)
    assert not unknown, f"S3 calls without IAM actions in STORE_CALL_ACTIONS: {unknown}"
    needed = set().union(*(STORE_CALL_ACTIONS[call] for call in calls))

    policies = [
        doc
        for doc in eks_doc_json()
        if any(str(s["Action"]).count("s3:") for s in iam_statements(doc))
    ]
    assert len(policies) == 1, "one S3 policy in docs/eks.md"
    granted: dict[str, set[str]] = {}
    for statement in iam_statements(policies[0]):
        assert statement["Effect"] == "Allow" and "Condition" not in statement, statement
        actions = statement["Action"]
        for action in [actions] if isinstance(actions, str) else actions:
            granted.setdefault(action, set()).add(statement["Resource"])
    assert set(granted) == needed

    uri = effective_values("first-run")["store"]["uri"]
    bucket, prefix = uri.removeprefix("s3://").split("/", 1)
    bucket_arn = f"arn:aws:s3:::{bucket}"
    assert granted.pop("s3:ListBucket") == {bucket_arn}
    for action, resources in granted.items():
        assert resources == {f"{bucket_arn}/{prefix.strip('/')}/*"}, action


def test_the_eks_walkthrough_values_and_commands_fit_the_chart():
    """The values file docs/eks.md writes passes the chart's closed schema over the first run's
    and renders with it (digests, store, role); the objects and files its commands name exist;
    its NetworkPolicy check pod carries exactly the labels the stage pods' policy selects."""
    mine = eks_doc_values()
    with helm.Chart.load(CHART) as chart:
        chart.validate_schema(
            deep_merge(chart.values, deep_merge(scenario_values("first-run"), mine))
        )
    extra = json.dumps(mine, sort_keys=True)
    for job in stage_jobs("first-run", extra).values():
        (container,) = job["spec"]["template"]["spec"]["containers"]
        assert container["image"].split("@")[1] in (
            EKS_SHELL["INFER_DIGEST"],
            EKS_SHELL["TRAIN_DIGEST"],
        )
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["CODEQ_STORE__URI"] == f"s3://codeq-artifacts-{EKS_SHELL['ACCOUNT']}/codeq"
    found = objects("first-run", extra)
    (sa,) = [
        o
        for o in found
        if o["kind"] == "ServiceAccount" and o["metadata"]["name"].endswith("-jobs")
    ]
    assert sa["metadata"]["annotations"]["eks.amazonaws.com/role-arn"] == (
        f"arn:aws:iam::{EKS_SHELL['ACCOUNT']}:role/codeq-jobs"
    )

    # Alone, over the chart's defaults, the same file installs the 7B (the page's step up).
    with helm.Chart.load(CHART) as chart:
        alone = chart.render(values=mine, name=RELEASE, namespace=NAMESPACE, is_install=True)
    assert "model: Qwen/Qwen2.5-Coder-7B-Instruct" in alone["codeq/templates/configmap.yaml"]

    text = EKS_DOC.read_text()
    for path in re.findall(r"-f (helm/codeq/ci/[a-z0-9-]+\.yaml)", text):
        assert (REPO / path).is_file(), path
    daemonsets = {o["metadata"]["name"] for o in found if o["kind"] == "DaemonSet"}
    assert set(re.findall(r"\bds/([a-z0-9-]+)", text)) <= daemonsets
    round_yaml = yaml.safe_load((REPO / "argo" / "round.yaml").read_text())
    assert (
        round_yaml["spec"]["workflowTemplateRef"]["name"]
        == workflow_template("first-run")["metadata"]["name"]
    )

    (flag,) = re.findall(r"--labels=(\S+)", text)
    labels = dict(pair.split("=", 1) for pair in flag.split(","))
    (policy,) = [
        o for o in found if o["kind"] == "NetworkPolicy" and o["metadata"]["name"].endswith("-jobs")
    ]
    assert labels == policy["spec"]["podSelector"]["matchLabels"]
    pod_labels = stage_jobs("first-run")["collect"]["spec"]["template"]["metadata"]["labels"]
    assert labels.items() <= pod_labels.items()
