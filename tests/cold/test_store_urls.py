"""Store URLs: validated when a Config is built (parse_store_url), opened by open_blob_store only; S3
timeouts and retry budget from the URL, and what they do against a server that never answers."""

from __future__ import annotations

import dataclasses
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tieredcore.cli import main as cli
from tieredcore.cold.backends.fs import FilesystemBlobStore
from tieredcore.cold.backends.s3 import S3BlobStore
from tieredcore.cold.location import StoreLocation, open_blob_store, parse_store_url
from tieredcore.config import CONFIG_FILE_NAME, ENV_CONFIG, ENV_OVERRIDES, Config
from tieredcore.errors import BlobStoreError, ValidationError

BASE = dict(metadata_url="sqlite:///m.db", hot_url="file:///h")


# --- rejected URLs: one specific message each -------------------------------------------------


REJECTED = [
    # file://
    ("file:///", "is the filesystem root"),
    ("file:////", "is the filesystem root"),
    ("file://relative", "expected file:///absolute/path.*'relative' is read as a host name"),
    ("file://relative/dir", "'relative' is read as a host name"),
    ("file:relative", "expected file:///absolute/path"),
    ("file://", "expected file:///absolute/path"),
    ("file:///data/../etc", "must not contain '..'"),
    ("file:///data?root=/x", r"unknown parameter\(s\) root for file:// URLs \(known: prefix\)"),
    ("file:///data?prefix=a&endpoint=http://h", r"unknown parameter\(s\) endpoint for file://"),
    ("file:///data?prefix=/abs", "key prefix '/abs' must be relative"),
    ("file:///data?prefix=a/../b", "key prefix 'a/../b' must be relative, without '..'"),
    ("file:///data?prefix=..", "without '..'"),
    ("file:///data?prefix=a&prefix=b", "parameter 'prefix' given more than once"),
    ("file:///data?prefix", "malformed query"),
    ("file:///data#frag", "unexpected '#'"),
    # s3://: bucket
    ("s3://UPPER/p", "bad bucket name 'UPPER'"),
    ("s3://ab/p", "bad bucket name 'ab'"),
    ("s3://bucket_x/p", "bad bucket name 'bucket_x'"),
    ("s3://-bucket/p", "bad bucket name '-bucket'"),
    ("s3://b..x/p", r"bad bucket name 'b\.\.x'"),
    ("s3://192.168.1.10/p", "not an IP address"),
    ("s3:///prefix", "missing bucket"),
    ("s3://[bkt/p", "malformed URL"),
    ("s3://?region=us-east-1", "missing bucket"),
    ("s3://AKID:secret@bkt/p", "no user:password@ in store URLs"),
    # s3://: prefix and parameters
    ("s3://bkt//abs", "key prefix '/abs' must be relative"),
    ("s3://bkt/a/../b", "without '..'"),
    ("s3://bkt/p?acl=private", r"unknown parameter\(s\) acl for s3:// URLs"),
    ("s3://bkt/p?endpiont=http://h:9000", r"unknown parameter\(s\) endpiont"),
    ("s3://bkt/p?region=us-east-1&region=eu-west-1", "parameter 'region' given more than once"),
    # endpoint: an http(s) URL with a host, an optional port, nothing else
    ("s3://bkt/p?endpoint=notaurl", "endpoint must be an http:// or https:// URL with a host, got 'notaurl'"),
    ("s3://bkt/p?endpoint=ftp://h:21", "endpoint must be an http:// or https:// URL"),
    ("s3://bkt/p?endpoint=http://", "endpoint must be an http:// or https:// URL with a host"),
    ("s3://bkt/p?endpoint=", "endpoint must be an http:// or https:// URL"),
    ("s3://bkt/p?endpoint=http://h:9000/path", r"must be scheme://host\[:port\] only"),
    ("s3://bkt/p?endpoint=http://h:9000/?x=1", r"must be scheme://host\[:port\] only"),
    ("s3://bkt/p?endpoint=http://h:0", "port must be a number from 1 to 65535"),
    ("s3://bkt/p?endpoint=http://h:65536", "port must be a number from 1 to 65535"),
    ("s3://bkt/p?endpoint=http://h:port", "port must be a number from 1 to 65535"),
    ("s3://bkt/p?endpoint=http://h:", "port must be a number from 1 to 65535"),
    ("s3://bkt/p?endpoint=http://bad%20host:9000", "invalid host name 'bad host'"),
    ("s3://bkt/p?endpoint=http://[::zz]:9000", "invalid IPv6 address"),
    ("s3://bkt/p?endpoint=http://[::1:9000", "invalid IPv6 address"),
    ("s3://bkt/p?endpoint=http://user:pw@h:9000", "must not contain credentials"),
    # region, numbers, modes
    ("s3://bkt/p?region=-r", "region must be lowercase letters, digits and '-' .e.g. us-east-1., got '-r'"),
    ("s3://bkt/p?region=US-EAST-1", "region must be lowercase letters"),
    ("s3://bkt/p?region=", "region must be lowercase letters"),
    ("s3://bkt/p?region=a_b", "region must be lowercase letters"),
    ("s3://bkt/p?max_attempts=many", "max_attempts must be an integer from 1 to 20"),
    ("s3://bkt/p?max_attempts=0", "max_attempts must be an integer from 1 to 20"),
    ("s3://bkt/p?max_attempts=21", "max_attempts must be an integer from 1 to 20"),
    ("s3://bkt/p?max_attempts=2.0", "max_attempts must be an integer"),
    ("s3://bkt/p?max_attempts=-1", "max_attempts must be an integer"),
    ("s3://bkt/p?read_timeout=soon", "read_timeout must be a duration like 5, 2.5, 5s or 500ms"),
    ("s3://bkt/p?read_timeout=0", "read_timeout must be a duration"),
    ("s3://bkt/p?read_timeout=-5", "read_timeout must be a duration"),
    ("s3://bkt/p?read_timeout=5m", "read_timeout must be a duration"),
    ("s3://bkt/p?read_timeout=1e3", "read_timeout must be a duration"),
    ("s3://bkt/p?read_timeout=nan", "read_timeout must be a duration"),
    ("s3://bkt/p?connect_timeout=3601", "connect_timeout must be a duration.*from 1ms to 1h"),
    ("s3://bkt/p?connect_timeout=0.5ms", "connect_timeout must be a duration"),
    ("s3://bkt/p?retry_mode=legacy", "retry_mode must be one of standard, adaptive, got 'legacy'"),
    # neither
    ("hdfs://nn/p", "unsupported scheme 'hdfs'"),
    ("/plain/path", "unsupported scheme ''"),
]


