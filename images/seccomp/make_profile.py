"""Write helm/codeq/files/seccomp/codeq-sandbox.json (the sandbox stages' seccomp profile, one
file for the chart and the tests) from the container runtime's default seccomp profile.

    python3 images/seccomp/make_profile.py <moby>/profiles/seccomp/default.json \
        > helm/codeq/files/seccomp/codeq-sandbox.json

The input is Docker's (moby's) default profile, the one containerd's RuntimeDefault mirrors. Its
rules are conditional on capabilities and architectures ("includes"/"excludes"), which only
Docker evaluates: Kubernetes hands a Localhost profile to the runtime as OCI seccomp, where those
conditions do not exist. So the output is that profile resolved for the sandbox container, which
runs with every capability dropped on x86_64 or arm64: rules that need a capability are gone,
rules for other architectures are gone, the rest are unconditional. Then one rule adds exactly
what rootless runsc needs on top (SANDBOX_SYSCALLS; images/README.md says how each was shown to
be necessary). The same file is read by `docker run --security-opt seccomp=...` and the kubelet.
"""

from __future__ import annotations

import json
import sys
from typing import Any

ARCHES = {"amd64", "arm64", "arm", "x86", "x32"}  # Docker's names inside the two families
ARCH_MAP = {"SCMP_ARCH_X86_64", "SCMP_ARCH_AARCH64"}
# Rootless `runsc do` creates a user and mount namespace (clone with CLONE_NEW* flags), mounts its
# root and /proc there, pivots or chroots into it and unmounts the old root.
SANDBOX_SYSCALLS = ["chroot", "clone", "mount", "pivot_root", "umount2"]


def applies(rule: dict[str, Any]) -> bool:
    includes = rule.get("includes") or {}
    excludes = rule.get("excludes") or {}
    if includes.get("caps"):
        return False  # every capability is dropped
    if includes.get("arches") and not set(includes["arches"]) & ARCHES:
        return False
    # Kept if it applies on at least one of the two architectures.
    return not {"amd64", "arm64"} <= set(excludes.get("arches") or [])


def resolve(default: dict[str, Any]) -> dict[str, Any]:
    rules = []
    for rule in default["syscalls"]:
        if not applies(rule):
            continue
        kept = {key: rule[key] for key in ("names", "action", "errnoRet") if key in rule}
        if rule.get("args"):
            kept["args"] = rule["args"]
        rules.append(kept)
    rules.append(
        {
            "names": SANDBOX_SYSCALLS,
            "action": "SCMP_ACT_ALLOW",
            "comment": "codeq: rootless runsc (user and mount namespaces, its own root and /proc)",
        }
    )
    profile = {key: default[key] for key in ("defaultAction", "defaultErrnoRet") if key in default}
    profile["archMap"] = [a for a in default["archMap"] if a["architecture"] in ARCH_MAP]
    profile["syscalls"] = rules
    return profile


def main() -> None:
    with open(sys.argv[1]) as source:
        default = json.load(source)
    json.dump(resolve(default), sys.stdout, indent=2)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
