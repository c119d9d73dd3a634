"""The Helm chart, checked without a cluster: real Helm v4 lint and render (helm-python-sdk) of
every ci/*-values.yaml scenario, strict Kubernetes schemas for every object and every Job inside
an Argo resource template, the WorkflowTemplate under Argo's own schema made strict, the Job
semantics the round depends on, and checkov with zero failed checks."""

from __future__ import annotations

import copy
import functools
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

helm = pytest.importorskip("helm_python")
kubernetes_validate = pytest.importorskip("kubernetes_validate")
jsonschema = pytest.importorskip("jsonschema")

REPO = Path(__file__).resolve().parent.parent
CHART = REPO / "helm" / "codeq"
SCENARIOS = sorted(
    p.name.removesuffix("-values.yaml") for p in (CHART / "ci").glob("*-values.yaml")
)
STAGES = ["prepare", "collect", "pairs", "train", "evaluate", "promote", "report"]
SANDBOX_STAGES = {"prepare", "collect", "evaluate"}
KUBE_VERSION = "1.37.0"
RELEASE, NAMESPACE = "codeq", "codeq"
ARGO_EXPRESSIONS = {
    "workflow.name",
    "workflow.parameters.round",
    "workflow.parameters.run",
    "workflow.status",
}
# What a submitted workflow substitutes (the spec run uses the same table).
ARGO_SAMPLE = {
    "workflow.name": "codeq-round-x7k2p",
    "workflow.parameters.round": "0",
    "workflow.parameters.run": "default",
    "workflow.status": "Failed",
}


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


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    merged = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


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


def substitute(text: str, table: dict[str, str]) -> str:
    return re.sub(r"\{\{\s*([^{}]+?)\s*\}\}", lambda m: table[m.group(1)], text)


def stage_jobs(scenario: str, extra: str = "", table: dict[str, str] | None = None):
    """{stage: Job dict} from the resource templates, Argo expressions substituted."""
    wt = workflow_template(scenario, extra)
    jobs = {}
    for template in wt["spec"]["templates"]:
        resource = template.get("resource")
        if resource and resource["action"] == "create":
            jobs[template["name"]] = yaml.safe_load(
                substitute(resource["manifest"], table or ARGO_SAMPLE)
            )
    return jobs


def raw_manifests(scenario: str) -> dict[str, str]:
    wt = workflow_template(scenario)
    return {
        t["name"]: t["resource"]["manifest"]
        for t in wt["spec"]["templates"]
        if t.get("resource", {}).get("action") == "create"
    }


# ----------------------------------------------------------------------------- lint and render


def test_there_are_scenarios_for_production_identity_and_kind():
    assert {"default", "irsa", "kind"} <= set(SCENARIOS)


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


@pytest.mark.parametrize(
    "bad",
    [
        {"stages": {"collect": {"shards": 0}}},
        {"s3Credentials": {"mode": "env"}},
        {"unknownTopLevel": 1},
        {"pools": {"infer": {"gpuType": "h100"}}},
        {"stages": {"train": {"pool": "cpu"}}},
        {"store": {"uri": "gs://bucket/x"}},
    ],
)
def test_values_schema_rejects_bad_values(bad):
    with helm.Chart.load(CHART) as chart, pytest.raises(helm.HelmError):
        chart.validate_schema(deep_merge(chart.values, bad))


def test_secret_mode_without_credentials_fails_with_a_clear_message():
    with helm.Chart.load(CHART) as chart, pytest.raises(helm.HelmError, match="existingSecret"):
        chart.render(values={}, name=RELEASE, namespace=NAMESPACE)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_rendered_object_is_valid_under_strict_kubernetes_schemas(scenario):
    checked = 0
    for obj in objects(scenario):
        if obj["apiVersion"].startswith("argoproj.io/"):
            continue
        kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)
        checked += 1
    for job in stage_jobs(scenario).values():
        kubernetes_validate.validate(job, KUBE_VERSION, strict=True)
        checked += 1
    assert checked >= 6 + len(STAGES)