@pytest.mark.parametrize(("url", "match"), REJECTED)
def test_bad_store_url_is_refused_when_the_config_is_built(url: str, match: str) -> None:
    with pytest.raises(ValidationError, match=match) as e:
        parse_store_url(url)
    assert str(e.value).startswith("store_url: ")
    # the same message from every way a Config comes to be, and from open_blob_store
    with pytest.raises(ValidationError, match=match):
        Config(**BASE, store_url=url)
    with pytest.raises(ValidationError, match=match):
        Config.load(env={"TIERED_METADATA_URL": "sqlite:///m", "TIERED_HOT_URL": "file:///h",
                         "TIERED_STORE_URL": url})
    with pytest.raises(ValidationError, match=match):
        open_blob_store(url)


def test_credentials_never_appear_in_the_message() -> None:
    for url in ("s3://AKIDX:s3cr3t@bkt/p", "s3://bkt/p?endpoint=http://AKIDX:s3cr3t@h:9000",
                "s3://bkt/p?endpoint=http://AKIDX:s3cr3t@h:9000/path",
                "s3://bkt/p?endpoint=ftp://AKIDX:s3cr3t@h", "gs://AKIDX:s3cr3t@bkt/p"):
        with pytest.raises(ValidationError) as e:
            parse_store_url(url)
        assert "s3cr3t" not in str(e.value) and "AKIDX" not in str(e.value), str(e.value)


