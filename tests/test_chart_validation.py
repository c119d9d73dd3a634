"""What an operator's pipeline runs on the chart before `helm install`, run here by `make test`:

1. real Helm v4 lint (strict) and render of every helm/codeq/ci/*-values.yaml;
2. every rendered object under the strict Kubernetes 1.33 schemas (kubernetes-validate);
3. the Jobs embedded in the WorkflowTemplate's resource templates and the pods of its container
   templates, extracted with Argo's `{{...}}` placeholders substituted by plausible values, under
   the same strict schemas;
4. the WorkflowTemplate under Argo's own JSON schema made strict (additionalProperties: false
   wherever an object lists its properties), read from ../shared/argo/schema.json beside the
   repository (never committed; CODEQ_ARGO_SCHEMA overrides the path);
5. (the `finish` step's judgement of every Job state is the script's: tests/test_watch_job.py);
6. checkov on all of it, 0 failed, each skip justified beside it (`checkov.io/skipN:
   CHECK=reason` annotations, a comment in the template next to them).
"""

from __future__ import annotations

import copy
import functools
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_helm import (
    ARGO_SAMPLE,
    CHART,
    NAMESPACE,
    REPO,
    SCENARIOS,
    STAGES,
    VERIFIER,
    argo_schema_path,
    helper_pods,
    objects,
    scenario_stages,
    scenario_values,
    stage_jobs,
    workflow_template,
)
from tools import find_tool

helm = pytest.importorskip("helm_python")
kubernetes_validate = pytest.importorskip("kubernetes_validate")
jsonschema = pytest.importorskip("jsonschema")

KUBE_VERSION = "1.33.0"


# ----------------------------------------------------------------------------- 1. lint


def test_there_are_scenarios_for_production_identity_kind_and_a_shared_cluster():
    assert {"default", "irsa", "kind", "kueue"} <= set(SCENARIOS)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_helm_lint_strict_passes(scenario):
    report = helm.lint(CHART, scenario_values(scenario), strict=True, namespace=NAMESPACE)
    problems = [m for m in report["messages"] if m["severity"] >= 2] + report["errors"]
    assert report["total_charts_linted"] == 1
    assert not problems, problems


def test_lint_catches_a_broken_values_file():
    """The lint check can fail: a value of the wrong type is an error."""
    report = helm.lint(CHART, {"stages": {"collect": {"shards": "many"}}}, strict=True)
    assert report["errors"] or [m for m in report["messages"] if m["severity"] == 3]


# ----------------------------------------------------------------------------- 2-3. Kubernetes


def validate(obj: dict[str, Any]) -> None:
    kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_rendered_object_is_valid_under_strict_kubernetes_schemas(scenario):
    checked = 0
    for obj in objects(scenario):
        if obj["apiVersion"].startswith(CUSTOM_RESOURCES):
            continue  # Argo's and the operator's own schemas check these (below)
        validate(obj)
        checked += 1
    assert checked >= 8


