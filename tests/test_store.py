"""The artifact store on a local folder and on a real S3 endpoint (moto server), including
checksums, create-only markers, multipart uploads and injected S3 failures."""

from __future__ import annotations

import hashlib
import os
import uuid

import pytest
from test_store_helpers import BUCKET, s3_endpoint_fixture  # noqa: F401 - the fixture

from codeq.config import StoreConfig
from codeq.errors import (
    EXIT_TRANSIENT,
    ConfigError,
    CorruptInputError,
    MissingInputError,
    StoreError,
)
from codeq.store import FileStore, RoundLayout, S3Store, open_store


def s3_store(endpoint, **settings) -> S3Store:
    config = StoreConfig(
        uri=f"s3://{BUCKET}/t-{uuid.uuid4().hex[:8]}",
        endpoint_url=endpoint.proxy.url,
        region="us-east-1",
        **settings,
    )
    store = open_store(config)
    assert isinstance(store, S3Store)
    return store


@pytest.fixture(params=["file", "s3"])
def store(request, tmp_path):
    if request.param == "file":
        return open_store(StoreConfig(uri=f"file://{tmp_path}/store"))
    return s3_store(request.getfixturevalue("s3_endpoint"))


def make_folder(root, files: dict[str, bytes]):
    for name, data in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return root


def test_bytes_files_and_listing_round_trip(store, tmp_path):
    store.put_bytes("a/b/one.txt", b"one")
    source = make_folder(tmp_path / "src", {"two.bin": os.urandom(1000)})
    store.put_file("a/two.bin", source / "two.bin")
    assert store.get_bytes("a/b/one.txt") == b"one"
    store.get_file("a/two.bin", tmp_path / "back" / "two.bin")
    assert (tmp_path / "back" / "two.bin").read_bytes() == (source / "two.bin").read_bytes()
    assert store.exists("a/b/one.txt") and not store.exists("a/b/none.txt")
    assert store.list("a") == ["a/b/one.txt", "a/two.bin"]
    assert store.list("zzz") == []
    with pytest.raises(MissingInputError):
        store.get_bytes("a/none")


def test_delete_prefix_removes_that_prefix_only(store):
    for key in ("run/a/one", "run/a/deep/two", "run/ab/kept", "run/b/kept"):
        store.put_bytes(key, b"x")
    assert store.delete_prefix("run/a") == 2
    assert store.list("run") == ["run/ab/kept", "run/b/kept"]
    assert store.delete_prefix("run/a") == 0


def test_dir_round_trip_with_manifest(store, tmp_path):
    files = {"adapter_config.json": b"{}", "nested/weights.bin": os.urandom(4096)}
    source = make_folder(tmp_path / "src", files)
    manifest = store.put_dir("runs/r/round-0/adapter", source)
    expected = hashlib.sha256(files["nested/weights.bin"]).hexdigest()
    assert manifest["files"]["nested/weights.bin"]["sha256"] == expected
    target = tmp_path / "dst"
    store.get_dir("runs/r/round-0/adapter", target)
    for name, data in files.items():
        assert (target / name).read_bytes() == data
    store.verify_manifest("runs/r/round-0/adapter")


def test_corrupted_object_fails_its_checksum(store, tmp_path):
    source = make_folder(tmp_path / "src", {"pairs.jsonl": b'{"a": 1}\n'})
    store.put_dir("p", source)
    store.put_bytes("p/pairs.jsonl", b'{"a": 2}\n')  # changed after the manifest was written
    with pytest.raises(CorruptInputError, match="fails its checksum"):
        store.get_dir("p", tmp_path / "dst")


def test_missing_manifest_is_missing_input(store, tmp_path):
    with pytest.raises(MissingInputError, match="MANIFEST.json does not exist"):
        store.get_dir("nothing/here", tmp_path / "dst")