# --- accepted URLs ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("file:///data/cold", StoreLocation("file", root="/data/cold")),
        ("file://localhost/data/cold?prefix=off/", StoreLocation("file", root="/data/cold", prefix="off/")),
        ("file:///a%20b/c%23d", StoreLocation("file", root="/a b/c#d")),
        ("file:///data;v1", StoreLocation("file", root="/data;v1")),  # not a ;params separator
        ("s3://bkt", StoreLocation("s3", bucket="bkt")),
        ("s3://my.bucket-1/a%20b/c/", StoreLocation("s3", bucket="my.bucket-1", prefix="a b/c/")),
        ("s3://bkt/p?endpoint=https://[::1]:9000/&region=us-gov-west-1",
         StoreLocation("s3", bucket="bkt", prefix="p", endpoint="https://[::1]:9000/", region="us-gov-west-1")),
        ("s3://bkt/p?endpoint=http://minio_1:9000", StoreLocation("s3", bucket="bkt", prefix="p",
                                                             endpoint="http://minio_1:9000")),
        ("s3://bkt/p?connect_timeout=2.5&read_timeout=500ms&max_attempts=1&retry_mode=standard",
         StoreLocation("s3", bucket="bkt", prefix="p", connect_timeout=2.5, read_timeout=0.5, max_attempts=1,
                  retry_mode="standard")),
        ("s3://bkt/?read_timeout=5s&connect_timeout=7&max_attempts=20",
         StoreLocation("s3", bucket="bkt", read_timeout=5.0, connect_timeout=7.0, max_attempts=20)),
    ],
)
def test_good_store_urls(url: str, expected: StoreLocation) -> None:
    assert parse_store_url(url) == expected
    assert Config(**BASE, store_url=url, max_block_size=8 << 20).store_url == url


def test_s3_defaults_suit_a_batch_job() -> None:
    spec = parse_store_url("s3://bkt/p")
    assert (spec.connect_timeout, spec.read_timeout, spec.max_attempts, spec.retry_mode) == (
        5.0, 10.0, 3, "adaptive")  # a request to a hung endpoint gives up within 3 x 10 s + backoff
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.bucket = "other"  # type: ignore[misc]


def test_parsing_does_no_io(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    spec = parse_store_url(f"file://{tmp_path}/not/yet?prefix=p/")
    assert spec.root == f"{tmp_path}/not/yet"
    Config(**BASE, store_url=f"file://{tmp_path}/not/yet")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "url",
    [
        "s3://bkt/some/prefix?endpoint=http://127.0.0.1:9000&region=eu-west-3",
        "s3://bkt2?region=us-east-2&max_attempts=2&connect_timeout=250ms&read_timeout=1.5&retry_mode=standard",
        "s3://bkt3/",
    ],
)
def test_open_blob_store_opens_what_was_parsed(aws_env: None, url: str) -> None:
    spec = parse_store_url(url)
    store, prefix = open_blob_store(url)
    assert isinstance(store, S3BlobStore)
    cfg = store.client.meta.config
    assert (store.bucket, store.endpoint_url, prefix) == (spec.bucket, spec.endpoint, spec.prefix)
    assert store.region == (spec.region or "us-east-1")
    assert (cfg.connect_timeout, cfg.read_timeout) == (spec.connect_timeout, spec.read_timeout)
    assert cfg.retries == {"total_max_attempts": spec.max_attempts, "mode": spec.retry_mode}


def test_open_blob_store_file(tmp_path: Path) -> None:
    store, prefix = open_blob_store(f"file://{tmp_path}/objects?prefix=a/b/", fsync=False)
    assert isinstance(store, FilesystemBlobStore)
    assert (store.root, prefix, store.fsync) == (tmp_path / "objects", "a/b/", False)