def test_strict_kubernetes_validation_can_fail():
    job = stage_jobs("default")["collect"]
    job["spec"]["template"]["spec"]["containers"][0]["securityContext"]["runAsNonroot"] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(job, KUBE_VERSION, strict=True)


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
def argo_validator():
    path = argo_schema_path()
    if not path.is_file():
        if os.environ.get("CI") == "true":
            pytest.fail(f"Argo schema missing at {path} (set CODEQ_ARGO_SCHEMA)")
        pytest.skip(f"Argo schema not found at {path} (set CODEQ_ARGO_SCHEMA)")
    schema = strict(json.loads(path.read_text()))
    root = {
        "definitions": schema["definitions"],
        "$ref": "#/definitions/io.argoproj.workflow.v1alpha1.WorkflowTemplate",
    }
    return jsonschema.Draft7Validator(root)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_workflow_template_valid_under_strict_argo_schema(scenario):
    errors = sorted(argo_validator().iter_errors(workflow_template(scenario)), key=str)
    assert not errors, "\n".join(f"{list(e.absolute_path)}: {e.message}" for e in errors[:10])


def test_strict_argo_schema_rejects_a_misspelt_field():
    wt = copy.deepcopy(workflow_template("default"))
    wt["spec"]["templates"][1]["resource"]["successCondtion"] = "status.succeeded > 0"
    assert list(argo_validator().iter_errors(wt))


