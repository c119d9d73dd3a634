"""The server loop: hello, then for each request a ready child, its results within the
limits, and a reply signed with the run's secret."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import signal
import sys
import time

from .collector import Collector
from .jail import PR_SET_DUMPABLE, build_jail, libc, try_unshare_network_and_mounts
from .link import RunChild, SpawnerLink
from .protocol import read_frame, write_frame
from .spawner import READY_CHILDREN, start_spawner

# what of a request the child receives (the limits stay with the server)
CHILD_KEYS = ("program", "prelude", "runner", "calls")


def start_run(request: dict, child: RunChild, limits: dict, link: SpawnerLink) -> Collector:
    """Hand the request to a ready child; its limits count from here."""
    collector = Collector(child, request, limits, link)
    write_frame(child.request_w, json.dumps({k: request[k] for k in CHILD_KEYS}).encode())
    os.close(child.request_w)
    return collector


def finish_run(collector: Collector, link: SpawnerLink) -> dict:
    """Wait for the program's results within its limits and report them raw. A program that
    stopped early is given a moment to exit so its exit status (e.g. SIGXCPU) can be reported."""
    child = collector.child
    collector.collect()
    exit_status = collector.exit_status
    if exit_status is None and not collector.complete:
        if collector.status is None and not collector.garbled:
            exit_status = link.wait_exit(child.pid, 0.1)
        clean_up(child, link, wait_for_exit=True)
        link.wait_cleaned(child.pid)
        if exit_status is None:
            exit_status = link.exit_status(child.pid)
    return {
        "status": collector.status,
        "garbled": collector.garbled,
        "messages": collector.messages,
        "exit": exit_status,
        "stdout": bytes(collector.output[child.out_r]).decode("utf-8", "replace"),
        "stderr": bytes(collector.output[child.err_r]).decode("utf-8", "replace"),
        "seconds": time.monotonic() - collector.started,
    }


def clean_up(child: RunChild, link: SpawnerLink, wait_for_exit: bool = False) -> None:
    """Close the run's pipes and have the spawner kill every process of the run and wipe its
    directory (idempotent). The next run starts only once that is done (`link.forget`)."""
    if child.cleaned:
        return
    child.cleaned = True
    for fd in (child.result_r, child.out_r, child.err_r):
        os.close(fd)
    link.clean(child.pid, wait_for_exit)


def serve(config: dict) -> None:
    libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    # Under gVisor the server is init: orphans that escape the spawner's subreaping end up
    # here, and an ignored SIGCHLD has the kernel reap them.
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    is_root = os.geteuid() == 0
    caps = try_unshare_network_and_mounts() if is_root else {"netns": False, "mountns": False}
    tmpfs_bytes = max(64 << 20, 4 * config["max_file_bytes"])
    jail_dir = os.path.join(config["scratch"], "jail")
    jail = (
        is_root and (caps["mountns"] or config["in_gvisor"]) and build_jail(jail_dir, tmpfs_bytes)
    )
    setup = {"jail": jail, "jail_dir": jail_dir, "uid_drop": is_root, "limits": config}
    setup.update(scratch=config["scratch"], counter=0)
    link = SpawnerLink(*start_spawner(setup))
    link.spawn(READY_CHILDREN)
    stdin, stdout = 0, os.dup(1)
    os.dup2(os.open("/dev/null", os.O_WRONLY), 1)  # stray prints can never reach the host
    hello = {"jail": jail, "uid_drop": is_root, **caps, "pid": os.getpid()}
    write_frame(stdout, json.dumps({"hello": hello}).encode())
    try:
        serve_requests(stdin, stdout, config, link)
    finally:
        link.close()


def serve_requests(stdin: int, stdout: int, limits: dict, link: SpawnerLink) -> None:
    previous: RunChild | None = None
    while True:
        try:
            request = json.loads(read_frame(stdin))
        except EOFError:
            return
        if previous is not None:
            link.forget(previous.pid)  # nothing of the last run is alive when this one starts
        child = link.take_child()
        link.spawn()  # refill the pool while this program runs
        collector = start_run(request, child, limits, link)
        reply = json.dumps(finish_run(collector, link)).encode()
        try:
            # The run's secret comes in its own frame, read only now: no child, and not the
            # spawner, ever holds the secret that signs a run's results.
            secret = read_frame(stdin)
        except EOFError:
            return
        write_frame(stdout, reply + hmac.new(secret, reply, hashlib.sha256).digest())
        del secret
        clean_up(child, link)  # the spawner cleans while the host reads the reply
        previous = child


def main() -> None:
    serve(json.loads(sys.argv[1]))
