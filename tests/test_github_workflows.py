"""The image publishing workflow (.github/workflows/images.yml): it builds both Dockerfiles,
pushes them by digest to the registry the user names, and writes chart values that pin those
digests, values the chart accepts and renders into every stage. (checkov's GitHub Actions checks
run in tests/test_chart_validation.py.)"""

from __future__ import annotations

import re
from pathlib import Path
from string import Template

import pytest
import yaml
from test_helm import (
    ARGO_SAMPLE,
    CHART,
    NAMESPACE,
    RELEASE,
    STAGES,
    TRAIN_IMAGE_STAGES,
    deep_merge,
    scenario_values,
    substitute,
)

helm = pytest.importorskip("helm_python")

REPO = Path(__file__).resolve().parent.parent
WORKFLOW = REPO / ".github" / "workflows" / "images.yml"


def job() -> dict:
    workflow = yaml.safe_load(WORKFLOW.read_text())
    (only,) = workflow["jobs"].values()
    return only


def step(name_part: str) -> dict:
    (found,) = [s for s in job()["steps"] if name_part in s.get("name", "")]
    return found


def test_both_images_are_built_and_pushed_by_digest_to_the_named_registry():
    for image, dockerfile in (
        ("codeq-infer", "Dockerfile.infer"),
        ("codeq-train", "Dockerfile.train"),
    ):
        build = step(f"Build and push {image}")
        assert build["uses"].startswith("docker/build-push-action@")
        assert build["with"]["file"] == dockerfile and (REPO / dockerfile).is_file()
        outputs = build["with"]["outputs"]
        assert f"name=${{{{ steps.registry.outputs.name }}}}/{image}" in outputs
        assert "push-by-digest=true" in outputs and "push=true" in outputs
    assert job()["env"]["CODEQ_REGISTRY"] == "${{ vars.CODEQ_REGISTRY }}"
    assert "ghcr.io/${OWNER}" in step("Name the registry")["run"]


def test_the_workflow_takes_no_free_form_inputs_and_writes_only_packages():
    workflow = yaml.safe_load(WORKFLOW.read_text())
    triggers = workflow[True]  # PyYAML reads the key `on` as True
    assert triggers["workflow_dispatch"] is None, "no dispatch inputs (checkov CKV_GHA_7)"
    assert workflow["permissions"] == {"contents": "read"}
    assert job()["permissions"] == {"contents": "read", "packages": "write"}


def written_values(infer: str, train: str) -> dict:
    script = step("Write the chart values")["run"]
    heredoc = re.search(r"<<EOF\n(.*?)\nEOF", script, flags=re.S)
    assert heredoc, "the values file is written by a heredoc"
    text = Template(heredoc.group(1)).substitute(
        GITHUB_REPOSITORY="acme/codeq",
        GITHUB_SHA="0" * 40,
        REGISTRY="ghcr.io/acme",
        INFER_DIGEST=infer,
        TRAIN_DIGEST=train,
    )
    return yaml.safe_load(text)


def test_the_written_values_pin_both_digests_in_every_stage():
    infer, train = "sha256:" + "1" * 64, "sha256:" + "2" * 64
    pinned = written_values(infer, train)
    with helm.Chart.load(CHART) as chart:
        values = deep_merge(deep_merge(chart.values, scenario_values("default")), pinned)
        chart.validate_schema(values)
        rendered = chart.render(values=values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    (wt,) = [
        doc for doc in yaml.safe_load_all(rendered["codeq/templates/workflowtemplate.yaml"]) if doc
    ]
    manifests = {
        t["name"].removesuffix("-start"): yaml.safe_load(
            substitute(t["resource"]["manifest"], ARGO_SAMPLE)
        )
        for t in wt["spec"]["templates"]
        if t.get("resource", {}).get("action") == "apply"
    }
    assert sorted(manifests) == sorted(STAGES)
    for stage, manifest in manifests.items():
        image = manifest["spec"]["template"]["spec"]["containers"][0]["image"]
        expected = (
            f"ghcr.io/acme/codeq-train@{train}"
            if stage in TRAIN_IMAGE_STAGES
            else f"ghcr.io/acme/codeq-infer@{infer}"
        )
        assert image == expected, stage
        assert not any(k == "checkov.io/skip1" for k in manifest["metadata"]["annotations"])


def test_a_malformed_digest_stops_the_run_before_values_are_written():
    script = step("Write the chart values")["run"]
    assert "^sha256:[a-f0-9]{64}$" in script
    assert script.index("bad digest") < script.index("cat > images-values.yaml")
