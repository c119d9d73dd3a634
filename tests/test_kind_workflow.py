"""The hosted kind workflow (.github/workflows/kind.yml) agrees with the files it uses: images it
builds are the ones kind-values.yaml runs, the bucket MinIO creates is the chart's store, and
every file it names exists. Runs everywhere (no cluster needed)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
WORKFLOW = REPO / ".github" / "workflows" / "kind.yml"


def steps() -> list[dict]:
    workflow = yaml.safe_load(WORKFLOW.read_text())
    (job,) = workflow["jobs"].values()
    return job["steps"]


def script() -> str:
    return "\n".join(step.get("run", "") for step in steps())


def test_workflow_builds_and_loads_the_images_kind_values_uses():
    values = yaml.safe_load((REPO / "helm" / "codeq" / "ci" / "kind-values.yaml").read_text())
    text = script()
    for name, dockerfile in (("infer", "Dockerfile.infer"), ("train", "Dockerfile.train")):
        image = f"{values['images'][name]['repository']}:{values['images'][name]['tag']}"
        assert f"docker build -f {dockerfile} --build-arg VARIANT=cpu -t {image} ." in text
        assert image in re.search(r"kind load docker-image .*", text).group(0)
    assert values["images"]["pullPolicy"] == "IfNotPresent"


def test_minio_bucket_and_endpoint_match_the_charts_store():
    values = yaml.safe_load((REPO / "helm" / "codeq" / "ci" / "kind-values.yaml").read_text())
    bucket = values["store"]["uri"].removeprefix("s3://").split("/")[0]
    minio = list(yaml.safe_load_all((REPO / "tests" / "kind" / "minio.yaml").read_text()))
    (bucket_job,) = [d for d in minio if d["kind"] == "Job"]
    assert f"local/{bucket}" in bucket_job["spec"]["template"]["spec"]["containers"][0]["args"][0]
    (service,) = [d for d in minio if d["kind"] == "Service"]
    namespace = yaml.safe_load(WORKFLOW.read_text())["env"]["NAMESPACE"]
    assert (
        values["store"]["endpointUrl"]
        == f"http://{service['metadata']['name']}.{namespace}.svc.cluster.local:9000"
    )
    (deployment,) = [d for d in minio if d["kind"] == "Deployment"]
    assert (
        deployment["spec"]["template"]["metadata"]["labels"]
        == values["networkPolicy"]["s3"]["podSelector"]
    )


def test_every_file_the_workflow_names_exists_and_argo_is_pinned():
    text = script()
    for path in re.findall(r"(?:-f|--config) ((?:tests|helm|argo)/\S+)", text):
        assert (REPO / path).exists(), path
    assert "pytest -m kind tests/test_kind.py" in text
    env = yaml.safe_load(WORKFLOW.read_text())["env"]
    assert env["CODEQ_KIND"] == "1", "in the hosted job a missing cluster fails instead of skipping"
    for tool in ("KIND_VERSION", "KUBECTL_VERSION", "HELM_VERSION", "ARGO_VERSION"):
        assert re.fullmatch(r"v\d+\.\d+\.\d+", env[tool]), tool
