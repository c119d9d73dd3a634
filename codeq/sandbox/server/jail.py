"""The server's one-time set-up: private namespaces where the kernel allows them, the
chroot jail holding only the standard library, and a fresh uid for every run."""

from __future__ import annotations

import contextlib
import ctypes
import os
import random
import sys

PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36
PR_SET_NO_NEW_PRIVS = 38
CLONE_NEWNS = 0x00020000
CLONE_NEWNET = 0x40000000
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18

libc = ctypes.CDLL(None, use_errno=True)


def try_unshare_network_and_mounts() -> dict:
    """Host subprocess backend: a private network and mount namespace where the kernel lets us.
    Under gVisor the sandbox already has no network; unsharing there is harmless."""
    caps = {"netns": False, "mountns": False}
    if libc.unshare(CLONE_NEWNET) == 0:
        caps["netns"] = True
    if libc.unshare(CLONE_NEWNS) == 0:
        caps["mountns"] = libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) == 0
    return caps


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None):
    encoded = [None if part is None else part.encode() for part in (source, target, fstype, data)]
    if libc.mount(encoded[0], encoded[1], encoded[2], flags, encoded[3]) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"mount {source} on {target}: {os.strerror(errno)}")


def stdlib_dirs() -> list[str]:
    import sysconfig

    paths = sysconfig.get_paths()
    found = {os.path.realpath(paths[key]) for key in ("stdlib", "platstdlib")}
    found.update(os.path.realpath(p) for p in sys.path if p and os.path.isdir(p))
    for lib in ("/lib", "/lib64", "/usr/lib", "/usr/lib64"):
        if os.path.isdir(lib) and not os.path.islink(lib):
            found.add(lib)
    # A directory inside another one is already visible through the outer bind mount.
    return [d for d in sorted(found) if not any(d.startswith(o + "/") for o in found)]


def build_jail(jail: str, tmpfs_bytes: int) -> bool:
    """A tmpfs root with the stdlib and system libraries bind-mounted read-only: the program
    sees no host files (datasets, expected outputs, the harness's own source)."""
    try:
        os.makedirs(jail, exist_ok=True)
        mount("tmpfs", jail, "tmpfs", MS_NOSUID | MS_NODEV, f"size={tmpfs_bytes},mode=755")
        for directory in stdlib_dirs():
            target = jail + directory
            os.makedirs(target, exist_ok=True)
            mount(directory, target, None, MS_BIND, None)
            # Read-only where the kernel allows the remount (gVisor refuses; the uid drop covers).
            with contextlib.suppress(OSError):
                mount(None, target, None, MS_BIND | MS_RDONLY | MS_REMOUNT, None)
        os.makedirs(jail + "/runs", mode=0o711, exist_ok=True)
        return True
    except OSError:
        return False


def fresh_uid() -> int:
    # A random uid far above normal accounts, new for every run: its processes are that run's
    # alone, so a uid-wide kill and RLIMIT_NPROC never touch anything else, and a straggler of
    # one run could not reach the next run's files.
    return random.SystemRandom().randrange(3_000_000, 2_000_000_000)