def test_marker_is_create_only(store):
    assert not store.is_complete("stage")
    assert store.mark_complete("stage", {"n": 1}) is True
    assert store.mark_complete("stage", {"n": 2}) is False
    assert store.is_complete("stage")
    assert store.marker("stage")["n"] == 1
    with pytest.raises(MissingInputError, match="not complete"):
        store.require_complete("other", "pairs")


def test_layout_keys():
    layout = RoundLayout("demo", 3)
    assert layout.stage("tasks") == "runs/demo/round-3/tasks"
    assert layout.shard(2) == "runs/demo/round-3/trajectories/shard-2"
    assert layout.shard_task(0, "abc") == "runs/demo/round-3/trajectories/shard-0/tasks/abc.json"
    assert layout.current == "runs/demo/current"


@pytest.mark.parametrize("uri", ["ftp://x", "s3://", "gs://bucket/x", "file://"])
def test_bad_store_uri_is_a_config_error(uri):
    with pytest.raises(ConfigError):
        open_store(StoreConfig(uri=uri))


def test_file_uri_relative_and_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    relative = open_store(StoreConfig(uri="file://./here"))
    assert isinstance(relative, FileStore) and relative.root == tmp_path / "here"
    absolute = open_store(StoreConfig(uri=f"file://{tmp_path}/there"))
    assert isinstance(absolute, FileStore) and absolute.root == tmp_path / "there"


def test_s3_5xx_answers_are_retried_without_loss(s3_endpoint, tmp_path):
    store = s3_store(s3_endpoint, max_attempts=5)
    files = {f"f{i}.txt": f"payload {i}".encode() for i in range(4)}
    source = make_folder(tmp_path / "src", files)
    injected_before = s3_endpoint.proxy.injected
    s3_endpoint.proxy.fail_next(3, status=503)
    store.put_dir("retry/dir", source)
    s3_endpoint.proxy.fail_next(2, status=500)
    assert store.mark_complete("retry/dir") is True
    s3_endpoint.proxy.fail_next(3, status=502)
    store.get_dir("retry/dir", tmp_path / "dst")
    assert s3_endpoint.proxy.injected - injected_before == 8
    for name, data in files.items():
        assert (tmp_path / "dst" / name).read_bytes() == data
    keys = sorted(
        item["Key"]
        for item in s3_endpoint.client().list_objects_v2(Bucket=BUCKET, Prefix=store.prefix)[
            "Contents"
        ]
    )
    assert [key.split("/", 1)[1] for key in keys] == sorted(
        [f"retry/dir/{name}" for name in files] + ["retry/dir/MANIFEST.json", "retry/dir/_COMPLETE"]
    )


def test_s3_stalls_time_out_and_are_retried(s3_endpoint):
    store = s3_store(s3_endpoint, max_attempts=4, read_timeout_s=0.5, connect_timeout_s=1)
    s3_endpoint.proxy.stall_next(2, seconds=1.5)
    store.put_bytes("stall/key", b"kept")
    assert (
        s3_endpoint.client()
        .get_object(Bucket=BUCKET, Key=f"{store.prefix}/stall/key")["Body"]
        .read()
        == b"kept"
    )
    s3_endpoint.proxy.stall_next(2, seconds=1.5)
    assert store.get_bytes("stall/key") == b"kept"


def test_s3_failures_beyond_retries_are_transient_store_errors(s3_endpoint):
    store = s3_store(s3_endpoint, max_attempts=2)  # boto3: 2 retries after the first attempt
    s3_endpoint.proxy.fail_next(3, status=503)
    with pytest.raises(StoreError) as caught:
        store.put_bytes("gone", b"x")
    assert caught.value.exit_code == EXIT_TRANSIENT
    assert "after retries" in caught.value.message


