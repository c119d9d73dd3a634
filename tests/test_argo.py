"""What a user submits each round (argo/round.yaml) and its README, checked against the chart."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from test_helm import STAGES, argo_validator, deep_merge, strict, workflow_template

helm = pytest.importorskip("helm_python")

REPO = Path(__file__).resolve().parent.parent
ROUND = REPO / "argo" / "round.yaml"
README = REPO / "argo" / "README.md"


def workflow_validator():
    template_validator = argo_validator()  # skips (or fails under CI) without the schema
    definitions = template_validator.schema["definitions"]
    import jsonschema

    return jsonschema.Draft7Validator(
        {
            "definitions": strict(definitions),
            "$ref": "#/definitions/io.argoproj.workflow.v1alpha1.Workflow",
        }
    )


def test_round_workflow_valid_under_strict_argo_schema():
    workflow = yaml.safe_load(ROUND.read_text())
    errors = list(workflow_validator().iter_errors(workflow))
    assert not errors, [f"{list(e.absolute_path)}: {e.message}" for e in errors[:5]]


def test_round_workflow_refers_to_the_charts_template_with_its_parameters():
    workflow = yaml.safe_load(ROUND.read_text())
    template = workflow_template("default")
    assert workflow["kind"] == "Workflow" and "generateName" in workflow["metadata"]
    assert workflow["spec"]["workflowTemplateRef"]["name"] == template["metadata"]["name"]
    submitted = [p["name"] for p in workflow["spec"]["arguments"]["parameters"]]
    declared = [p["name"] for p in template["spec"]["arguments"]["parameters"]]
    assert submitted == declared == ["round", "run"]
    (round_parameter,) = [
        p for p in workflow["spec"]["arguments"]["parameters"] if p["name"] == "round"
    ]
    assert "value" not in round_parameter, "round must come from `argo submit -p round=N`"


def test_readme_opens_with_the_dag_and_explains_submit():
    text = README.read_text()
    first_block = re.search(r"```\n(.*?)```", text, flags=re.S)
    assert first_block and text.index("```") < 40, "the README opens with a drawing"
    drawing = first_block.group(1)
    positions = [drawing.index(stage) for stage in STAGES]
    assert positions == sorted(positions), "stages drawn in DAG order"
    assert "argo submit -n codeq argo/round.yaml -p round=0" in text
    assert "helm install codeq helm/codeq" in text


def test_readme_helm_flags_name_real_values():
    """Every `--set key=value` in the README is accepted by the chart's schema and renders."""
    text = README.read_text().replace("\\\n", " ")
    flags = re.findall(r"--set(-string)?\s+([^\s`]+)", text)
    assert len(flags) >= 4
    with helm.Chart.load(REPO / "helm" / "codeq") as chart:
        for is_string, expression in flags:
            expression = re.sub(r"<[^>]+>", "example", expression)
            parse = helm.parse_set_string_values if is_string else helm.parse_set_string
            values = deep_merge(chart.values, parse(expression))
            values = deep_merge(values, {"s3Credentials": {"existingSecret": "codeq-s3"}})
            chart.validate_schema(values)
            chart.render(values=values, name="codeq", namespace="codeq")