# Custom resources the chart renders: Argo's WorkflowTemplate, and the Security Profiles
# Operator's SeccompProfile (sandbox.seccompInstall.method=operator).
CUSTOM_RESOURCES = ("argoproj.io/", "security-profiles-operator.x-k8s.io/")
SECCOMP_ACTIONS = [
    "SCMP_ACT_KILL",
    "SCMP_ACT_KILL_PROCESS",
    "SCMP_ACT_KILL_THREAD",
    "SCMP_ACT_TRAP",
    "SCMP_ACT_ERRNO",
    "SCMP_ACT_TRACE",
    "SCMP_ACT_ALLOW",
    "SCMP_ACT_LOG",
    "SCMP_ACT_NOTIFY",
]
SECCOMP_OPERATORS = [
    "SCMP_CMP_NE",
    "SCMP_CMP_LT",
    "SCMP_CMP_LE",
    "SCMP_CMP_EQ",
    "SCMP_CMP_GE",
    "SCMP_CMP_GT",
    "SCMP_CMP_MASKED_EQ",
]
# The spec of security-profiles-operator.x-k8s.io/v1beta1 SeccompProfile (the operator's CRD,
# written out here field by field), strict: a field the operator does not know is an error.
_UINT = {"type": "integer", "minimum": 0}
SECCOMP_PROFILE_SPEC = {
    "type": "object",
    "additionalProperties": False,
    "required": ["defaultAction"],
    "properties": {
        "defaultAction": {"enum": SECCOMP_ACTIONS},
        "architectures": {
            "type": "array",
            "items": {
                "enum": [
                    "SCMP_ARCH_NATIVE",
                    "SCMP_ARCH_X86",
                    "SCMP_ARCH_X86_64",
                    "SCMP_ARCH_X32",
                    "SCMP_ARCH_ARM",
                    "SCMP_ARCH_AARCH64",
                ]
            },
        },
        "baseProfileName": {"type": "string"},
        "disabled": {"type": "boolean"},
        "flags": {"type": "array", "items": {"type": "string"}},
        "listenerPath": {"type": "string"},
        "listenerMetadata": {"type": "string"},
        "syscalls": {
            "type": "array",
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["action", "names"],
                "properties": {
                    "action": {"enum": SECCOMP_ACTIONS},
                    "names": {"type": "array", "items": {"type": "string"}, "minItems": 1},
                    "errnoRet": _UINT,
                    "args": {
                        "type": "array",
                        "maxItems": 6,
                        "items": {
                            "type": "object",
                            "additionalProperties": False,
                            "required": ["index", "op"],
                            "properties": {
                                "index": _UINT,
                                "op": {"enum": SECCOMP_OPERATORS},
                                "value": _UINT,
                                "valueTwo": _UINT,
                            },
                        },
                    },
                },
            },
        },
    },
}


def test_the_operators_seccomp_profile_is_valid_and_the_charts_file_rule_for_rule():
    """With sandbox.seccompInstall.method=operator the chart renders a SeccompProfile that the
    operator's v1beta1 schema accepts and that holds exactly the rules of the one profile file
    (files/seccomp/codeq-sandbox.json): same default, every architecture of its archMap, the same
    syscall rules (the file's `comment`s dropped)."""
    (profile,) = [o for o in objects("kueue") if o["kind"] == "SeccompProfile"]
    assert profile["apiVersion"] == "security-profiles-operator.x-k8s.io/v1beta1"
    assert profile["metadata"]["namespace"] == NAMESPACE
    errors = list(jsonschema.Draft7Validator(SECCOMP_PROFILE_SPEC).iter_errors(profile["spec"]))
    assert not errors, [f"{list(e.absolute_path)}: {e.message}" for e in errors[:5]]
    source = json.loads((CHART / "files" / "seccomp" / "codeq-sandbox.json").read_text())
    spec = profile["spec"]
    assert spec["defaultAction"] == source["defaultAction"] and source["defaultErrnoRet"] == 1
    assert spec["architectures"] == [
        arch
        for entry in source["archMap"]
        for arch in [entry["architecture"], *entry["subArchitectures"]]
    ]
    assert spec["syscalls"] == [
        {key: value for key, value in rule.items() if key != "comment"}
        for rule in source["syscalls"]
    ]
    # The stages' Localhost profile is where the operator writes it.
    sc = stage_jobs("kueue")["collect"]["spec"]["template"]["spec"]["containers"][0][
        "securityContext"
    ]
    name = profile["metadata"]["name"]
    assert sc["seccompProfile"] == {
        "type": "Localhost",
        "localhostProfile": f"operator/{NAMESPACE}/{name}.json",
    }


