"""Spec run: the chart's rendered Jobs, executed in DAG order as local processes.

Each Job's container command, args and env come straight from the rendered WorkflowTemplate (Argo
parameters substituted as Argo would), ConfigMap and Secret volumes are materialised from the
rendered objects, emptyDirs become temporary folders, and the paths the env points into are mapped
onto them. The collect Indexed Job runs once per index with JOB_COMPLETION_INDEX set, as Kubernetes
does. The store is a moto S3 server on 127.0.0.1; the config is a tiny round with the tiny model.
A round completing here proves the specs are wired right: commands, env, config mount,
credentials file, sharding and stage order."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_helm import STAGES, deep_merge, scenario_values, substitute

from tests import twin

helm = pytest.importorskip("helm_python")
moto_server = pytest.importorskip("moto.server")
boto3 = pytest.importorskip("boto3")

REPO = Path(__file__).resolve().parent.parent
CHART = REPO / "helm" / "codeq"
BUCKET = "codeq-spec"
WORKFLOW = {
    "workflow.name": "codeq-round-spec1",
    "workflow.parameters.run": "spec",
    "workflow.parameters.force": "false",
    "workflow.status": "Running",
}
ACCESS_KEY, SECRET_KEY = "spec-access-key", "spec-secret-key"  # moto accepts any


def tiny_round_config(model_dir: Path) -> dict[str, Any]:
    return {
        "tasks": {
            "source": "builtin",
            "max_items": 6,
            "hidden_tests_per_task": 2,
            "mutation_attempts": 10,
        },
        "sandbox": {"backend": "auto", "workers": 1},
        "policy": {
            "model": str(model_dir),
            "device": "cpu",
            "dtype": "float32",
            "quantization": "none",
            "batch_size": 8,
            "max_new_tokens": 24,
            "max_prompt_tokens": 1024,
            "critique_max_new_tokens": 8,
        },
        "search": {
            "rollouts": 1,
            "rewrites_per_expansion": 2,
            "max_depth": 1,
            "parallel_trees": 4,
            "bon_samples": 2,
            "temperature": 1.0,
        },
        "pairs": {"min_value_gap": 0.0},
        "train": {
            "lora_r": 4,
            "lora_alpha": 8,
            "per_device_batch_size": 1,
            "gradient_accumulation_steps": 1,
            "max_steps": 2,
            "max_length": 1024,
            "learning_rate": 1e-3,
            "precision": "fp32",
            "eval_fraction": 0.0,
        },
        "evaluate": {"modes": ["zero_shot"], "rollout_ablation": [1], "max_tasks": 2},
    }


def render_round(endpoint: str, model_dir: Path, round_number: int) -> list[dict[str, Any]]:
    values = deep_merge(
        scenario_values("default"),
        {
            "store": {
                "uri": f"s3://{BUCKET}/codeq",
                "endpointUrl": endpoint,
                "region": "us-east-1",
            },
            "s3Credentials": {
                "mode": "secret",
                "create": {"accessKeyId": ACCESS_KEY, "secretAccessKey": SECRET_KEY},
            },
            "stages": {"collect": {"shards": 2}},
            "jobs": {"extraEnv": [{"name": "HF_HUB_OFFLINE", "value": "1"}]},
            "config": tiny_round_config(model_dir),
        },
    )
    with helm.Chart.load(CHART) as chart:
        rendered = chart.render(values=values, name="codeq", namespace="codeq", is_install=True)
    return [
        doc
        for name, text in sorted(rendered.items())
        if name.endswith(".yaml")
        for doc in yaml.safe_load_all(text)
        if doc
    ]


def dag_order(workflow_template: dict[str, Any], name: str = "") -> list[str]:
    """Templates of a DAG (default: the entrypoint) in dependency order (a topological sort of
    `depends`)."""
    spec = workflow_template["spec"]
    templates = {t["name"]: t for t in spec["templates"]}
    dag = templates[name or spec["entrypoint"]]["dag"]
    return [task["template"] for task in twin.dag_order(dag)]


class LocalPod:
    """A pod spec's one container as a local process: volumes as folders, env paths mapped."""

    def __init__(self, job: dict[str, Any], objects: list[dict[str, Any]], root: Path) -> None:
        self.job = job
        pod = job["spec"]["template"]["spec"]
        (self.container,) = pod["containers"]
        by_kind = {(o["kind"], o["metadata"]["name"]): o for o in objects}
        volumes = {v["name"]: v for v in pod["volumes"]}
        self.mounts: dict[str, Path] = {}
        for mount in self.container["volumeMounts"]:
            volume = volumes[mount["name"]]
            local = root / mount["name"]
            local.mkdir(parents=True, exist_ok=True)
            if "configMap" in volume:
                cm = by_kind[("ConfigMap", volume["configMap"]["name"])]
                for key, text in cm["data"].items():
                    (local / key).write_text(text)
            elif "secret" in volume:
                secret = by_kind[("Secret", volume["secret"]["secretName"])]
                data = dict(secret.get("stringData", {}))
                data.update(
                    {k: base64.b64decode(v).decode() for k, v in secret.get("data", {}).items()}
                )
                for key, text in data.items():
                    (local / key).write_text(text)
            else:
                assert "emptyDir" in volume, f"volume {mount['name']} cannot run locally"
            self.mounts[mount["mountPath"]] = local
        self.objects = by_kind

    def local_path(self, value: str) -> str:
        for mount_path in sorted(self.mounts, key=len, reverse=True):
            if value == mount_path or value.startswith(mount_path + "/"):
                return str(self.mounts[mount_path]) + value[len(mount_path) :]
        return value

    def env(self) -> dict[str, str]:
        env = {"PATH": os.environ["PATH"], "LANG": "C.UTF-8"}
        for var in self.container.get("env", []):
            if "value" in var:
                env[var["name"]] = self.local_path(var["value"])
            else:
                ref = var["valueFrom"].get("configMapKeyRef") or var["valueFrom"]["secretKeyRef"]
                kind = "ConfigMap" if "configMapKeyRef" in var["valueFrom"] else "Secret"
                obj = self.objects[(kind, ref["name"])]
                data = obj.get("data", {}) if kind == "ConfigMap" else obj.get("stringData", {})
                env[var["name"]] = data[ref["key"]]
        return env

    def run(self, extra_env: dict[str, str], log: Path) -> int:
        command = [*self.container.get("command", []), *self.container.get("args", [])]
        assert command[0] == "python", command
        command[0] = sys.executable
        with log.open("w") as out:
            return subprocess.run(
                command,
                env={**self.env(), **extra_env, "PYTHONPATH": str(REPO)},
                cwd=self.local_path(self.container["workingDir"]),
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=900,
            ).returncode