# ----------------------------------------------------------------------------- semantics


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_dag_runs_every_stage_in_order_as_a_resource_template(scenario):
    spec = workflow_template(scenario)["spec"]
    templates = {t["name"]: t for t in spec["templates"]}
    tasks = templates[spec["entrypoint"]]["dag"]["tasks"]
    assert [t["name"] for t in tasks] == STAGES
    for before, task in zip(STAGES, tasks[1:], strict=False):
        assert task["depends"] == before
    for stage in STAGES:
        resource = templates[stage]["resource"]
        assert resource["action"] == "create"
        assert resource["setOwnerReference"] is True
        assert resource["successCondition"] == "status.completionTime"
        assert resource["failureCondition"] == "status.conditions.0.type in (FailureTarget,Failed)"
    names = [p["name"] for p in spec["arguments"]["parameters"]]
    assert names == ["round", "run"]
    assert "value" not in spec["arguments"]["parameters"][0], "round must be given at submit"


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_on_exit_deletes_the_rounds_jobs_unless_it_succeeded(scenario):
    spec = workflow_template(scenario)["spec"]
    templates = {t["name"]: t for t in spec["templates"]}
    step = templates[spec["onExit"]]["steps"][0][0]
    assert step["when"] == "{{workflow.status}} != Succeeded"
    delete = templates[step["template"]]["resource"]
    assert delete["action"] == "delete"
    assert "--selector=workflows.argoproj.io/workflow={{workflow.name}}" in delete["flags"]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_argo_expressions_are_escaped_through_helm_and_known(scenario):
    text = render(scenario)["codeq/templates/workflowtemplate.yaml"]
    found = set(re.findall(r"\{\{\s*([^{}]*?)\s*\}\}", text))
    assert found == ARGO_EXPRESSIONS
    for stage, manifest in raw_manifests(scenario).items():
        assert "{{workflow.parameters.round}}" in manifest, stage
        assert "{{workflow.parameters.run}}" in manifest, stage
        assert "{{workflow.name}}" in manifest, stage
    for name, text in render(scenario).items():
        if name != "codeq/templates/workflowtemplate.yaml":
            assert "{{" not in text, name


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_collect_is_an_indexed_job_with_per_index_retries(scenario):
    values = deep_merge(helm.Chart.load(CHART).values, scenario_values(scenario))
    shards = values["stages"]["collect"]["shards"]
    spec = stage_jobs(scenario)["collect"]["spec"]
    assert spec["completionMode"] == "Indexed"
    assert spec["completions"] == spec["parallelism"] == shards
    assert spec["backoffLimitPerIndex"] == values["stages"]["collect"]["backoffLimitPerIndex"]
    assert "backoffLimit" not in spec
    assert spec["podReplacementPolicy"] == "Failed"
    rules = spec["podFailurePolicy"]["rules"]
    assert rules[0] == {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}
    assert rules[1]["action"] == "FailIndex"
    assert rules[1]["onExitCodes"] == {
        "containerName": "collect",
        "operator": "In",
        "values": [2, 3],
    }
    env = {e["name"]: e.get("value") for e in spec["template"]["spec"]["containers"][0]["env"]}
    assert env["JOB_COMPLETION_COUNT"] == str(shards)
    if values["stages"]["collect"]["maxFailedIndexes"] is not None:
        assert spec["maxFailedIndexes"] == values["stages"]["collect"]["maxFailedIndexes"]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_job_has_pool_gpus_deadlines_and_restricted_security(scenario):
    values = deep_merge(helm.Chart.load(CHART).values, scenario_values(scenario))
    for stage, job in stage_jobs(scenario).items():
        conf = values["stages"][stage]
        pool = values["pools"][conf["pool"]]
        spec = job["spec"]
        pod = spec["template"]["spec"]
        (container,) = pod["containers"]
        assert spec["activeDeadlineSeconds"] == conf["activeDeadlineSeconds"]
        assert spec["ttlSecondsAfterFinished"] == values["jobs"]["ttlSecondsAfterFinished"]
        if stage != "collect":
            assert spec["backoffLimit"] == conf["backoffLimit"]
            assert spec["podFailurePolicy"]["rules"][1]["action"] == "FailJob"
        assert pod.get("nodeSelector", {}) == pool["nodeSelector"]
        assert pod.get("tolerations", []) == pool["tolerations"]
        assert container["resources"]["limits"]["nvidia.com/gpu"] == conf["gpus"]
        assert container["command"] == ["python", "-m", f"jobs.{stage}"]
        image = values["images"]["train" if stage == "train" else "infer"]
        assert container["image"].startswith(image["repository"])
        if image["digest"]:
            assert container["image"].endswith("@" + image["digest"])
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
        assert "add" not in sc["capabilities"]
        if stage in SANDBOX_STAGES:
            assert sc["seccompProfile"] == values["sandbox"]["seccompProfile"]
        else:
            assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
            assert sc["appArmorProfile"] == {"type": "RuntimeDefault"}
        labels = spec["template"]["metadata"]["labels"]
        assert labels["workflows.argoproj.io/workflow"] == ARGO_SAMPLE["workflow.name"]
        assert job["metadata"]["generateName"] == f"{ARGO_SAMPLE['workflow.name']}-{stage}-"
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert volumes["dshm"]["emptyDir"]["medium"] == "Memory"
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        assert mounts["/dev/shm"] == "dshm" and mounts["/etc/codeq"] == "config"
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["CODEQ_CONFIG_FILE"] == "/etc/codeq/config.yaml"
        assert env["CODEQ_STORE__ROUND"] == ARGO_SAMPLE["workflow.parameters.round"]
        assert env["CODEQ_STORE__RUN"] == ARGO_SAMPLE["workflow.parameters.run"]
        assert env["CODEQ_STORE__URI"] == values["store"]["uri"]
        if values["s3Credentials"]["mode"] == "secret":
            assert "s3-credentials" in volumes
            assert not [k for k in env if k.startswith("AWS_SECRET")], "keys only as a file"
        else:
            assert "s3-credentials" not in volumes
            assert "AWS_SHARED_CREDENTIALS_FILE" not in env