# --- entry points refuse a bad URL before creating anything -----------------------------------


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in (*ENV_OVERRIDES, ENV_CONFIG):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("TIERED_NO_PROGRESS", "1")


@pytest.mark.parametrize(
    ("url", "match"),
    [("file:///", "filesystem root"), ("s3://UPPER/p", "bad bucket name"), ("s3://bkt/p?endpoint=notaurl", "endpoint")],
)
def test_tiered_init_refuses_a_bad_store_url(tmp_path: Path, capsys, clean_env: None, url: str, match: str) -> None:
    root = tmp_path / "ws"
    assert cli.main(["init", str(root), "--store-url", url]) == 2
    err = capsys.readouterr().err
    assert "store_url" in err and match in err and "Traceback" not in err
    assert not root.exists()  # no workspace, no config, no database


def test_tiered_status_refuses_a_config_file_with_a_bad_store_url(tmp_path: Path, capsys, clean_env: None) -> None:
    root = tmp_path / "ws"
    assert cli.main(["init", str(root)]) == 0
    cfg_path = root / CONFIG_FILE_NAME
    good = cfg_path.read_text()
    cfg_path.write_text("\n".join(
        'store_url = "file:///"' if line.startswith("store_url") else line for line in good.splitlines()))
    capsys.readouterr()
    assert cli.main(["--workspace", str(root), "status"]) == 2
    err = capsys.readouterr().err
    assert "store_url" in err and "filesystem root" in err


# --- timeouts and retry budget against a server that never answers ----------------------------