def test_the_operator_schema_check_can_fail():
    (profile,) = [o for o in objects("kueue") if o["kind"] == "SeccompProfile"]
    spec = copy.deepcopy(profile["spec"])
    spec["syscalls"][0]["comment"] = "a field the operator does not have"
    assert list(jsonschema.Draft7Validator(SECCOMP_PROFILE_SPEC).iter_errors(spec))


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_jobs_and_pods_inside_the_workflow_are_valid_under_strict_kubernetes_schemas(scenario):
    jobs = stage_jobs(scenario)
    assert sorted(jobs) == sorted(scenario_stages(scenario))
    for job in jobs.values():
        validate(job)
    pods = helper_pods(scenario)
    assert set(pods) == {"fence", "resolve-round", "continue", "finish", "release-jobs"}
    for pod in pods.values():
        validate(pod)


def test_strict_kubernetes_validation_can_fail():
    job = stage_jobs("default")["collect"]
    job["spec"]["template"]["spec"]["containers"][0]["securityContext"]["runAsNonroot"] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(job)
    # The 1.33 schema requires a status on pod-condition rules (a Job without one is refused).
    job = stage_jobs("default")["train"]
    del job["spec"]["podFailurePolicy"]["rules"][0]["onPodConditions"][0]["status"]
    with pytest.raises(kubernetes_validate.ValidationError, match="status"):
        validate(job)


# ----------------------------------------------------------------------------- 4. Argo


def strict(schema: Any) -> Any:
    """Argo's schema with additionalProperties: false wherever an object lists its properties."""
    if isinstance(schema, dict):
        out = {k: strict(v) for k, v in schema.items()}
        if "properties" in out and "additionalProperties" not in out:
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [strict(v) for v in schema]
    return schema


@functools.cache
def strict_argo_definitions() -> dict[str, Any]:
    path = argo_schema_path()
    if not path.is_file():
        if os.environ.get("CI") == "true":
            pytest.fail(f"Argo schema missing at {path} (set CODEQ_ARGO_SCHEMA)")
        pytest.skip(
            f"Argo's JSON schema is not at {path}: it is read from ../shared/argo/schema.json "
            "beside the repository (or CODEQ_ARGO_SCHEMA) and never committed"
        )
    return strict(json.loads(path.read_text()))["definitions"]


def argo_validator(kind: str = "WorkflowTemplate") -> Any:
    return jsonschema.Draft7Validator(
        {
            "definitions": strict_argo_definitions(),
            "$ref": f"#/definitions/io.argoproj.workflow.v1alpha1.{kind}",
        }
    )


def argo_errors(document: dict[str, Any], kind: str = "WorkflowTemplate") -> list[str]:
    errors = sorted(argo_validator(kind).iter_errors(document), key=str)
    return [f"{list(e.absolute_path)}: {e.message}" for e in errors[:10]]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_workflow_template_valid_under_strict_argo_schema(scenario):
    assert not argo_errors(workflow_template(scenario))


def test_strict_argo_schema_rejects_a_misspelt_field():
    wt = copy.deepcopy(workflow_template("default"))
    (start,) = [t for t in wt["spec"]["templates"] if t["name"] == "train-start"]
    start["resource"]["successCondtion"] = "status.succeeded > 0"
    assert argo_errors(wt)


# ----------------------------------------------------------------------------- 6. checkov


def run_checkov(directory: Path, framework: str) -> dict[str, Any]:
    checkov = find_tool("checkov")
    result = subprocess.run(
        [
            checkov,
            "-d",
            str(directory),
            "--framework",
            framework,
            "-o",
            "json",
            "--compact",
            "--skip-download",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "BC_SKIP_MAPPING": "TRUE", "CHECKOV_RUN_SCA_PACKAGE_SCAN_V2": "false"},
    )
    if not result.stdout.strip():
        pytest.fail(f"checkov produced no report (rc={result.returncode}): {result.stderr[-2000:]}")
    report = json.loads(result.stdout)
    reports = report if isinstance(report, list) else [report]
    summary: dict[str, Any] = {
        "passed": 0,
        "failed": 0,
        "skipped": 0,
        "failed_checks": [],
        "skipped_checks": [],
        "resources": set(),
    }
    for rep in reports:
        if "summary" not in rep:  # "no files found" style answers
            continue
        summary["passed"] += rep["summary"]["passed"]
        summary["failed"] += rep["summary"]["failed"]
        summary["skipped"] += rep["summary"]["skipped"]
        summary["failed_checks"] += [
            f"{c['check_id']} {c['resource']} {c['file_path']}"
            for c in rep["results"].get("failed_checks", [])
        ]
        summary["skipped_checks"] += rep["results"].get("skipped_checks", [])
        for result_list in rep["results"].values():
            summary["resources"].update(c["resource"] for c in result_list)
    return summary


