"""The sandbox server as one file. `codeq/sandbox/server/` is a package split by role, but
inside the jail codeq is not installed: the worker writes this zip of it into its scratch
directory and runs it as `python3 -S -I -B server.pyz CONFIG_JSON` (Python runs a zip through
the `__main__.py` at its root)."""

from __future__ import annotations

import functools
import io
import zipfile
from pathlib import Path

SERVER_PACKAGE = Path(__file__).with_name("server")
PACKAGE_IN_ZIP = "codeq_sandbox_server"  # a name no standard-library module has
BOOTSTRAP = f"from {PACKAGE_IN_ZIP}.serve import main\n\nmain()\n"
BUNDLE_NAME = "server.pyz"


@functools.cache
def server_bundle() -> bytes:
    """The zip's bytes: the bootstrap and every module of the server package."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr(_entry("__main__.py"), BOOTSTRAP)
        for module in sorted(SERVER_PACKAGE.glob("*.py")):
            archive.writestr(_entry(f"{PACKAGE_IN_ZIP}/{module.name}"), module.read_bytes())
    return buffer.getvalue()


def write_server_bundle(directory: str | Path) -> Path:
    """Write the bundle into `directory` (readable by its owner only) and return its path."""
    path = Path(directory) / BUNDLE_NAME
    path.write_bytes(server_bundle())
    path.chmod(0o600)
    return path


def _entry(name: str) -> zipfile.ZipInfo:
    # A fixed time stamp: the same sources make the same bytes.
    info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
    info.external_attr = 0o644 << 16
    return info
