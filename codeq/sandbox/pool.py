"""`Sandbox`: a pool of warm workers; batches run in parallel over them, order preserved."""

from __future__ import annotations

import logging
import queue
import shutil
import sys
import threading
import weakref
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from codeq.config import SandboxConfig
from codeq.cpus import available_cpus
from codeq.errors import SandboxError
from codeq.sandbox.records import ExecRequest, ExecResult
from codeq.sandbox.worker import Worker

log = logging.getLogger(__name__)

FALLBACK_WARNING = (
    "runsc (gVisor) not found: running untrusted programs in the restricted SUBPROCESS "
    "backend, which shares the host kernel. Install gVisor (apt-get install runsc) or set "
    "sandbox.backend=subprocess to silence this warning."
)


def resolve_backend(config: SandboxConfig) -> tuple[str, str | None]:
    """(backend, runsc path). auto -> gvisor when runsc exists, else subprocess, loudly."""
    runsc = shutil.which(config.runsc_path)
    if config.backend == "subprocess":
        return "subprocess", None
    if runsc is not None:
        return "gvisor", runsc
    if config.backend == "gvisor":
        raise SandboxError(
            f"sandbox.backend=gvisor but runsc was not found ({config.runsc_path!r})",
            hint="install gVisor (apt-get install runsc), set sandbox.runsc_path, or choose "
            "sandbox.backend=subprocess",
        )
    log.warning(FALLBACK_WARNING)
    print(f"WARNING: {FALLBACK_WARNING}", file=sys.stderr)
    return "subprocess", None


def warn_about_weak_isolation(hello: dict) -> None:
    """Without root (host backend) the jail, the uid drop and the network namespace may be
    missing; say so loudly rather than pretend the programs are contained."""
    missing = [name for name in ("jail", "uid_drop", "netns") if not hello.get(name)]
    if missing:
        message = (
            f"sandbox isolation is weaker than designed: no {', '.join(missing)} "
            "(run as root, or use the gvisor backend)"
        )
        log.warning(message)
        print(f"WARNING: {message}", file=sys.stderr)


def worker_count(config: SandboxConfig) -> int:
    return config.workers or available_cpus()


def _stop_workers(workers: list[Worker]) -> None:
    for worker in workers:
        worker.stop()


class Sandbox:
    """Warm isolated workers for untrusted programs. Use as a context manager."""

    def __init__(self, config: SandboxConfig | None = None) -> None:
        self.config = config or SandboxConfig()
        self.backend, self._runsc = resolve_backend(self.config)
        self._workers: list[Worker] = []
        self._idle: queue.Queue[Worker] = queue.Queue()
        self._executor: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        # Runs at close(), garbage collection or interpreter exit, whichever comes first.
        self._finalizer = weakref.finalize(self, _stop_workers, self._workers)

    # -------------------------------------------------------------- lifecycle

    def start(self) -> Sandbox:
        with self._lock:
            if self._executor is not None:
                return self
            count = worker_count(self.config)
            try:
                starters = ThreadPoolExecutor(max_workers=count)
                workers = [Worker(self.config, self.backend, self._runsc) for _ in range(count)]
                self._workers.extend(workers)
                list(starters.map(Worker.start, workers))
                starters.shutdown()
            except BaseException:
                _stop_workers(self._workers)
                self._workers.clear()
                raise
            for worker in workers:
                self._idle.put(worker)
            self._executor = ThreadPoolExecutor(max_workers=count, thread_name_prefix="sandbox")
            log.info("sandbox: %d %s workers (%s)", count, self.backend, workers[0].hello)
            warn_about_weak_isolation(workers[0].hello)
        return self

    def close(self) -> None:
        with self._lock:
            if self._executor is not None:
                self._executor.shutdown(wait=True)
                self._executor = None
            _stop_workers(self._workers)
            self._workers.clear()
            self._idle = queue.Queue()

    def __enter__(self) -> Sandbox:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def workers(self) -> int:
        return len(self._workers)

    @property
    def scratch_dirs(self) -> list[str]:
        """Host directories the workers use now; all of them are removed by close()."""
        return [worker.scratch for worker in self._workers if worker.scratch]

    @property
    def isolation(self) -> dict:
        """What the first worker's server could set up (jail, uid drop, network namespace)."""
        return dict(self._workers[0].hello) if self._workers else {}

    # -------------------------------------------------------------- running

    def run(self, request: ExecRequest) -> ExecResult:
        return self.run_batch([request])[0]

    def run_batch(self, requests: Sequence[ExecRequest]) -> list[ExecResult]:
        if self._executor is None:
            self.start()
        assert self._executor is not None
        return list(self._executor.map(self._run_on_idle_worker, requests))

    def _run_on_idle_worker(self, request: ExecRequest) -> ExecResult:
        if not isinstance(request, ExecRequest):
            raise TypeError(f"run_batch expects ExecRequest items, got {type(request).__name__}")
        worker = self._idle.get()
        try:
            return worker.execute(request)
        except SandboxError:
            raise
        finally:
            self._idle.put(worker)