def test_s3_multipart_upload_of_a_large_adapter_with_faults(s3_endpoint, tmp_path):
    store = s3_store(s3_endpoint, multipart_threshold_mb=5, max_attempts=5)
    big = os.urandom(11 * 1024 * 1024)
    source = make_folder(tmp_path / "adapter", {"adapter_model.safetensors": big})
    s3_endpoint.proxy.fail_next(2, status=503)
    store.put_dir("mp/adapter", source)
    head = s3_endpoint.client().head_object(
        Bucket=BUCKET, Key=f"{store.prefix}/mp/adapter/adapter_model.safetensors"
    )
    assert head["ETag"].strip('"').endswith("-3")  # 3 parts of 5 MiB -> a multipart upload
    store.get_dir("mp/adapter", tmp_path / "dst")
    assert (tmp_path / "dst" / "adapter_model.safetensors").read_bytes() == big


def test_s3_missing_bucket_is_a_config_error(s3_endpoint):
    config = StoreConfig(
        uri="s3://no-such-bucket-here/x", endpoint_url=s3_endpoint.url, region="us-east-1"
    )
    with pytest.raises((ConfigError, MissingInputError)):
        open_store(config).get_bytes("k")


def botocore_knows_checksum_settings() -> bool:
    from botocore.config import Config

    return "request_checksum_calculation" in Config.OPTION_DEFAULTS


@pytest.fixture()
def checksum_refusing(s3_endpoint):
    """The moto endpoint behind a proxy that refuses flexible checksums as GCS's S3 interface
    (HMAC keys) does: checksum headers, trailers and aws-chunked bodies get 400."""
    s3_endpoint.proxy.reject_checksums = True
    s3_endpoint.proxy.checksum_requests.clear()
    yield s3_endpoint
    s3_endpoint.proxy.reject_checksums = False


def test_when_required_checksums_work_with_a_store_that_refuses_flexible_ones(
    checksum_refusing, tmp_path
):
    """store.checksums=when_required reaches boto3's client: every call a stage makes (bytes,
    files, a multipart file, the create-only marker, listing, reads, deletes) goes through
    without a checksum header, and no read asks for response checksums."""
    proxy = checksum_refusing.proxy
    store = s3_store(checksum_refusing, checksums="when_required", multipart_threshold_mb=5)
    if botocore_knows_checksum_settings():
        assert store.client.meta.config.request_checksum_calculation == "when_required"
        assert store.client.meta.config.response_checksum_validation == "when_required"
    big = os.urandom(6 * 1024 * 1024)
    source = make_folder(tmp_path / "src", {"small.json": b"{}", "big.bin": big})
    modes_before = proxy.checksum_mode
    store.put_dir("gcs/out", source)
    assert store.mark_complete("gcs/out") and not store.mark_complete("gcs/out")
    store.put_bytes("gcs/one", b"one")
    assert store.get_bytes("gcs/one") == b"one"
    store.get_dir("gcs/out", tmp_path / "back")
    assert (tmp_path / "back" / "big.bin").read_bytes() == big
    assert store.delete_prefix("gcs") == 5
    assert proxy.checksum_requests == []
    assert proxy.checksum_mode == modes_before


def test_default_checksums_are_what_such_a_store_refuses(checksum_refusing):
    """The stand-in refuses what boto3 >= 1.36 sends by default (the images lock 1.44), and the
    error names the setting that fixes it."""
    if not botocore_knows_checksum_settings():
        pytest.skip("botocore < 1.36 sends no checksums unless asked (the images lock a newer one)")
    store = s3_store(checksum_refusing)
    assert store.client.meta.config.request_checksum_calculation == "when_supported"
    with pytest.raises(ConfigError) as caught:
        store.put_bytes("gcs/default", b"x")
    assert "InvalidArgument" in caught.value.message
    assert "store.checksums=when_required" in (caught.value.hint or "")
    assert checksum_refusing.proxy.checksum_requests


def test_checksums_setting_is_validated():
    with pytest.raises(ValueError, match="checksums"):
        StoreConfig(uri="s3://b/p", checksums="never")
