"""What a user submits (argo/round.yaml: a round; argo/rounds.yaml: several in one submission)
and its README, checked against the chart."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from test_chart_validation import argo_errors
from test_helm import STAGES, deep_merge, workflow_template

helm = pytest.importorskip("helm_python")

REPO = Path(__file__).resolve().parent.parent
ROUND = REPO / "argo" / "round.yaml"
ROUNDS = REPO / "argo" / "rounds.yaml"
README = REPO / "argo" / "README.md"


def test_round_workflow_valid_under_strict_argo_schema():
    assert not argo_errors(yaml.safe_load(ROUND.read_text()), kind="Workflow")


def test_round_workflow_refers_to_the_charts_template_and_overrides_no_default():
    """Parameters the Workflow lists would override the template's defaults (round "next", the
    chart's run name); `argo submit -p NAME=VALUE` adds them when wanted."""
    workflow = yaml.safe_load(ROUND.read_text())
    template = workflow_template("default")
    assert workflow["kind"] == "Workflow" and "generateName" in workflow["metadata"]
    assert workflow["spec"]["workflowTemplateRef"]["name"] == template["metadata"]["name"]
    assert "arguments" not in workflow["spec"]
    declared = [p["name"] for p in template["spec"]["arguments"]["parameters"]]
    assert declared == ["round", "run", "force", "rounds"]


def test_rounds_workflow_valid_under_strict_argo_schema():
    assert not argo_errors(yaml.safe_load(ROUNDS.read_text()), kind="Workflow")


def test_rounds_workflow_asks_the_charts_template_for_rounds_only_within_max_rounds():
    workflow = yaml.safe_load(ROUNDS.read_text())
    template = workflow_template("default")
    assert workflow["kind"] == "Workflow" and "generateName" in workflow["metadata"]
    assert workflow["spec"]["workflowTemplateRef"]["name"] == template["metadata"]["name"]
    (parameter,) = workflow["spec"]["arguments"]["parameters"]
    assert parameter["name"] == "rounds"
    maximum = int(_max_rounds(template))
    assert 1 < int(parameter["value"]) <= maximum


def _max_rounds(template: dict) -> str:
    (step,) = [t for t in template["spec"]["templates"] if t["name"] == "resolve-round"]
    args = step["container"]["args"]
    return args[args.index("--max-rounds") + 1]


def test_rounds_workflow_opens_with_its_dag():
    text = ROUNDS.read_text()
    drawing = text.split("\napiVersion:", 1)[0]
    assert all(line.startswith("#") for line in drawing.splitlines())
    steps = ["fence", "resolve-round", "rounds(", *STAGES, "continue", "next: rounds("]
    dag = drawing.index("main (DAG)")
    positions = [drawing.index(step, dag) for step in steps]
    assert positions == sorted(positions), "drawn in the order they run"
    assert "when: result != stop" in drawing
    assert "argo submit -n codeq argo/rounds.yaml" in drawing


def test_readme_opens_with_the_dag_and_explains_submit():
    text = README.read_text()
    first_block = re.search(r"```\n(.*?)```", text, flags=re.S)
    assert first_block and text.index("```") < 40, "the README opens with a drawing"
    drawing = first_block.group(1)
    positions = [drawing.index(stage) for stage in ["resolve-round", *STAGES]]
    assert positions == sorted(positions), "stages drawn in DAG order"
    assert "argo submit -n codeq argo/round.yaml --watch" in text
    assert "helm install codeq helm/codeq" in text


def test_readme_shows_n_rounds_logs_and_stopping():
    text = README.read_text()
    assert "argo submit -n codeq argo/rounds.yaml" in text
    assert "-p rounds=3" in text and "config.promotion.patience" in text
    for command in (
        "argo logs -n codeq <workflow> -l codeq.io/stage=collect",
        "kubectl -n codeq get jobs -l codeq.io/outcome=failed",
        "argo stop -n codeq <workflow>",
        "argo delete -n codeq",
    ):
        assert command in text, command
    for reason in ("BackoffLimitExceeded", "DeadlineExceeded", "PodFailurePolicy"):
        assert reason in text, reason


def test_readme_helm_flags_name_real_values():
    """Every `--set key=value` in the README is accepted by the chart's schema and renders,
    together with the other flags of its command (one line once continuations are joined)."""
    text = README.read_text().replace("\\\n", " ")
    commands = [re.findall(r"--set(-string)?\s+([^\s`]+)", line) for line in text.splitlines()]
    commands = [flags for flags in commands if flags]
    assert sum(map(len, commands)) >= 6
    with helm.Chart.load(REPO / "helm" / "codeq") as chart:
        for flags in commands:
            values = deep_merge(chart.values, {"s3Credentials": {"existingSecret": "codeq-s3"}})
            for is_string, expression in flags:
                expression = re.sub(r"<[^>]+>", "example", expression)
                parse = helm.parse_set_string_values if is_string else helm.parse_set_string
                values = deep_merge(values, parse(expression))
            chart.validate_schema(values)
            chart.render(values=values, name="codeq", namespace="codeq")
