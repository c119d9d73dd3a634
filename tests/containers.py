"""Docker helpers for the image tests and the container twin of the cluster: find a Docker client
that builds with BuildKit, start and stop a daemon, build the images (images/build.sh), render
the chart with real Helm, and turn a rendered pod's container into `docker run` arguments with the
same user, capabilities, privilege escalation, read-only root, seccomp profile, volumes, env and
limits. A setting the mapping cannot honour is a SpecError naming the container and the setting,
never silently dropped.

Also a small CLI for .ci/run:  python3 -m tests.containers daemon start|stop --state DIR
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
CHART = REPO / "helm" / "codeq"
SECCOMP_DIR = CHART / "files" / "seccomp"
SANDBOX_SECCOMP = SECCOMP_DIR / "codeq-sandbox.json"
CACHE = REPO / ".cache"
IMAGES = ("infer", "train")
# What a submitted workflow substitutes for Argo's expressions in the Job manifests.
ARGO_SAMPLE = {
    "workflow.name": "codeq-round-x7k2p",
    "workflow.namespace": "codeq",
    "workflow.uid": "00000000-0000-0000-0000-000000000000",
    "workflow.parameters.round": "0",
    "workflow.parameters.run": "default",
    "workflow.parameters.force": "false",
    "workflow.status": "Failed",
    "inputs.parameters.round": "0",
}


class SpecError(Exception):
    """A rendered pod spec that cannot be run as it says (names the container and the field)."""


# ------------------------------------------------------------------------------ client, daemon


def docker_client() -> str | None:
    """$DOCKER, else Debian's /usr/bin/docker (20.10, BuildKit built in; a newer client found
    first on PATH may lack the buildx plugin that BuildKit needs there), else `docker`."""
    if os.environ.get("DOCKER"):
        return os.environ["DOCKER"]
    if os.access("/usr/bin/docker", os.X_OK):
        return "/usr/bin/docker"
    return shutil.which("docker")


def docker(
    *args: str, timeout: float = 120, check: bool = True, input: str | None = None
) -> subprocess.CompletedProcess[str]:
    client = docker_client()
    if client is None:
        raise FileNotFoundError("no docker client (apt-get install docker.io)")
    result = subprocess.run(
        [client, *args], capture_output=True, text=True, timeout=timeout, input=input
    )
    if check and result.returncode != 0:
        raise subprocess.CalledProcessError(
            result.returncode, result.args, result.stdout, result.stderr
        )
    return result


def engine_problem() -> str | None:
    """Why Docker cannot be used here, or None when a client reaches a daemon."""
    if docker_client() is None:
        return "no docker client (apt-get install docker.io)"
    try:
        info = docker("info", timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"docker info failed: {error}"
    if info.returncode != 0:
        said = [line for line in (info.stdout + info.stderr).splitlines() if "Cannot" in line]
        return f"no Docker daemon reachable ({(said or ['docker info failed'])[0].strip()})"
    return None


@dataclass
class Daemon:
    """A dockerd this process started (and only that one is ever stopped)."""

    state: Path
    pid: int | None = None

    @property
    def pidfile(self) -> Path:
        return self.state / "dockerd.pid"

    def start(self, timeout: float = 90) -> bool:
        """Start dockerd (overlay2) unless a daemon already answers; True if we started it."""
        if engine_problem() is None:
            return False
        dockerd = shutil.which("dockerd") or "/usr/sbin/dockerd"
        self.state.mkdir(parents=True, exist_ok=True)
        with open(self.state / "dockerd.log", "ab") as log:
            process = subprocess.Popen(
                [dockerd, "--storage-driver=overlay2"],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.pid = process.pid
        self.pidfile.write_text(str(process.pid))
        deadline = time.monotonic() + timeout
        while (problem := engine_problem()) is not None:
            if process.poll() is not None or time.monotonic() > deadline:
                tail = (self.state / "dockerd.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"dockerd did not start ({problem}):\n{tail}")
            time.sleep(0.5)
        return True

    def stop(self, timeout: float = 30) -> None:
        pid = self.pid or (int(self.pidfile.read_text()) if self.pidfile.exists() else None)
        if pid is None:
            return
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        else:
            deadline = time.monotonic() + timeout
            while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
                with contextlib.suppress(ChildProcessError):  # reap it if it is our child
                    os.waitpid(pid, os.WNOHANG)
                time.sleep(0.2)
        self.pidfile.unlink(missing_ok=True)
        self.pid = None


# ----------------------------------------------------------------------------------- build


def build_images(
    variant: str = "cpu", tag: str | None = None, base: str | None = None, timeout: float = 3000
) -> dict[str, str]:
    """Build both images with images/build.sh (cached layers are reused); {name: reference}."""
    env = {**os.environ, "VARIANT": variant, "IMAGE_TAG": tag or variant}
    if base:
        env["BASE_IMAGE"] = base
    client = docker_client()
    if client:
        env["DOCKER"] = client
    result = subprocess.run(
        [str(REPO / "images" / "build.sh")],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if result.returncode != 0:
        raise RuntimeError(f"images/build.sh failed:\n{(result.stdout + result.stderr)[-6000:]}")
    return {name: f"codeq-{name}:{tag or variant}" for name in IMAGES}


def pytest_for_containers() -> Path:
    """This machine's pytest version installed into a folder (cached) that a container mounts
    read-only on its PYTHONPATH: the images carry no test tools."""
    import pytest

    target = CACHE / f"container-pytest-{pytest.__version__}"
    if not (target / "pytest").is_dir():
        partial = target.with_name(target.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        subprocess.run(
            [
                "python3",
                "-m",
                "pip",
                "install",
                "--quiet",
                "--no-compile",
                "--target",
                str(partial),
                f"pytest=={pytest.__version__}",
            ],
            check=True,
            timeout=600,
        )
        partial.rename(target)
    return target


# ------------------------------------------------------------------------------------ chart


def render_chart(values: Mapping[str, Any], release: str = "codeq") -> list[dict[str, Any]]:
    """Every object the chart renders with these values (real Helm through helm-python-sdk)."""
    import helm_python as helm
    import yaml

    with helm.Chart.load(CHART) as chart:
        rendered = chart.render(values=dict(values), name=release, namespace=release)
    found: list[dict[str, Any]] = []
    for path, text in sorted(rendered.items()):
        if path.endswith((".yaml", ".yml")):
            found.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return found


def scenario_values(scenario: str) -> dict[str, Any]:
    import yaml

    return yaml.safe_load((CHART / "ci" / f"{scenario}-values.yaml").read_text()) or {}


def substitute(text: str, table: Mapping[str, str]) -> str:
    """Replace Argo's {{expressions}}; an expression missing from `table` is a SpecError."""

    def value(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in table:
            raise SpecError(f"no value for the Argo expression {{{{{name}}}}}")
        return table[name]

    return re.sub(r"\{\{\s*([^{}]+?)\s*\}\}", value, text)


def stage_jobs(objects: Sequence[dict[str, Any]], table: Mapping[str, str]) -> dict[str, dict]:
    """{template name: Job} of the WorkflowTemplate's resource templates that create or apply
    a Job."""
    import yaml

    jobs: dict[str, dict] = {}
    for obj in objects:
        if obj.get("kind") != "WorkflowTemplate":
            continue
        for template in obj["spec"]["templates"]:
            resource = template.get("resource") or {}
            if resource.get("action") not in ("create", "apply"):
                continue
            manifest = yaml.safe_load(substitute(resource["manifest"], table))
            if manifest.get("kind") == "Job":
                jobs[template["name"]] = manifest
    return jobs


# --------------------------------------------------------------------- pod spec -> docker run

QUANTITY = re.compile(r"^(\d+(?:\.\d+)?)(m|k|M|G|T|Ki|Mi|Gi|Ti)?$")
FACTORS = {
    None: 1,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
}


def quantity(value: str | int | float, where: str) -> float:
    match = QUANTITY.match(str(value))
    if not match:
        raise SpecError(f"{where}: cannot read the quantity {value!r}")
    number, unit = float(match.group(1)), match.group(2)
    return number / 1000 if unit == "m" else number * FACTORS[unit]


@dataclass
class RunOptions:
    """What the cluster would supply beside the spec: files of configMap/secret/PVC volumes
    (by volume name), values of env vars that come from elsewhere, extra bind mounts and env
    the test adds (named, so they are visible in the command), and volumes to leave out.

    The node, where a caller models one (the container twin): `claims` maps a
    PersistentVolumeClaim's name to the host folder that backs it, `node_root` is the folder
    standing in for the node's file system (hostPath volumes live under it), `seccomp_root` the
    kubelet's seccomp root (a Localhost profile is `seccomp_root / localhostProfile`; without one
    it is looked up by file name in `seccomp_dir`), and `emptydir_root` a fresh per-pod folder
    under which disk-backed emptyDirs become folders as the kubelet makes them (without one they
    are tmpfs). `network` is the Docker network the pod joins."""

    sources: dict[str, Path] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    mounts: dict[str, str] = field(default_factory=dict)  # container path -> host path (ro)
    skip_volumes: frozenset[str] = frozenset()
    seccomp_dir: Path = SECCOMP_DIR
    seccomp_root: Path | None = None
    claims: dict[str, Path] = field(default_factory=dict)
    node_root: Path | None = None
    emptydir_root: Path | None = None
    network: str = "none"
    name: str | None = None
    labels: dict[str, str] = field(default_factory=dict)


def localhost_profile(container_name: str, seccomp: dict[str, Any], options: RunOptions) -> Path:
    """The file a Localhost seccomp profile names, as the kubelet resolves it (relative to its
    seccomp root), or by file name in options.seccomp_dir where no root is modelled."""
    relative = str(seccomp.get("localhostProfile") or "")
    if not relative or relative.startswith("/") or ".." in Path(relative).parts:
        raise SpecError(
            f"{container_name}: seccomp Localhost profile {relative!r} must be a relative path "
            "under the kubelet's seccomp root"
        )
    if options.seccomp_root is not None:
        profile = options.seccomp_root / relative
        where = f"the node's seccomp root ({options.seccomp_root})"
    else:
        profile = options.seccomp_dir / Path(relative).name
        where = str(options.seccomp_dir)
    if not profile.is_file():
        raise SpecError(
            f"{container_name}: seccomp Localhost profile {relative!r} is not in {where}; "
            "the kubelet would refuse to start the container"
        )
    return profile


def security_args(
    pod: dict[str, Any], container: dict[str, Any], options: RunOptions | Path
) -> list[str]:
    if isinstance(options, Path):
        options = RunOptions(seccomp_dir=options)
    name = container.get("name", "?")
    pod_sc = pod.get("securityContext") or {}
    sc = container.get("securityContext") or {}
    args: list[str] = []
    uid = sc.get("runAsUser", pod_sc.get("runAsUser"))
    gid = sc.get("runAsGroup", pod_sc.get("runAsGroup"))
    if sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")) and not uid:
        raise SpecError(f"{name}: runAsNonRoot without a non-zero runAsUser")
    if uid is not None:
        args += ["--user", f"{uid}:{gid if gid is not None else uid}"]
    for group in [pod_sc.get("fsGroup"), *(pod_sc.get("supplementalGroups") or [])]:
        if group is not None:
            args += ["--group-add", str(group)]
    if sc.get("privileged"):
        raise SpecError(f"{name}: privileged containers are not run")
    capabilities = sc.get("capabilities") or {}
    args += [f"--cap-drop={cap}" for cap in capabilities.get("drop") or []]
    args += [f"--cap-add={cap}" for cap in capabilities.get("add") or []]
    if sc.get("allowPrivilegeEscalation") is False:
        args += ["--security-opt", "no-new-privileges"]
    if sc.get("readOnlyRootFilesystem"):
        args.append("--read-only")
    seccomp = sc.get("seccompProfile") or pod_sc.get("seccompProfile") or {}
    kind = seccomp.get("type", "RuntimeDefault")
    if kind == "Unconfined":
        args += ["--security-opt", "seccomp=unconfined"]
    elif kind == "Localhost":
        profile = localhost_profile(name, seccomp, options)
        args += ["--security-opt", f"seccomp={profile}"]
    elif kind != "RuntimeDefault":
        raise SpecError(f"{name}: unknown seccompProfile type {kind!r}")
    # AppArmor: Docker applies its own default where the host has AppArmor; on hosts without it
    # (this one) nothing is applied either way, so the spec's profile has no Docker equivalent.
    return args


def emptydir_folder(pod: dict[str, Any], volume_name: str, root: Path) -> Path:
    """A disk-backed emptyDir as the kubelet makes it: a fresh folder on the node, writable by
    everyone, group-owned by the pod's fsGroup (setgid, so new files get that group too)."""
    folder = root / volume_name
    folder.mkdir(parents=True, exist_ok=True)
    fs_group = (pod.get("securityContext") or {}).get("fsGroup")
    mode = 0o777
    if fs_group is not None:
        os.chown(folder, -1, int(fs_group))
        mode |= 0o2000
    folder.chmod(mode)
    return folder


def host_path(volume: dict[str, Any], where: str, options: RunOptions) -> Path:
    """A hostPath volume's folder or file under options.node_root (the node's file system)."""
    spec = volume["hostPath"]
    if options.node_root is None:
        raise SpecError(f"{where}: hostPath volume {volume['name']!r} needs a node folder")
    target = options.node_root / str(spec["path"]).lstrip("/")
    kind = spec.get("type", "")
    if kind == "DirectoryOrCreate":
        target.mkdir(parents=True, exist_ok=True)  # the kubelet: 0755, owned by root
    elif kind == "Directory" and not target.is_dir():
        raise SpecError(f"{where}: hostPath {spec['path']} is not a directory on the node")
    elif kind in ("File", "FileOrCreate") and not target.is_file():
        if kind == "File":
            raise SpecError(f"{where}: hostPath {spec['path']} is not a file on the node")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.touch()
    elif not target.exists():
        raise SpecError(f"{where}: hostPath {spec['path']} does not exist on the node")
    return target


def volume_args(pod: dict[str, Any], container: dict[str, Any], options: RunOptions) -> list[str]:
    """emptyDir -> tmpfs (Memory or not; size = sizeLimit, /dev/shm -> --shm-size), owned by the
    container's user and the pod's fsGroup as kubelet makes an emptyDir writable for them (a
    plain --tmpfs over a folder of the image keeps that folder's owner), or, with
    options.emptydir_root, a disk-backed emptyDir -> a folder made as the kubelet makes it;
    configMap and secret volumes -> bind mounts of the folders in options.sources; PVCs -> the
    folders in options.claims; hostPath -> under options.node_root."""
    name = container.get("name", "?")
    pod_sc = pod.get("securityContext") or {}
    sc = container.get("securityContext") or {}
    uid = sc.get("runAsUser", pod_sc.get("runAsUser"))
    gid = pod_sc.get("fsGroup", sc.get("runAsGroup", pod_sc.get("runAsGroup")))
    owner = (f",uid={uid}" if uid is not None else "") + (f",gid={gid}" if gid is not None else "")
    volumes = {volume["name"]: volume for volume in pod.get("volumes") or []}
    args: list[str] = []
    for mount in container.get("volumeMounts") or []:
        volume = volumes.get(mount["name"])
        if volume is None:
            raise SpecError(f"{name}: volumeMount {mount['name']!r} names no volume of the pod")
        if mount["name"] in options.skip_volumes:
            continue
        path = mount["mountPath"]
        mode = "ro" if mount.get("readOnly") else "rw"
        if "emptyDir" in volume:
            spec = volume["emptyDir"] or {}
            limit = spec.get("sizeLimit")
            size = f",size={int(quantity(limit, name))}" if limit else ""
            if path == "/dev/shm":
                args += [f"--shm-size={int(quantity(limit, name))}" if limit else "--shm-size=64m"]
            elif options.emptydir_root is not None and spec.get("medium") != "Memory":
                folder = emptydir_folder(pod, mount["name"], options.emptydir_root)
                args += ["-v", f"{folder}:{path}:{mode}"]
            else:
                args += ["--tmpfs", f"{path}:rw,exec,nosuid,nodev,mode=1777{owner}{size}"]
        elif mount["name"] in options.sources:
            args += ["-v", f"{options.sources[mount['name']]}:{path}:{mode}"]
        elif "persistentVolumeClaim" in volume:
            claim = volume["persistentVolumeClaim"]["claimName"]
            if claim not in options.claims:
                raise SpecError(f"{name}: PersistentVolumeClaim {claim!r} (at {path}) is not bound")
            if volume["persistentVolumeClaim"].get("readOnly"):
                mode = "ro"
            args += ["-v", f"{options.claims[claim]}:{path}:{mode}"]
        elif "hostPath" in volume:
            args += ["-v", f"{host_path(volume, name, options)}:{path}:{mode}"]
        else:
            raise SpecError(f"{name}: no files given for volume {mount['name']!r} at {path}")
    for path, host in options.mounts.items():
        args += ["-v", f"{host}:{path}:ro"]
    return args


def env_args(container: dict[str, Any], options: RunOptions) -> list[str]:
    args: list[str] = []
    for variable in container.get("env") or []:
        key = variable["name"]
        if "value" in variable:
            value = str(variable["value"])
        elif key in options.env:
            value = options.env[key]
        else:
            raise SpecError(f"{container.get('name')}: env {key} has no value here (valueFrom)")
        args += ["-e", f"{key}={options.env.get(key, value)}"]
    declared = {variable["name"] for variable in container.get("env") or []}
    for key, value in options.env.items():
        if key not in declared:
            args += ["-e", f"{key}={value}"]
    return args


def resource_args(container: dict[str, Any]) -> list[str]:
    name = container.get("name", "?")
    limits = (container.get("resources") or {}).get("limits") or {}
    args: list[str] = []
    if "cpu" in limits:
        # Docker refuses more CPUs than the host has; the limit then is the host.
        cpus = min(quantity(limits["cpu"], name), float(os.cpu_count() or 1))
        args.append(f"--cpus={cpus:g}")
    if "memory" in limits:
        args.append(f"--memory={int(quantity(limits['memory'], name))}")
    if int(quantity(limits.get("nvidia.com/gpu", 0), name)) > 0:
        raise SpecError(f"{name}: asks for GPUs; only CPU specs run here")
    return args


def run_args(
    pod: dict[str, Any],
    container: dict[str, Any] | None = None,
    options: RunOptions | None = None,
    command: Sequence[str] | None = None,
    image: str | None = None,
) -> list[str]:
    """`docker run` arguments (after `run`) for one container of a rendered pod spec. The
    container's command/args replace the image's CMD but, as in Kubernetes, `command` replaces
    the ENTRYPOINT too; `command=` here overrides both (a test's own program)."""
    options = options or RunOptions()
    container = container or pod["containers"][0]
    args = ["--rm", f"--network={options.network}"]
    if options.name:
        args += ["--name", options.name]
    args += [f"--label={key}={value}" for key, value in sorted(options.labels.items())]
    if "terminationGracePeriodSeconds" in pod:
        # `docker stop` then waits as long as the kubelet does before its SIGKILL.
        args.append(f"--stop-timeout={int(pod['terminationGracePeriodSeconds'])}")
    args += security_args(pod, container, options)
    args += volume_args(pod, container, options)
    args += env_args(container, options)
    args += resource_args(container)
    if container.get("workingDir"):
        args += ["-w", container["workingDir"]]
    argv = (
        list(command)
        if command is not None
        else [
            *(container.get("command") or []),
            *(container.get("args") or []),
        ]
    )
    if command is not None or container.get("command"):
        args += ["--entrypoint", argv[0], image or container["image"], *argv[1:]]
    else:
        args += [image or container["image"], *argv]
    return args


def materialize_sources(
    objects: Sequence[dict[str, Any]], pod: dict[str, Any], root: Path
) -> dict[str, Path]:
    """Files of the pod's configMap and secret volumes, taken from the rendered objects."""
    by_kind = {(obj.get("kind"), obj["metadata"]["name"]): obj for obj in objects}
    sources: dict[str, Path] = {}
    for volume in pod.get("volumes") or []:
        if "configMap" in volume:
            obj = by_kind.get(("ConfigMap", volume["configMap"]["name"]))
            files = {k: v.encode() for k, v in ((obj or {}).get("data") or {}).items()}
        elif "secret" in volume:
            obj = by_kind.get(("Secret", volume["secret"]["secretName"]))
            files = {k: base64.b64decode(v) for k, v in ((obj or {}).get("data") or {}).items()}
            files |= {k: v.encode() for k, v in ((obj or {}).get("stringData") or {}).items()}
        else:
            continue
        if obj is None:
            continue  # an object the chart expects to exist already (e.g. an existing Secret)
        folder = root / volume["name"]
        folder.mkdir(parents=True, exist_ok=True)
        folder.chmod(0o755)
        for key, content in files.items():
            (folder / key).write_bytes(content)
            (folder / key).chmod(0o444)
        sources[volume["name"]] = folder
    return sources


# ------------------------------------------------------------------ the sandbox stage's pod


def sandbox_stage(scenario: str = "kind") -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(rendered objects, pod spec of the collect Job) as the chart renders them by default: its
    sandbox container names the chart's Localhost profile (files/seccomp/codeq-sandbox.json):
    the container every sandbox test runs in."""
    objects = render_chart(scenario_values(scenario))
    jobs = stage_jobs(objects, ARGO_SAMPLE)
    (collect,) = [job for name, job in jobs.items() if "collect" in name]
    pod = collect["spec"]["template"]["spec"]
    seccomp = pod["containers"][0]["securityContext"].get("seccompProfile") or {}
    if seccomp.get("type") != "Localhost":
        raise SpecError(f"the collect container's seccompProfile is {seccomp}, not Localhost")
    return objects, pod


def in_sandbox_container(
    command: Sequence[str], image: str, workdir: Path, scenario: str = "kind"
) -> list[str]:
    """`docker run` arguments that run `command` (through tini) in `image` as the chart runs the
    collect stage's container, with this checkout's tests/ and bench/ and a pytest mounted
    read-only at /opt/codeq/{tests,bench} and /opt/pytest (the image has neither)."""
    objects, pod = sandbox_stage(scenario)
    options = RunOptions(
        sources=materialize_sources(objects, pod, workdir),
        mounts={
            "/opt/codeq/tests": str(REPO / "tests"),
            "/opt/codeq/bench": str(REPO / "bench"),
            "/opt/pytest": str(pytest_for_containers()),
        },
        env={"PYTHONPATH": "/opt/codeq:/opt/pytest"},
    )
    return run_args(pod, None, options, ["/usr/bin/tini", "--", *command], image)


# -------------------------------------------------------------------------------------- CLI


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m tests.containers")
    sub = parser.add_subparsers(dest="what", required=True)
    daemon = sub.add_parser("daemon", help="start or stop a dockerd for this run")
    daemon.add_argument("action", choices=["start", "stop"])
    daemon.add_argument("--state", type=Path, default=CACHE / "dockerd")
    sandbox = sub.add_parser(
        "sandbox-container", help="run a command in the infer image as the chart's sandbox stage"
    )
    sandbox.add_argument("--image", default="codeq-infer:cpu")
    sandbox.add_argument("command", nargs="+")
    args = parser.parse_args(argv)
    if args.what == "sandbox-container":
        import tempfile

        with tempfile.TemporaryDirectory() as workdir:
            run = in_sandbox_container(args.command, args.image, Path(workdir))
            client = docker_client() or "docker"
            print(" ".join([client, "run", *run]), flush=True)
            return subprocess.run([client, "run", *run]).returncode
    handle = Daemon(args.state)
    if args.action == "start":
        started = handle.start()
        print("started dockerd" if started else "a Docker daemon is already running")
    else:
        handle.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