@pytest.fixture()
def moto_s3():
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
    ).create_bucket(Bucket=BUCKET)
    yield endpoint
    server.stop()


def run_round(
    endpoint: str, model_dir: Path, round_number: int, work: Path
) -> tuple[list[str], dict[str, LocalPod]]:
    objects = render_round(endpoint, model_dir, round_number)
    (workflow_template,) = [o for o in objects if o["kind"] == "WorkflowTemplate"]
    templates = {t["name"]: t for t in workflow_template["spec"]["templates"]}
    assert dag_order(workflow_template) == ["fence", "resolve-round", "rounds"]
    assert dag_order(workflow_template, "round") == STAGES  # the fence talks to the API only
    # resolve-round's output (tests/test_helm.py runs that step) is every stage's round input.
    table = {**WORKFLOW, "inputs.parameters.round": str(round_number)}
    ran, pods = [], {}
    for stage in STAGES:
        manifest = substitute(templates[f"{stage}-start"]["resource"]["manifest"], table)
        job = yaml.safe_load(manifest)
        spec = job["spec"]
        indexes = range(spec["completions"]) if spec.get("completionMode") == "Indexed" else [None]
        for index in indexes:
            name = stage if index is None else f"{stage}-{index}"
            pod = LocalPod(job, objects, work / f"round-{round_number}" / name)
            pods[stage] = pod
            extra = {} if index is None else {"JOB_COMPLETION_INDEX": str(index)}
            log = work / f"round-{round_number}-{name}.log"
            code = pod.run(extra, log)
            if code != 0:
                pytest.fail(f"job {name} exited {code}:\n{log.read_text()[-4000:]}")
            ran.append(name)
    return ran, pods


@pytest.mark.slow
def test_rendered_jobs_complete_a_round_against_s3(moto_s3, tiny_model_dir, tmp_path):
    ran, pods = run_round(moto_s3, tiny_model_dir, 0, tmp_path)
    assert ran == [
        "prepare",
        "collect-0",
        "collect-1",
        "verifier",  # codeq's default: the learned verifier (here nothing to learn from, or little)
        "pairs",
        "train",
        "evaluate",
        "promote",
        "report",
    ]

    s3 = boto3.client(
        "s3",
        endpoint_url=moto_s3,
        region_name="us-east-1",
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
    )
    keys = {
        obj["Key"]
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET)
        for obj in page.get("Contents", [])
    }
    base = "codeq/runs/spec/round-0"
    for stage_output in [
        "tasks",
        "trajectories/shard-0",
        "trajectories/shard-1",
        "pairs",
        "adapter",
        "eval",
        "report",
    ]:
        assert f"{base}/{stage_output}/_COMPLETE" in keys, (stage_output, sorted(keys)[:40])
        assert f"{base}/{stage_output}/MANIFEST.json" in keys, stage_output
    shard = json.loads(
        s3.get_object(Bucket=BUCKET, Key=f"{base}/trajectories/shard-1/_COMPLETE")["Body"].read()
    )
    assert shard["shard_count"] == 2
    assert any(k.startswith(f"{base}/report/") and k.endswith("index.html") for k in keys)

    # Resubmitting a round reruns finished stages as no-ops (the store has their markers).
    log = tmp_path / "rerun-prepare.log"
    assert pods["prepare"].run({}, log) == 0
    assert "already complete" in log.read_text()

    # A shard index outside the Job's completions is bad input: the exit code is one the
    # collect Job's podFailurePolicy turns into FailIndex (no retries).
    collect = pods["collect"]
    rule = collect.job["spec"]["podFailurePolicy"]["rules"][1]
    code = collect.run({"JOB_COMPLETION_INDEX": "7"}, tmp_path / "bad-index.log")
    assert rule["action"] == "FailIndex" and code in rule["onExitCodes"]["values"], code
