"""The two images, checked without a Docker engine: hadolint clean, checkov with zero failed
checks, hash-locked requirements that match pyproject.toml, runsc pinned, non-root user, and a
build argument for the CPU variant kind uses."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
from tools import find_tool

REPO = Path(__file__).resolve().parent.parent
DOCKERFILES = [REPO / "Dockerfile.infer", REPO / "Dockerfile.train"]
LOCKS = {
    "cuda": REPO / "images" / "requirements-cuda.lock",
    "cpu": REPO / "images" / "requirements-cpu.lock",
}


def locked(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        match = re.match(r"^([A-Za-z0-9_.-]+)==([^\s;\\]+)", line)
        if match:
            pins[match.group(1).lower().replace("_", "-")] = match.group(2)
    return pins


def test_hadolint_is_clean():
    hadolint = find_tool("hadolint")
    result = subprocess.run(
        [hadolint, "--config", str(REPO / ".hadolint.yaml"), *map(str, DOCKERFILES)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_can_fail(tmp_path):
    hadolint = find_tool("hadolint")
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN apt-get install -y curl\n")
    result = subprocess.run([hadolint, str(bad)], capture_output=True, text=True, timeout=120)
    assert result.returncode != 0 and "DL3007" in result.stdout


def test_checkov_passes_on_both_dockerfiles(tmp_path):
    checkov = find_tool("checkov")
    for dockerfile in DOCKERFILES:
        shutil.copy(dockerfile, tmp_path / dockerfile.name)
    result = subprocess.run(
        [
            checkov,
            "-d",
            str(tmp_path),
            "--framework",
            "dockerfile",
            "-o",
            "json",
            "--compact",
            "--skip-download",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "BC_SKIP_MAPPING": "TRUE"},
    )
    report = json.loads(result.stdout)
    summary = report["summary"]
    failed = [
        f"{c['check_id']} {c['file_path']}" for c in report["results"].get("failed_checks", [])
    ]
    assert summary["failed"] == 0, failed
    assert summary["skipped"] == 0
    assert summary["passed"] >= 40
    assert {c["file_path"] for c in report["results"]["passed_checks"]} == {
        "/Dockerfile.infer",
        "/Dockerfile.train",
    }


def test_locks_are_hashed_and_cover_pyproject_dependencies():
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    wanted = [
        re.match(r"^[A-Za-z0-9_.-]+", dep).group(0).lower().replace("_", "-")
        for dep in pyproject["project"]["dependencies"]
    ]
    declared = [
        line
        for line in (REPO / "images" / "requirements.in").read_text().splitlines()
        if line and not line.startswith("#")
    ]
    assert declared == pyproject["project"]["dependencies"], (
        "regenerate images/*.lock (images/README.md)"
    )
    for variant, path in LOCKS.items():
        pins = locked(path)
        assert set(wanted) <= set(pins), (variant, set(wanted) - set(pins))
        text = path.read_text()
        requirement_lines = re.findall(r"^[A-Za-z0-9_.-]+==", text, flags=re.M)
        assert len(
            re.findall(r"^[A-Za-z0-9_.-]+==\S+ \\\n    --hash=sha256:", text, flags=re.M)
        ) == len(requirement_lines), f"every requirement in {path.name} carries a sha256 hash"
    assert not locked(LOCKS["cuda"])["torch"].endswith("+cpu")
    assert any(name.startswith("nvidia-") for name in locked(LOCKS["cuda"]))
    assert locked(LOCKS["cpu"])["torch"].endswith("+cpu")
    assert not any(name.startswith("nvidia-") for name in locked(LOCKS["cpu"]))


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_is_non_root_pinned_and_has_a_cpu_variant(dockerfile):
    text = dockerfile.read_text()
    # The base is a build argument whose default is pinned by digest.
    assert re.search(
        r"^ARG BASE_IMAGE\nFROM \$\{BASE_IMAGE:-python:3\.11\.\d+-slim-bookworm@sha256:[0-9a-f]{64}\}$",
        text,
        flags=re.M,
    )
    assert re.search(r"^USER 10001:10001$", text, flags=re.M)
    assert "ARG VARIANT=cuda" in text
    assert "COPY images/requirements-${VARIANT}.lock" in text
    assert "--require-hashes" in text
    # codeq itself is built with the locked setuptools/wheel and nothing fetched.
    assert "--no-deps --no-index --no-build-isolation ." in text
    # tini is PID 1, pinned, and runs the entrypoint.
    assert re.search(r"^ARG TINI_VERSION=\d[\w.+~-]*$", text, flags=re.M)
    assert '"tini=${TINI_VERSION}"' in text
    assert 'ENTRYPOINT ["/usr/bin/tini", "--", "/usr/local/bin/codeq-entrypoint"]' in text
    for variant in ("cuda", "cpu"):
        assert LOCKS[variant].exists()


def test_both_images_share_their_layers_up_to_the_dependencies():
    """Same instructions up to and including the locked pip install: one build's cache serves
    the other, and the two images hold the same Python packages."""

    def prefix(path: Path) -> list[str]:
        lines = [line for line in path.read_text().splitlines() if not line.startswith("#")]
        end = next(i for i, line in enumerate(lines) if "-r /opt/codeq/requirements.lock" in line)
        return lines[: end + 1]

    assert prefix(DOCKERFILES[0]) == prefix(DOCKERFILES[1])


def test_locks_hold_the_build_dependencies():
    for variant, path in LOCKS.items():
        assert {"pip", "setuptools", "wheel"} <= set(locked(path)), variant


def test_secrets_and_local_wheels_stay_out_of_the_layers():
    for dockerfile in DOCKERFILES:
        text = dockerfile.read_text()
        assert "--mount=type=secret,id=extra-ca" in text
        assert "--mount=type=tmpfs,target=/tmp" in text
        assert "--mount=type=bind,source=images/wheelhouse,target=/wheelhouse" in text
        assert "ca-certificates" not in "".join(re.findall(r"^COPY .*$", text, flags=re.M))
    assert "/images/wheelhouse/*.whl" in (REPO / ".gitignore").read_text()


def test_infer_image_pins_runsc_and_train_image_has_none():
    infer = (REPO / "Dockerfile.infer").read_text()
    match = re.search(r"^ARG RUNSC_VERSION=(\S+)$", infer, flags=re.M)
    assert match
    version = re.fullmatch(r"0\.0~(\d{8})\.\d+-\d+(~bpo12\+\d+)?(\+b\d+)?", match.group(1))
    assert version and version.group(1) >= "20240729", "runsc older than 2024 fails nested"
    assert "Suites: bookworm-backports" in infer
    assert re.search(r"^ARG RUNSC_SHA256=[0-9a-f]{64}$", infer, flags=re.M)
    assert "sha256sum --check --strict" in infer
    assert '"runsc=${RUNSC_VERSION}"' in infer
    assert "runsc" not in (REPO / "Dockerfile.train").read_text().replace("runsc is left out", "")


def test_images_find_the_driver_libraries_gke_mounts():
    """GKE's device plugin mounts the node's NVIDIA libraries at /usr/local/nvidia/lib64 and
    sets no LD_LIBRARY_PATH; torch's dlopen of libcuda.so.1 finds them only through the image's
    LD_LIBRARY_PATH, which no chart value or stage env may drop."""
    import yaml

    for dockerfile in DOCKERFILES:
        env = re.search(r"^ENV (.*?)(?<!\\)$", dockerfile.read_text(), flags=re.M | re.S)
        assert env, dockerfile.name
        settings = dict(
            part.split("=", 1) for part in env.group(1).replace("\\\n", " ").split() if "=" in part
        )
        assert "/usr/local/nvidia/lib64" in settings["LD_LIBRARY_PATH"].split(":"), dockerfile
        assert settings["PATH"].startswith("/usr/local/nvidia/bin:"), dockerfile
    helpers = (REPO / "helm" / "codeq" / "templates" / "_helpers.tpl").read_text()
    assert "LD_LIBRARY_PATH" not in helpers
    values = yaml.safe_load((REPO / "helm" / "codeq" / "values.yaml").read_text())
    assert "LD_LIBRARY_PATH" not in {e["name"] for e in values["jobs"]["extraEnv"]}


def test_image_uid_matches_the_chart():
    import yaml

    values = yaml.safe_load((REPO / "helm" / "codeq" / "values.yaml").read_text())
    for dockerfile in DOCKERFILES:
        assert f"--uid {values['jobs']['runAsUser']}" in dockerfile.read_text()


def test_dockerignore_sends_only_what_the_images_copy():
    lines = (REPO / ".dockerignore").read_text().splitlines()
    assert lines[1] == "*" or "*" in lines
    for needed in ("!codeq/", "!jobs/", "!images/", "!pyproject.toml", "!README.md"):
        assert needed in lines
    for dockerfile in DOCKERFILES:
        for source in re.findall(r"^COPY (\S+)", dockerfile.read_text(), flags=re.M):
            top = source.split("/")[0].replace("${VARIANT}", "x")
            assert f"!{top}" in lines or f"!{top}/" in lines, source


def test_entrypoint_execs_the_stage_command(tmp_path):
    env = {
        "PATH": os.environ["PATH"],
        "CODEQ_SCRATCH_DIR": str(tmp_path / "s"),
        "TMPDIR": str(tmp_path / "t"),
    }
    result = subprocess.run(
        ["sh", str(REPO / "images" / "entrypoint.sh"), "sh", "-c", "echo ran; exit 75"],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
    )
    assert result.returncode == 75 and result.stdout.strip() == "ran"
    assert (tmp_path / "s" / "cache").is_dir() and (tmp_path / "t").is_dir()


def test_rootless_runsc_runs_with_the_charts_restrictions():
    """The sandbox stages keep non-root, no privilege escalation and no capabilities at all; only
    seccomp/AppArmor are relaxed (values.yaml `sandbox`). Prove runsc needs nothing more: run
    `runsc --rootless do` as the chart's UID with no_new_privs and an empty bounding set."""
    import yaml

    runsc, setpriv = shutil.which("runsc"), shutil.which("setpriv")
    if not (runsc and setpriv and os.geteuid() == 0):
        pytest.skip("needs runsc, setpriv and root (to drop to the chart's UID)")
    values = yaml.safe_load((REPO / "helm" / "codeq" / "values.yaml").read_text())
    uid, gid = values["jobs"]["runAsUser"], values["jobs"]["runAsGroup"]
    import tempfile

    scratch = Path(tempfile.mkdtemp(prefix="codeq-runsc-"))  # pytest dirs are 0700 to root
    os.chmod(scratch, 0o777)
    result = subprocess.run(
        [
            setpriv,
            f"--reuid={uid}",
            f"--regid={gid}",
            "--clear-groups",
            "--no-new-privs",
            "--bounding-set",
            "-all",
            "--inh-caps",
            "-all",
            "env",
            "-i",
            "PATH=/usr/bin:/bin",
            f"HOME={scratch}",
            f"TMPDIR={scratch}",
            runsc,
            "--rootless",
            "--network=none",
            "do",
            "/bin/sh",
            "-c",
            "id -u; echo inside-gvisor",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=scratch,
    )
    shutil.rmtree(scratch, ignore_errors=True)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "inside-gvisor" in result.stdout


def seccomp_generator():
    import importlib.util

    path = REPO / "images" / "seccomp" / "make_profile.py"
    spec = importlib.util.spec_from_file_location("make_profile", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_sandbox_seccomp_profile_is_the_default_plus_what_runsc_needs():
    """One file for the chart and the tests: the runtime default resolved for a container without
    capabilities, plus exactly the syscalls rootless runsc needs (each one shown necessary in
    images/README.md), and none of the CAP_SYS_ADMIN family besides."""
    profile = json.loads(
        (REPO / "helm" / "codeq" / "files" / "seccomp" / "codeq-sandbox.json").read_text()
    )
    assert profile["defaultAction"] == "SCMP_ACT_ERRNO"
    assert {a["architecture"] for a in profile["archMap"]} == {
        "SCMP_ARCH_X86_64",
        "SCMP_ARCH_AARCH64",
    }
    rules = profile["syscalls"]
    assert not any("includes" in rule or "excludes" in rule for rule in rules)
    *default, added = rules
    assert added["names"] == ["chroot", "clone", "mount", "pivot_root", "umount2"]
    assert added["names"] == seccomp_generator().SANDBOX_SYSCALLS
    assert added["action"] == "SCMP_ACT_ALLOW" and "args" not in added
    allowed = {
        name
        for rule in rules
        if rule["action"] == "SCMP_ACT_ALLOW" and not rule.get("args")
        for name in rule["names"]
    }
    never = {"unshare", "setns", "bpf", "open_tree", "move_mount", "fsopen", "fsmount"}
    never |= {"mount_setattr", "perf_event_open", "init_module", "finit_module", "kexec_load"}
    never |= {"reboot", "keyctl", "add_key", "request_key", "userfaultfd", "syslog", "acct"}
    assert not allowed & never, allowed & never
    (clone3,) = [rule for rule in default if rule["names"] == ["clone3"]]
    assert clone3["action"] == "SCMP_ACT_ERRNO" and clone3["errnoRet"] == 38  # ENOSYS: clone
    assert len(allowed) > 300  # the default allowlist is there


def test_seccomp_generator_resolves_capability_and_architecture_conditions():
    default = {
        "defaultAction": "SCMP_ACT_ERRNO",
        "defaultErrnoRet": 1,
        "archMap": [
            {"architecture": "SCMP_ARCH_X86_64", "subArchitectures": []},
            {"architecture": "SCMP_ARCH_S390X", "subArchitectures": []},
        ],
        "syscalls": [
            {"names": ["read"], "action": "SCMP_ACT_ALLOW", "includes": {}, "excludes": {}},
            {"names": ["mount"], "action": "SCMP_ACT_ALLOW", "includes": {"caps": ["X"]}},
            {"names": ["s390_x"], "action": "SCMP_ACT_ALLOW", "includes": {"arches": ["s390x"]}},
            {
                "names": ["arch_prctl"],
                "action": "SCMP_ACT_ALLOW",
                "includes": {"arches": ["amd64"]},
            },
            {
                "names": ["clone3"],
                "action": "SCMP_ACT_ERRNO",
                "errnoRet": 38,
                "excludes": {"caps": ["CAP_SYS_ADMIN"]},
            },
        ],
    }
    resolved = seccomp_generator().resolve(default)
    assert [rule["names"] for rule in resolved["syscalls"]] == [
        ["read"],
        ["arch_prctl"],
        ["clone3"],
        seccomp_generator().SANDBOX_SYSCALLS,
    ]
    assert resolved["syscalls"][2] == {
        "names": ["clone3"],
        "action": "SCMP_ACT_ERRNO",
        "errnoRet": 38,
    }
    assert [a["architecture"] for a in resolved["archMap"]] == ["SCMP_ARCH_X86_64"]
    assert resolved["defaultErrnoRet"] == 1