class SilentServer:
    """Accepts TCP connections on 127.0.0.1, reads each request head, never answers (holds the socket
    until stopped): what a hung S3 endpoint looks like to a client."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.connections = 0
        self.requests = 0
        self._held: list[socket.socket] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with self._lock:
                self.connections += 1
                self._held.append(conn)
            threading.Thread(target=self._read_head, args=(conn,), daemon=True).start()

    def _read_head(self, conn: socket.socket) -> None:
        buf = b""
        while b"\r\n\r\n" not in buf:
            try:
                chunk = conn.recv(65536)
            except OSError:
                return
            if not chunk:
                return
            buf += chunk
        with self._lock:
            self.requests += 1

    def stop(self) -> None:
        self._stop.set()
        self.sock.close()
        with self._lock:
            for c in self._held:
                c.close()


@pytest.fixture
def silent_server() -> Iterator[SilentServer]:
    srv = SilentServer()
    yield srv
    srv.stop()


@pytest.mark.timeout(60)  # a hang fails here instead of holding the suite for pytest's default 600 s
@pytest.mark.parametrize("op", ["head", "put"])
def test_a_silent_endpoint_fails_within_the_retry_budget(aws_env: None, silent_server: SilentServer, op: str) -> None:
    store, _ = open_blob_store(f"s3://bkt/p?endpoint={silent_server.url}&region=us-east-1"
                               "&read_timeout=1&connect_timeout=1&max_attempts=2")
    with pytest.raises(BlobStoreError) as e:
        if op == "head":
            store.head("p/some-key")
        else:
            store.put("p/some-key", b"x" * 100)
    assert "s3://bkt/p/some-key" in str(e.value) and "read timeout" in str(e.value).lower()
    # two attempts in all (max_attempts counts the first one), each on a fresh connection
    assert 1 <= silent_server.connections <= 2 and silent_server.requests <= 2


def test_a_ceph_style_region_is_accepted() -> None:
    assert parse_store_url("s3://bkt/p?region=default&endpoint=http://127.0.0.1:7480").region == "default"


@pytest.mark.parametrize(("store", "message"), [
    ({"driver": "aws-s3", "bucket": "bkt", "endpoint": "notaurl"}, "endpoint"),
    ({"driver": "aws-s3", "bucket": "bkt", "region": "US_EAST"}, "region"),
])
def test_a_policy_store_is_checked_like_a_configured_one(store, message) -> None:
    from tieredcore.errors import ValidationError
    from tieredcore.policy import StoreSpec

    with pytest.raises(ValidationError, match=message):
        StoreSpec(**store).validate("namespace a/b")


def test_ledgers_in_the_workspace_store_are_read_with_its_timeouts(tmp_path) -> None:
    """Driver metadata records bucket, region and endpoint only: reads of the workspace's own store use
    the configured URL (timeouts, retry budget), not the defaults."""
    from tieredcore.config import Config
    from tieredcore.formats.proto import MLDataFormats_pb2 as pb
    from tieredcore.workspace import Workspace

    url = "s3://bkt-a/p?endpoint=http://127.0.0.1:9&region=us-east-1&read_timeout=3s&max_attempts=2"
    cfg = Config.for_workspace(tmp_path, store_url=url)
    with Workspace(cfg) as ws:
        dm = pb.OffloadDriverMetadata(name="aws-s3")
        for k, v in (("bucket", "bkt-a"), ("prefix", "p/"), ("region", "us-east-1"),
                     ("serviceEndpoint", "http://127.0.0.1:9")):
            dm.properties.add(key=k, value=v)
        store = ws.offloader_for_driver(dm).store
        assert store.client.meta.config.read_timeout == 3
        assert store.client.meta.config.retries["total_max_attempts"] == 2
        dm.properties[0].value = "bkt-b"  # another bucket: the defaults
        assert ws.offloader_for_driver(dm).store.client.meta.config.read_timeout == 10


# --- driver metadata as Pulsar's offloaders record it (tieredcore/cold/drivers.py) -------------------------


def _dm(name: str, **props: str):
    from tieredcore.formats.proto import MLDataFormats_pb2 as pb

    dm = pb.OffloadDriverMetadata(name=name)
    for k, v in props.items():
        dm.properties.add(key=k, value=v)
    return dm


def jclouds_metadata(driver: str, constant: str, bucket: str = "", region: str = "", endpoint: str = ""):
    """What Pulsar >= 2.6 records (tiered-storage/jcloud: BlobStoreManagedLedgerOffloader.getOffloadDriverName is
    the provider's driver; TieredStorageConfiguration.getOffloadDriverMetadata writes managedLedgerOffloadDriver
    = the JCloudBlobStoreProvider constant's name, bucket, region, serviceEndpoint; '' when not configured)."""
    return _dm(driver, managedLedgerOffloadDriver=constant, bucket=bucket, region=region, serviceEndpoint=endpoint)


def legacy_metadata(driver: str, bucket: str, region: str = "", endpoint: str = ""):
    """What Pulsar 2.2 - 2.5 recorded (its BlobStoreManagedLedgerOffloader: the driver name as configured,
    DRIVER_NAMES = S3, aws-s3, google-cloud-storage matched ignoring case; bucket, region, endpoint)."""
    return _dm(driver, bucket=bucket, region=region, endpoint=endpoint)


PULSAR_DRIVERS = [
    (jclouds_metadata("aws-s3", "AWS_S3", "pulsar-offload", "us-west-2"),
     StoreLocation("s3", bucket="pulsar-offload", region="us-west-2")),
    (jclouds_metadata("aws-s3", "AWS_S3", "pulsar-offload", "", "http://minio:9000"),
     StoreLocation("s3", bucket="pulsar-offload", endpoint="http://minio:9000")),
    (jclouds_metadata("google-cloud-storage", "GOOGLE_CLOUD_STORAGE", "pulsar-gcs", "europe-west3"),
     StoreLocation("gs", bucket="pulsar-gcs")),
    (jclouds_metadata("azureblob", "AZURE_BLOB", "pulsar-container"), StoreLocation("azure", bucket="pulsar-container")),
    (legacy_metadata("S3", "old-bucket", "eu-west-1"), StoreLocation("s3", bucket="old-bucket", region="eu-west-1")),
    (legacy_metadata("s3", "old-bucket", "", "http://ceph:7480"),  # the legacy `endpoint` key is honoured
     StoreLocation("s3", bucket="old-bucket", endpoint="http://ceph:7480")),
    (legacy_metadata("AWS-S3", "old-bucket", "us-east-1"), StoreLocation("s3", bucket="old-bucket", region="us-east-1")),
    (legacy_metadata("google-cloud-storage", "old-gcs", "us-central1"), StoreLocation("gs", bucket="old-gcs")),
    # this project's local store, and its records from before it recorded "tiered-local"
    (_dm("tiered-local", root="/data/cold"), StoreLocation("file", root="/data/cold")),
    (_dm("filesystem", root="/data/cold", prefix="p/"), StoreLocation("file", root="/data/cold", prefix="p/")),
]


@pytest.mark.parametrize("dm, expected", PULSAR_DRIVERS, ids=lambda x: getattr(x, "name", None))
def test_every_driver_pulsar_records_opens_its_store(dm, expected) -> None:
    assert StoreLocation.from_driver_metadata(dm) == expected


@pytest.mark.parametrize("dm, match", [
    # tiered-storage/file-system: FileSystemManagedLedgerOffloader records driver "filesystem" and one
    # property, storageBasePath (hadoop.tmp.dir, or "null"): Hadoop MapFiles, not blob-store objects
    (_dm("filesystem", storageBasePath="/pulsar/offloaded"), "Hadoop MapFile: not a blob-store offloader"),
    (_dm("filesystem", storageBasePath="null"), "Hadoop MapFile: not a blob-store offloader"),
    (_dm("filesystem", storageBasePath="/p", root="/x"), "Hadoop MapFile"),  # both: not ours to guess
    (jclouds_metadata("aliyun-oss", "ALIYUN_OSS", "oss-bucket", "", "https://oss-cn-hangzhou.aliyuncs.com"),
     "Aliyun OSS .*virtual-hosted"),
    (jclouds_metadata("transient", "TRANSIENT", "test-bucket"), "in-memory"),
    (_dm("hdfs", bucket="x"), "unknown offload driver 'hdfs'"),
    (jclouds_metadata("aws-s3", "AWS_S3"), "without a 'bucket' property"),
    (_dm("tiered-local"), "without a 'root' property"),
])
def test_drivers_this_project_does_not_read_say_why(dm, match) -> None:
    with pytest.raises(ValidationError, match=match):
        StoreLocation.from_driver_metadata(dm)


@pytest.mark.parametrize("url", ["s3://bkt/p?endpoint=http://127.0.0.1:9000&region=eu-west-1", "s3://bkt",
                                 "azure://cont/q", "gs://bkt", "file:///data/cold?prefix=x"])
def test_what_the_project_records_carries_pulsars_keys(url) -> None:
    loc = parse_store_url(url)
    props = loc.driver_properties()
    if loc.scheme == "file":
        assert loc.driver == "tiered-local" and props["root"] == "/data/cold"
        assert "managedLedgerOffloadDriver" not in props  # not one of Pulsar's drivers
    else:
        constant = {"s3": "AWS_S3", "azure": "AZURE_BLOB", "gs": "GOOGLE_CLOUD_STORAGE"}[loc.scheme]
        assert {k: props[k] for k in ("managedLedgerOffloadDriver", "bucket")} == {
            "managedLedgerOffloadDriver": constant, "bucket": loc.bucket}
        assert props["serviceEndpoint"] == (loc.endpoint or "") and "region" in props
    assert StoreLocation.from_driver_metadata(loc.driver_metadata()).same_objects(loc)


def test_a_workspace_reads_ledgers_pulsar_recorded_with_each_s3_spelling(make_ws, moto_endpoint) -> None:
    """Objects offloaded to S3 (moto) read back whether the ledger's driver metadata is what this project
    writes, what Pulsar >= 2.6 writes, or what Pulsar 2.2 - 2.5 wrote (driver S3, legacy `endpoint`)."""
    import boto3

    from tests.support.workspaces import offload_one, sealed

    boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1").create_bucket(Bucket="pulsar-drivers")
    ws = make_ws(["t/a"])  # its own store is a local one: reads must follow the ledger's driver metadata
    topic = "persistent://t/a/topic-0000"
    lid = sealed(ws, topic)[0]
    s3 = parse_store_url(f"s3://pulsar-drivers?endpoint={moto_endpoint}&region=us-east-1")
    offload_one(ws, topic, lid, offloader=ws.offloader_at(s3))
    r = ws.reader("bookkeeper-first")
    try:
        expected = [(p, bytes(d)) for p, d in r.read(topic) if p.ledger_id == lid]
    finally:
        r.close()
    ws.hot.delete_ledger(lid)  # from now on only the object store holds the ledger
    for dm in (jclouds_metadata("aws-s3", "AWS_S3", "pulsar-drivers", "us-east-1", moto_endpoint),
               legacy_metadata("S3", "pulsar-drivers", "", moto_endpoint),
               legacy_metadata("aws-s3", "pulsar-drivers", "us-east-1", moto_endpoint)):
        def rewrite(info, dm=dm):
            ctx = info.ledgerInfo[0].offloadContext
            ctx.driverMetadata.CopyFrom(dm)
            ctx.bookkeeperDeleted = True
        ws.ml.update_topic(topic, rewrite)
        r = ws.reader()
        try:
            got = [(p, bytes(d)) for p, d in r.read(topic) if p.ledger_id == lid]
        finally:
            r.close()
        assert got == expected and len(got) == 10


def test_local_store_records_of_earlier_versions_still_read(make_ws) -> None:
    """A workspace's existing records name its local store "filesystem" (with `root`): they read as before;
    the same name with Pulsar's filesystem offloader's property fails that ledger's read, saying why."""
    from tests.support.workspaces import offload_one, sealed
    from tieredcore.errors import TieredError

    ws = make_ws(["t/a"])
    topic = "persistent://t/a/topic-0000"
    lid = sealed(ws, topic)[0]
    offload_one(ws, topic, lid)
    info, _ = ws.ml.get_topic(topic)
    dm = info.ledgerInfo[0].offloadContext.driverMetadata
    assert dm.name == "tiered-local" and {kv.key for kv in dm.properties} == {"root"}
    r = ws.reader("bookkeeper-first")
    try:
        expected = [(p, bytes(d)) for p, d in r.read(topic) if p.ledger_id == lid]
    finally:
        r.close()
    ws.hot.delete_ledger(lid)
    root = ws.store.root
    for name, props, ok in (("filesystem", {"root": str(root)}, True),
                            ("filesystem", {"storageBasePath": str(root)}, False)):
        def rewrite(info, name=name, props=props):
            ctx = info.ledgerInfo[0].offloadContext
            ctx.driverMetadata.CopyFrom(_dm(name, **props))
            ctx.bookkeeperDeleted = True
        ws.ml.update_topic(topic, rewrite)
        r = ws.reader()
        try:
            if ok:
                assert [(p, bytes(d)) for p, d in r.read(topic) if p.ledger_id == lid] == expected
            else:
                with pytest.raises(TieredError, match="Hadoop MapFile"):
                    list(r.read(topic))
        finally:
            r.close()


def test_a_policy_names_the_local_store_either_way() -> None:
    from tieredcore.policy import StoreSpec

    new, old = StoreSpec("tiered-local", root="/x/cold", prefix="p"), StoreSpec("filesystem", root="/x/cold", prefix="p")
    for spec in (new, old):
        spec.validate("namespace a/b")
    assert new.location() == old.location() and new.location().driver == "tiered-local"
    with pytest.raises(ValidationError, match="absolute root"):
        StoreSpec("tiered-local", root="x").validate("namespace a/b")