def everything_rendered() -> dict[str, dict[str, Any]]:
    """file name -> object: every scenario's objects, its stage Jobs and helper pods."""
    files = {}
    for scenario in SCENARIOS:
        for obj in objects(scenario):
            files[f"{scenario}-{obj['kind']}-{obj['metadata']['name']}.yaml".lower()] = obj
        for stage, job in stage_jobs(scenario).items():
            files[f"{scenario}-job-{stage}.yaml"] = job
        for name, pod in helper_pods(scenario).items():
            files[f"{scenario}-pod-{name}.yaml"] = pod
    return files


@pytest.fixture(scope="session")
def chart_checkov(tmp_path_factory):
    """checkov once over every scenario's rendered objects plus the Jobs and pods inside the
    WorkflowTemplate (checkov cannot see into Argo templates by itself)."""
    out = tmp_path_factory.mktemp("rendered")
    for name, obj in everything_rendered().items():
        (out / name).write_text(yaml.safe_dump(obj))
    return run_checkov(out, "kubernetes")


def test_checkov_passes_on_the_rendered_chart(chart_checkov):
    assert chart_checkov["passed"] > 500
    assert chart_checkov["failed"] == 0, chart_checkov["failed_checks"]
    checked = chart_checkov["resources"]
    for stage in [*STAGES, VERIFIER]:  # the verifier scenario renders the verifier's Job
        job = f"{ARGO_SAMPLE['workflow.name']}-r{ARGO_SAMPLE['inputs.parameters.round']}-{stage}"
        assert any(f"Job.{NAMESPACE}.{job}" in r for r in checked)
    assert any(r.startswith("Pod.") and "resolve-round" in r for r in checked)
    assert any(r.startswith("Pod.") and "continue" in r for r in checked)


def test_every_checkov_skip_carries_a_reason(chart_checkov):
    """Skips live as `checkov.io/skipN: CHECK=reason` annotations; checkov drops the reason from
    its report, so the reasons are read from the objects themselves."""
    reasons: dict[str, set[str]] = {}
    for obj in everything_rendered().values():
        for key, value in obj["metadata"].get("annotations", {}).items():
            if key.startswith("checkov.io/skip"):
                check, _, reason = value.partition("=")
                assert len(reason.strip()) > 40, value
                reasons.setdefault(check, set()).add(reason)
    skipped = {c["check_id"] for c in chart_checkov["skipped_checks"]}
    assert skipped, "expected the documented sandbox/tag skips"
    assert skipped <= set(reasons), skipped - set(reasons)
    assert skipped == {
        "CKV_K8S_43",  # images pulled by tag where no digest is set
        "CKV_K8S_31",  # the sandbox stages' seccomp profile
        "CKV_K8S_15",  # kind's IfNotPresent
        "CKV_K8S_35",  # tracking credentials as env (train only, opt-in)
        "CKV_K8S_8",  # probes on one-shot Argo step pods
        "CKV_K8S_9",
        "CKV_K8S_38",  # the exit handler's API token
    }
    template = (CHART / "templates" / "_helpers.tpl").read_text()
    assert "and the reason is the text after it" in template


def test_checkov_passes_on_the_github_workflows(tmp_path):
    report = run_checkov(REPO / ".github" / "workflows", "github_actions")
    assert report["passed"] > 10
    assert report["failed"] == 0, report["failed_checks"]