def test_pools_and_gpus_differ_per_stage_in_production_values():
    jobs = stage_jobs("default")
    selector = {s: j["spec"]["template"]["spec"]["nodeSelector"] for s, j in jobs.items()}
    assert selector["train"] == {"codeq.io/pool": "train"}
    assert selector["collect"] == selector["evaluate"] == {"codeq.io/pool": "infer"}
    gpus = {
        s: j["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]
        for s, j in jobs.items()
    }
    assert gpus["collect"] == gpus["train"] == gpus["evaluate"] == 1
    irsa_train = stage_jobs("irsa")["train"]["spec"]["template"]["spec"]["containers"][0]
    assert irsa_train["resources"]["requests"]["memory"] == "512Gi"
    assert irsa_train["resources"]["limits"]["nvidia.com/gpu"] == 1


def test_identity_mode_annotates_the_service_account_and_creates_no_secret():
    objs = objects("irsa")
    assert not [o for o in objs if o["kind"] == "Secret"]
    (sa,) = [
        o for o in objs if o["kind"] == "ServiceAccount" and o["metadata"]["name"].endswith("-jobs")
    ]
    assert sa["metadata"]["annotations"]["eks.amazonaws.com/role-arn"].startswith("arn:aws:iam::")
    assert sa["automountServiceAccountToken"] is False


def test_network_policy_denies_by_default_and_allows_dns_and_s3():
    (policy,) = [o for o in objects("default") if o["kind"] == "NetworkPolicy"]
    spec = policy["spec"]
    assert spec["policyTypes"] == ["Ingress", "Egress"] and spec["ingress"] == []
    assert spec["podSelector"]["matchLabels"]["codeq.io/job"] == "true"
    assert [p["port"] for p in spec["egress"][0]["ports"]] == [53, 53]
    assert spec["egress"][1]["ports"] == [{"protocol": "TCP", "port": 443}]
    assert "169.254.169.254/32" in spec["egress"][1]["to"][0]["ipBlock"]["except"]
    job_labels = stage_jobs("default")["collect"]["spec"]["template"]["metadata"]["labels"]
    assert spec["podSelector"]["matchLabels"].items() <= job_labels.items()
    (kind_policy,) = [o for o in objects("kind") if o["kind"] == "NetworkPolicy"]
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
    assert not [r for r in role["rules"] if "*" in r["verbs"] or "secrets" in r["resources"]]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_configmap_holds_a_config_codeq_accepts(scenario, tmp_path, monkeypatch):
    from codeq.config import load_config

    for key in [k for k in os.environ if k.startswith("CODEQ_")]:
        monkeypatch.delenv(key)
    (cm,) = [o for o in objects(scenario) if o["kind"] == "ConfigMap"]
    path = tmp_path / "config.yaml"
    path.write_text(cm["data"]["config.yaml"])
    config = load_config(path)
    values = deep_merge(helm.Chart.load(CHART).values, scenario_values(scenario))
    assert config.policy.model == values["config"]["policy"]["model"]


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


# ----------------------------------------------------------------------------- checkov


def find_tool(name: str) -> str:
    local = REPO / ".tools" / name / "bin" / name
    found = str(local) if local.exists() else shutil.which(name)
    if found:
        return found
    message = f"{name} not found in .tools/{name}/bin or on PATH (run `make setup-tools`)"
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)


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
    summary = {"passed": 0, "failed": 0, "skipped": 0, "failed_checks": [], "skipped_checks": []}
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
    return summary


@pytest.fixture(scope="session")
def chart_checkov(tmp_path_factory):
    """checkov once over every scenario's rendered objects plus the Jobs inside the
    WorkflowTemplate (checkov cannot see into Argo resource templates by itself)."""
    out = tmp_path_factory.mktemp("rendered")
    for scenario in SCENARIOS:
        for obj in objects(scenario):
            name = f"{scenario}-{obj['kind']}-{obj['metadata']['name']}.yaml".lower()
            (out / name).write_text(yaml.safe_dump(obj))
        for stage, job in stage_jobs(scenario).items():
            job = copy.deepcopy(job)
            job["metadata"]["name"] = job["metadata"].pop("generateName") + "x"
            (out / f"{scenario}-job-{stage}.yaml").write_text(yaml.safe_dump(job))
    return run_checkov(out, "kubernetes")


