"""Artifact store: `file://PATH` and `s3://BUCKET/PREFIX` behind one small interface.

Every stage output is a folder of files (a key prefix) with a `MANIFEST.json` (sha256 and size
per file) and a `_COMPLETE` marker written last, create-only (S3 `If-None-Match: *`, file
`O_EXCL`). Downloads of a stage output are checked against its manifest; a mismatch is a
CorruptInputError. Store failures that survive boto3's retries become StoreError (transient).

Key layout of one run (see `RoundLayout`):

    runs/<run>/round-<n>/{tasks,trajectories/shard-<i>,pairs,adapter,eval,promote,report}
    runs/<run>/current            the promoted adapter (files + MANIFEST.json + CURRENT.json)
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from codeq.config import StoreConfig
from codeq.errors import (
    ConfigError,
    CorruptInputError,
    MissingInputError,
    StoreError,
)
from codeq.logs import log  # stages import it from here too

MANIFEST_NAME = "MANIFEST.json"
MARKER_NAME = "_COMPLETE"
RESERVED_NAMES = {MANIFEST_NAME, MARKER_NAME}
CHUNK_BYTES = 1 << 20


def join_key(*parts: str) -> str:
    return "/".join(part.strip("/") for part in parts if part.strip("/"))


def sha256_of_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(CHUNK_BYTES), b""):
            digest.update(chunk)
    return digest.hexdigest()


def files_under(directory: Path) -> list[Path]:
    """Regular files below `directory`, sorted, without manifests and markers."""
    return sorted(
        path
        for path in directory.rglob("*")
        if path.is_file() and path.name not in RESERVED_NAMES and not path.name.endswith(".tmp")
    )


@dataclass(frozen=True)
class RoundLayout:
    """Keys of one round of one run."""

    run: str
    round: int

    @property
    def run_prefix(self) -> str:
        return f"runs/{self.run}"

    @property
    def round_prefix(self) -> str:
        return f"runs/{self.run}/round-{self.round}"

    def stage(self, name: str) -> str:
        return f"{self.round_prefix}/{name}"

    def shard(self, index: int) -> str:
        return f"{self.round_prefix}/trajectories/shard-{index}"

    def shard_task(self, index: int, task_id: str) -> str:
        return f"{self.shard(index)}/tasks/{task_id}.json"

    @property
    def current(self) -> str:
        return f"{self.run_prefix}/current"

    def merged(self, name: str) -> str:
        """A merged policy of the run, shared by its rounds, stages and shards."""
        return f"{self.run_prefix}/merged/{name}"

    def of_round(self, round_number: int) -> RoundLayout:
        return RoundLayout(self.run, round_number)


class ArtifactStore(ABC):
    """Backend primitives are the abstract methods; manifests and markers build on them."""

    uri: str

    # -- primitives -------------------------------------------------------------------------
    @abstractmethod
    def put_bytes(self, key: str, data: bytes) -> None: ...

    @abstractmethod
    def get_bytes(self, key: str) -> bytes: ...

    @abstractmethod
    def put_file(self, key: str, path: Path) -> None: ...

    @abstractmethod
    def get_file(self, key: str, path: Path) -> None: ...

    @abstractmethod
    def exists(self, key: str) -> bool: ...

    @abstractmethod
    def delete(self, key: str) -> None:
        """Remove `key`; a key that does not exist is no error."""

    @abstractmethod
    def list(self, prefix: str) -> list[str]:
        """Keys under `prefix/` (recursive), sorted."""

    @abstractmethod
    def create_only(self, key: str, data: bytes) -> bool:
        """Write `key` only if it does not exist; False when it already did."""

    # -- JSON helpers -----------------------------------------------------------------------
    def put_json(self, key: str, data: Any) -> None:
        self.put_bytes(key, (json.dumps(data, indent=2, default=str) + "\n").encode())

    def get_json(self, key: str) -> Any:
        raw = self.get_bytes(key)
        try:
            return json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise CorruptInputError(
                f"{self.describe(key)} is not valid JSON ({exc})",
                hint="rerun the stage that writes it",
            ) from None

    def describe(self, key: str) -> str:
        return join_key(self.uri, key) if self.uri.endswith("/") else f"{self.uri}/{key}"

    # -- folders with manifests ---------------------------------------------------------------
    def put_dir(self, prefix: str, directory: Path) -> dict[str, Any]:
        """Upload every file under `directory`, then its MANIFEST.json; returns the manifest."""
        manifest = build_manifest(directory)
        for relative in manifest["files"]:
            self.put_file(join_key(prefix, relative), directory / relative)
        self.put_json(join_key(prefix, MANIFEST_NAME), manifest)
        return manifest

    def read_manifest(self, prefix: str) -> dict[str, Any]:
        key = join_key(prefix, MANIFEST_NAME)
        if not self.exists(key):
            raise MissingInputError(
                f"{self.describe(key)} does not exist",
                hint="run the stage that produces it first",
            )
        manifest = self.get_json(key)
        if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
            raise CorruptInputError(
                f"{self.describe(key)} is not a manifest", hint="rerun the stage that writes it"
            )
        return manifest

    def get_dir(self, prefix: str, directory: Path) -> dict[str, Any]:
        """Download the files listed in `prefix`'s manifest and check each sha256."""
        manifest = self.read_manifest(prefix)
        directory.mkdir(parents=True, exist_ok=True)
        for relative, expected in manifest["files"].items():
            target = safe_child(directory, relative)
            key = join_key(prefix, relative)
            if not self.exists(key):
                raise MissingInputError(
                    f"{self.describe(key)} is listed in its manifest but missing",
                    hint="rerun the stage that produces it",
                )
            self.get_file(key, target)
            self._check_sha256(key, target, expected["sha256"])
        return manifest

    def get_verified_file(self, prefix: str, relative: str, path: Path) -> bool:
        """Download one file of a stage output and check it against the manifest; False when
        the manifest does not list it."""
        expected = self.read_manifest(prefix)["files"].get(relative)
        if expected is None:
            return False
        key = join_key(prefix, relative)
        self.get_file(key, path)
        self._check_sha256(key, path, expected["sha256"])
        return True

    def _check_sha256(self, key: str, path: Path, expected_sha256: str) -> None:
        actual = sha256_of_file(path)
        if actual != expected_sha256:
            raise CorruptInputError(
                f"{self.describe(key)} fails its checksum "
                f"(sha256 {actual[:12]}..., manifest says {expected_sha256[:12]}...)",
                hint="the object was changed or truncated; rerun the stage that produces it",
            )

    def verify_manifest(self, prefix: str) -> dict[str, Any]:
        """Download into a temporary folder and check every checksum (no files kept)."""
        with tempfile.TemporaryDirectory(prefix="codeq-verify-") as scratch:
            return self.get_dir(prefix, Path(scratch))

    # -- completion markers -----------------------------------------------------------------
    def mark_complete(self, prefix: str, info: dict[str, Any] | None = None) -> bool:
        """Write `prefix/_COMPLETE` create-only; False when another writer got there first."""
        body = {"completed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        body.update(info or {})
        return self.create_only(
            join_key(prefix, MARKER_NAME), (json.dumps(body, default=str) + "\n").encode()
        )

    def is_complete(self, prefix: str) -> bool:
        return self.exists(join_key(prefix, MARKER_NAME))

    def marker(self, prefix: str) -> dict[str, Any]:
        data = self.get_json(join_key(prefix, MARKER_NAME))
        return data if isinstance(data, dict) else {}

    def unmark_complete(self, prefix: str) -> None:
        """Remove `prefix/_COMPLETE`: from now on no reader takes the output as complete."""
        self.delete(join_key(prefix, MARKER_NAME))

    def delete_prefix(self, prefix: str) -> int:
        """Remove every key under `prefix/`; returns how many there were."""
        keys = self.list(prefix)
        for key in keys:
            self.delete(key)
        return len(keys)

    def require_complete(self, prefix: str, what: str) -> None:
        if not self.is_complete(prefix):
            raise MissingInputError(
                f"{what} is not complete: {self.describe(join_key(prefix, MARKER_NAME))} "
                "does not exist",
                hint=f"run the stage that produces {what} first (its marker is written last)",
            )


def build_manifest(directory: Path) -> dict[str, Any]:
    files = {
        path.relative_to(directory).as_posix(): {
            "sha256": sha256_of_file(path),
            "bytes": path.stat().st_size,
        }
        for path in files_under(directory)
    }
    return {"version": 1, "files": files}


def safe_child(directory: Path, relative: str) -> Path:
    target = (directory / relative).resolve()
    if not target.is_relative_to(directory.resolve()):
        raise CorruptInputError(f"manifest entry {relative!r} escapes its folder")
    return target


class FileStore(ArtifactStore):
    """A local folder. Writes are atomic (temp file + rename); markers use O_EXCL."""

    def __init__(self, root: Path) -> None:
        self.root = root.expanduser().resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self.uri = f"file://{self.root}"

    def _path(self, key: str) -> Path:
        return safe_child(self.root, key)

    def put_bytes(self, key: str, data: bytes) -> None:
        target = self._path(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f"{target.name}.{os.getpid()}.tmp")
        tmp.write_bytes(data)
        tmp.replace(target)

    def get_bytes(self, key: str) -> bytes:
        target = self._path(key)
        if not target.is_file():
            raise MissingInputError(f"{self.describe(key)} does not exist")
        return target.read_bytes()

    def put_file(self, key: str, path: Path) -> None:
        target = self._path(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f"{target.name}.{os.getpid()}.tmp")
        shutil.copyfile(path, tmp)
        tmp.replace(target)

    def get_file(self, key: str, path: Path) -> None:
        source = self._path(key)
        if not source.is_file():
            raise MissingInputError(f"{self.describe(key)} does not exist")
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        shutil.copyfile(source, tmp)
        tmp.replace(path)

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def list(self, prefix: str) -> list[str]:
        base = self._path(prefix)
        if not base.is_dir():
            return []
        return sorted(
            path.relative_to(self.root).as_posix()
            for path in base.rglob("*")
            if path.is_file() and not path.name.endswith(".tmp")
        )

    def create_only(self, key: str, data: bytes) -> bool:
        target = self._path(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            descriptor = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        return True


class S3Store(ArtifactStore):
    """S3 (or MinIO/moto) with boto3 standard retries, timeouts and multipart transfers."""

    def __init__(self, bucket: str, prefix: str, config: StoreConfig) -> None:
        import boto3
        from boto3.s3.transfer import TransferConfig
        from botocore.config import Config

        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.uri = f"s3://{bucket}/{self.prefix}" if self.prefix else f"s3://{bucket}"
        # botocore < 1.36 has neither option and never adds checksums it is not asked for,
        # which is what "when_required" asks of a newer one.
        checksums: dict[str, str] = {}
        if "request_checksum_calculation" in Config.OPTION_DEFAULTS:
            checksums = {
                "request_checksum_calculation": config.checksums,
                "response_checksum_validation": config.checksums,
            }
        client_config = Config(
            retries={"mode": "standard", "max_attempts": config.max_attempts},
            connect_timeout=config.connect_timeout_s,
            read_timeout=config.read_timeout_s,
            region_name=config.region,
            **checksums,
        )
        self.client = boto3.client("s3", endpoint_url=config.endpoint_url, config=client_config)
        self.endpoint = str(self.client.meta.endpoint_url)
        self.max_attempts = config.max_attempts
        self.connect_timeout_s = config.connect_timeout_s
        self.client.meta.events.register("needs-retry.s3", self._announce_retry)
        threshold = config.multipart_threshold_mb * 1024 * 1024
        self.transfer = TransferConfig(
            multipart_threshold=threshold, multipart_chunksize=threshold, use_threads=True
        )

    def _key(self, key: str) -> str:
        return join_key(self.prefix, key)

    def _announce_retry(
        self,
        attempts: int,
        operation: Any,
        response: Any = None,
        caught_exception: BaseException | None = None,
        **_: Any,
    ) -> None:
        """Before the first retry of a request, say what we wait for (boto3's retries and
        backoff are otherwise silent for tens of seconds)."""
        status = response[1].get("ResponseMetadata", {}).get("HTTPStatusCode") if response else None
        failing = caught_exception is not None or status in {429, 500, 502, 503, 504}
        if attempts != 1 or not failing or self.max_attempts < 2:
            return
        reason = type(caught_exception).__name__ if caught_exception else f"HTTP {status}"
        log(
            f"store: S3 at {self.endpoint} did not answer {operation.name} ({reason}); "
            f"retrying with backoff, {self.max_attempts} attempts in all "
            f"(store.max_attempts; store.connect_timeout_s={self.connect_timeout_s:g}s each)"
        )

    def _error(self, exc: BaseException, action: str, key: str) -> Exception:
        return classify_s3_error(
            exc, action, self.describe(key), endpoint=self.endpoint, attempts=self.max_attempts
        )

    def _call(self, action: str, key: str, function: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - classified below
            raise self._error(exc, action, key) from exc

    def put_bytes(self, key: str, data: bytes) -> None:
        self._call(
            "write",
            key,
            self.client.put_object,
            Bucket=self.bucket,
            Key=self._key(key),
            Body=data,
        )

    def get_bytes(self, key: str) -> bytes:
        def read() -> bytes:
            response = self.client.get_object(Bucket=self.bucket, Key=self._key(key))
            return bytes(response["Body"].read())

        return bytes(self._call("read", key, read))

    def put_file(self, key: str, path: Path) -> None:
        self._call(
            "upload",
            key,
            self.client.upload_file,
            str(path),
            self.bucket,
            self._key(key),
            Config=self.transfer,
        )

    def get_file(self, key: str, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        self._call(
            "download",
            key,
            self.client.download_file,
            self.bucket,
            self._key(key),
            str(tmp),
            Config=self.transfer,
        )
        tmp.replace(path)

    def exists(self, key: str) -> bool:
        try:
            self.client.head_object(Bucket=self.bucket, Key=self._key(key))
        except Exception as exc:  # noqa: BLE001 - classified below
            if error_status(exc) == 404:
                return False
            raise self._error(exc, "check", key) from exc
        return True

    def delete(self, key: str) -> None:
        self._call("delete", key, self.client.delete_object, Bucket=self.bucket, Key=self._key(key))

    def list(self, prefix: str) -> list[str]:
        full = self._key(prefix) + "/"
        keys: list[str] = []

        def collect() -> None:
            paginator = self.client.get_paginator("list_objects_v2")
            for page in paginator.paginate(Bucket=self.bucket, Prefix=full):
                keys.extend(item["Key"] for item in page.get("Contents", []))

        self._call("list", prefix, collect)
        strip = len(self.prefix) + 1 if self.prefix else 0
        return sorted(key[strip:] for key in keys)

    def create_only(self, key: str, data: bytes) -> bool:
        try:
            self.client.put_object(
                Bucket=self.bucket, Key=self._key(key), Body=data, IfNoneMatch="*"
            )
        except Exception as exc:  # noqa: BLE001 - classified below
            status = error_status(exc)
            if status == 412:  # PreconditionFailed: the marker already exists
                return False
            if status == 409:  # ConditionalRequestConflict: a concurrent writer; check again
                return not self.exists(key)
            if status == 501:  # an S3 clone without conditional writes: best effort
                if self.exists(key):
                    return False
                self.put_bytes(key, data)
                return True
            raise self._error(exc, "write", key) from exc
        return True


def error_status(exc: BaseException) -> int | None:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if isinstance(status, int):
            return status
        code = str(response.get("Error", {}).get("Code", ""))
        if code.isdigit():
            return int(code)
        if code in {"NoSuchKey", "NotFound"}:
            return 404
    return None


def classify_s3_error(
    exc: BaseException,
    action: str,
    where: str,
    *,
    endpoint: str | None = None,
    attempts: int | None = None,
) -> Exception:
    """Map a boto3/botocore failure to the codeq exception that decides the exit code."""
    from botocore.exceptions import (
        ClientError,
        ConnectTimeoutError,
        EndpointConnectionError,
        NoCredentialsError,
    )

    if isinstance(exc, NoCredentialsError):
        return ConfigError(
            f"cannot {action} {where}: no S3 credentials",
            hint="set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or a service-account role",
        )
    if isinstance(exc, ClientError):
        code = str(exc.response.get("Error", {}).get("Code", ""))
        status = error_status(exc)
        if code in {"NoSuchKey", "NotFound"} or status == 404:
            if code == "NoSuchBucket":
                return ConfigError(
                    f"cannot {action} {where}: the bucket does not exist",
                    hint="create the bucket or fix store.uri",
                )
            return MissingInputError(
                f"{where} does not exist", hint="run the stage that produces it first"
            )
        # What stores without S3's flexible checksums (GCS with HMAC keys) answer to them.
        checksum_hint = (
            "; a store that rejects boto3's default checksums (GCS's S3 interface) needs "
            "store.checksums=when_required (CODEQ_STORE__CHECKSUMS)"
            if code in {"InvalidArgument", "SignatureDoesNotMatch", "NotImplemented"}
            else ""
        )
        if status in {401, 403}:
            return ConfigError(
                f"cannot {action} {where}: access denied ({code})",
                hint="check the S3 credentials and the bucket policy" + checksum_hint,
            )
        if status is not None and status < 500 and status != 429:
            return ConfigError(
                f"cannot {action} {where}: S3 said {code} (HTTP {status})",
                hint=checksum_hint.removeprefix("; ") or None,
            )
    if isinstance(exc, EndpointConnectionError | ConnectTimeoutError):
        tries = f" after {attempts} attempt{'s' if attempts != 1 else ''}" if attempts else ""
        return StoreError(
            f"cannot {action} {where}: no S3 endpoint answers at {endpoint or 'the endpoint'}"
            f"{tries} ({type(exc).__name__})",
            hint="check store.endpoint_url (CODEQ_STORE__ENDPOINT_URL) and that the server is "
            "up; a smaller store.max_attempts / store.connect_timeout_s fails sooner; the job "
            "can be retried safely",
        )
    return StoreError(
        f"cannot {action} {where} after retries: {type(exc).__name__}: {exc}".splitlines()[0],
        hint="the store is unreachable or throttled; the job can be retried safely",
    )


def open_store(config: StoreConfig) -> ArtifactStore:
    """The store named by `config.uri` (file://PATH or s3://BUCKET/PREFIX)."""
    parsed = urlparse(config.uri)
    if parsed.scheme == "file":
        path = (parsed.netloc + parsed.path) if parsed.netloc else parsed.path
        if not path:
            raise ConfigError(f"store.uri {config.uri!r} names no folder")
        return FileStore(Path(path))
    if parsed.scheme == "s3":
        if not parsed.netloc:
            raise ConfigError(f"store.uri {config.uri!r} names no bucket")
        return S3Store(parsed.netloc, parsed.path, config)
    raise ConfigError(
        f"store.uri {config.uri!r} is neither file://PATH nor s3://BUCKET/PREFIX",
        hint="e.g. file://./codeq-store or s3://my-bucket/codeq",
    )