def test_checkov_passes_on_the_rendered_chart(chart_checkov):
    assert chart_checkov["passed"] > 100
    assert chart_checkov["failed"] == 0, chart_checkov["failed_checks"]


def test_every_checkov_skip_carries_a_reason(chart_checkov):
    """Skips live as `checkov.io/skipN: CHECK=reason` annotations on the rendered Jobs; checkov
    drops the reason from its report, so the reasons are read from the manifests themselves."""
    reasons: dict[str, set[str]] = {}
    for scenario in SCENARIOS:
        for job in stage_jobs(scenario).values():
            for key, value in job["metadata"].get("annotations", {}).items():
                if key.startswith("checkov.io/skip"):
                    check, _, reason = value.partition("=")
                    assert len(reason.strip()) > 40, value
                    reasons.setdefault(check, set()).add(reason)
    skipped = {c["check_id"] for c in chart_checkov["skipped_checks"]}
    assert skipped, "expected the documented sandbox/tag skips"
    assert skipped <= set(reasons), skipped - set(reasons)
    assert skipped == {"CKV_K8S_43", "CKV_K8S_31", "CKV_K8S_15"}


# ----------------------------------------------------------------------------- Argo conditions


def gjson_get(document: Any, path: str) -> Any:
    """The subset of gjson paths the conditions use: dotted keys and numeric array indexes."""
    for part in path.split("."):
        if isinstance(document, list) and part.isdigit() and int(part) < len(document):
            document = document[int(part)]
        elif isinstance(document, dict) and part in document:
            document = document[part]
        else:
            return None
    return document


def condition_matches(condition: str, document: dict[str, Any]) -> bool:
    """Argo evaluates resource conditions as Kubernetes label selectors over gjson lookups."""
    matched = []
    for requirement in re.split(r",(?![^()]*\))", condition):
        requirement = requirement.strip()
        if m := re.fullmatch(r"([\w./-]+) in \(([^)]*)\)", requirement):
            value = gjson_get(document, m.group(1))
            matched.append(value is not None and str(value) in m.group(2).split(","))
        elif m := re.fullmatch(r"([\w./-]+) (==|!=|>|<) (\S+)", requirement):
            value = gjson_get(document, m.group(1))
            op, expected = m.group(2), m.group(3)
            if op in (">", "<"):
                matched.append(
                    value is not None
                    and (int(value) > int(expected) if op == ">" else int(value) < int(expected))
                )
            else:
                matched.append((str(value) == expected) == (op == "=="))
        elif re.fullmatch(r"[\w./-]+", requirement):
            matched.append(gjson_get(document, requirement) is not None)
        else:
            raise AssertionError(f"unsupported requirement {requirement!r}")
    return all(matched)


@pytest.mark.parametrize(
    ("status", "outcome"),
    [
        ({"active": 1, "startTime": "t"}, "waiting"),
        (
            {
                "conditions": [
                    {"type": "SuccessCriteriaMet", "status": "True"},
                    {"type": "Complete", "status": "True"},
                ],
                "completionTime": "t",
                "succeeded": 1,
            },
            "succeeded",
        ),
        (
            {
                "conditions": [
                    {"type": "FailureTarget", "status": "True"},
                    {"type": "Failed", "status": "True"},
                ],
                "failed": 3,
            },
            "failed",
        ),
        ({"conditions": [{"type": "Failed", "status": "True"}], "failed": 3}, "failed"),
        ({"active": 2, "failed": 2, "failedIndexes": "1"}, "waiting"),
    ],
)
def test_resource_conditions_follow_the_jobs_terminal_state(status, outcome):
    resource = workflow_template("default")["spec"]["templates"][1]["resource"]
    job = {"kind": "Job", "status": status}
    failed = condition_matches(resource["failureCondition"], job)
    succeeded = condition_matches(resource["successCondition"], job)
    assert {"failed": (True, False), "succeeded": (False, True), "waiting": (False, False)}[
        outcome
    ] == (
        failed,
        succeeded,
    )
