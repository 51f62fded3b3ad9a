"""Shared fixtures.

Object stores:
- ``moto_endpoint`` (session): moto's standalone S3 server on 127.0.0.1, ``http://127.0.0.1:<port>``.
- ``s3_store``: an S3BlobStore on a fresh, uniquely named bucket of that server.
- ``fs_store``: a FilesystemBlobStore under tmp_path.
- ``blob_store``: parametrized over ["fs", "s3"], for contract tests that must hold for both.
- ``azurite`` / ``gcs_emulator`` (session): Azurite and gcp-storage-emulator on 127.0.0.1
  (tests/support/object_stores.py); ``azure_store`` / ``gcs_store``: a store on a fresh container/bucket.
  The BlobStore contract (tests/support/blob_contract.py, a base class) runs over all four stores and over
  the chunked TransformedBlobStore: each store's test module extends it.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

VENV_BIN = Path(sys.executable).parent
MOTO_PART_MIN_SIZE = 1024  # S3_UPLOAD_PART_MIN_SIZE given to moto: non-last parts must be >= this
_MOTO_READY_TIMEOUT = 30.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _http_answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1):
            return True
    except urllib.error.HTTPError:
        return True  # any HTTP answer means the server is up
    except (urllib.error.URLError, OSError):
        return False


# --- AWS / S3 (moto) ---------------------------------------------------------------------------


@pytest.fixture(scope="session")
def aws_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Dummy AWS credentials and region for the session; the real environment is restored after."""
    mp = pytest.MonkeyPatch()
    nowhere = tmp_path_factory.mktemp("aws") / "none"
    mp.setenv("AWS_ACCESS_KEY_ID", "testing")
    mp.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    mp.setenv("AWS_SESSION_TOKEN", "testing")
    mp.setenv("AWS_DEFAULT_REGION", "us-east-1")
    mp.setenv("AWS_CONFIG_FILE", str(nowhere))  # ignore the user's ~/.aws
    mp.setenv("AWS_SHARED_CREDENTIALS_FILE", str(nowhere))
    for var in (
        "AWS_PROFILE",
        "AWS_DEFAULT_PROFILE",
        "AWS_ENDPOINT_URL",
        "AWS_ENDPOINT_URL_S3",
        "AWS_REGION",
    ):
        mp.delenv(var, raising=False)
    yield
    mp.undo()


@pytest.fixture(scope="session")
def moto_endpoint(aws_env: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """URL of a moto S3 server (a subprocess) shared by the session."""
    exe = VENV_BIN / "moto_server"
    if not exe.exists():
        pytest.fail(f"moto_server not found in {VENV_BIN}: run scripts/setup.sh")
    log_path = tmp_path_factory.mktemp("moto") / "moto_server.log"
    env = dict(os.environ, S3_UPLOAD_PART_MIN_SIZE=str(MOTO_PART_MIN_SIZE))
    for _attempt in range(3):  # the free port may be taken between probing and binding
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                [str(exe), "-H", "127.0.0.1", "-p", str(port)],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        deadline = time.monotonic() + _MOTO_READY_TIMEOUT
        while proc.poll() is None and time.monotonic() < deadline:
            if _http_answers(url):
                break
            time.sleep(0.05)
        else:
            if proc.poll() is None:  # still running but never answered
                proc.kill()
                proc.wait()
                pytest.fail(
                    f"moto_server did not answer on {url} within {_MOTO_READY_TIMEOUT}s; see {log_path}"
                )
            continue  # exited (port taken?): try another port
        break
    else:
        pytest.fail(f"moto_server failed to start; see {log_path}:\n{log_path.read_text()[-2000:]}")
    try:
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def s3_store(moto_endpoint: str):
    """S3BlobStore on a new bucket (unique per test) of the session's moto server."""
    from tieredcore.cold.backends.s3 import S3BlobStore

    bucket = f"test-{uuid.uuid4().hex[:24]}"
    store = S3BlobStore(bucket, endpoint_url=moto_endpoint, region="us-east-1", max_attempts=2)
    store.client.create_bucket(Bucket=bucket)
    return store


# --- filesystem --------------------------------------------------------------------------------


@pytest.fixture
def fs_store(tmp_path: Path):
    """FilesystemBlobStore rooted at tmp_path / 'store'."""
    from tieredcore.cold.backends.fs import FilesystemBlobStore

    return FilesystemBlobStore(tmp_path / "store")


# --- Azure Blob (Azurite) and GCS (gcp-storage-emulator) ---------------------------------------


@pytest.fixture(scope="session")
def azurite(tmp_path_factory: pytest.TempPathFactory):
    """Azurite's blob service for the session; no Azurite installed -> the test fails saying how to get it."""
    from tests.support.object_stores import Azurite

    try:
        server = Azurite(tmp_path_factory.mktemp("azurite"))
        server.start()
    except RuntimeError as e:
        pytest.fail(str(e))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def gcs_emulator(tmp_path_factory: pytest.TempPathFactory):
    from tests.support.object_stores import GcsEmulator

    try:
        server = GcsEmulator(tmp_path_factory.mktemp("gcs"))
        server.start()
    except RuntimeError as e:
        pytest.fail(str(e))
    yield server
    server.stop()


@pytest.fixture
def azure_store(azurite):
    """AzureBlobStore on a new container (unique per test) of the session's Azurite."""
    from tieredcore.cold.backends.azure import AzureBlobStore

    store = AzureBlobStore(f"test-{uuid.uuid4().hex[:24]}", endpoint=azurite.endpoint, max_attempts=2,
                           env=azurite.env())
    store.client.create_container()
    return store


@pytest.fixture
def gcs_store(gcs_emulator):
    """GcsBlobStore on a new bucket (unique per test) of the session's GCS emulator."""
    from tieredcore.cold.backends.gcs import GcsBlobStore

    store = GcsBlobStore(f"test-{uuid.uuid4().hex[:24]}", endpoint=gcs_emulator.endpoint, max_attempts=2, env={})
    store.client.create_bucket(store.bucket_name)
    return store


@pytest.fixture(params=["fs", "s3"])
def blob_store(request: pytest.FixtureRequest):
    """Each BlobStore implementation in turn (contract tests)."""
    return request.getfixturevalue(f"{request.param}_store")


@pytest.fixture
def make_ws(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """make_ws(namespaces, **kw) -> an open Workspace built by tests.support.workspaces.build_workspace
    (4 sealed ledgers per topic unless told), closed at teardown."""
    from tests.support.workspaces import build_workspace
    from tieredcore.config import Config
    from tieredcore.workspace import Workspace

    monkeypatch.setenv("TIERED_NO_PROGRESS", "1")
    opened: list[Workspace] = []

    def make(namespaces=("t/a",), **kw) -> Workspace:
        kw.setdefault("ledgers", 4)
        cfg = build_workspace(tmp_path / f"ws{len(opened) + 1}", list(namespaces), **kw)
        ws = Workspace(Config.load(cfg, env={}))
        opened.append(ws)
        return ws

    yield make
    for ws in opened:
        ws.close()


# --- ZooKeeper (Debian's zookeeper 3.8) ---------------------------------------------------------


@pytest.fixture(scope="session")
def zk_server(tmp_path_factory: pytest.TempPathFactory):
    """One real ZooKeeper server on a free loopback port for the session (tests/support/zk.py)."""
    from tests.support.zk import ZooKeeperServer

    server = ZooKeeperServer(tmp_path_factory.mktemp("zookeeper"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def zk_url(zk_server) -> str:
    """A metadata URL on that server whose whole tree (Pulsar's /managed-ledgers included) sits under a
    chroot of its own, so tests never see each other's records."""
    zk_server.ensure_running()
    return zk_server.url(chroot=f"/test-{uuid.uuid4().hex[:12]}")


@pytest.fixture(params=["sqlite", "zk"])
def any_meta(request, tmp_path):
    """A metadata store of each kind (the embedded SQLite file, a real ZooKeeper): for suites whose
    contract must hold on both. A second handle on the same store: pickle.loads(pickle.dumps(store))."""
    if request.param == "zk":
        from tieredcore.meta.zookeeper import ZkMetadataStore

        store = ZkMetadataStore(request.getfixturevalue("zk_url"))
    else:
        from tieredcore.meta.sqlite import SqliteMetadataStore

        store = SqliteMetadataStore(tmp_path / "meta.db")
    yield store
    store.close()


# --- a Pulsar cluster beside the project (attach mode: tests/support/pulsar_cluster.py) -----------------


@pytest.fixture
def pulsar_cluster(zk_server, tmp_path: Path, request, monkeypatch):
    """pulsar_cluster(driver=..., codec=..., register_other=False, ...) -> a new PulsarCluster (ClusterSpec
    fields as keywords; the chroot is unique) in the session's ZooKeeper; driver LOCAL puts its bucket in
    the local store, any other on the session's moto S3 server (a bucket of its own)."""
    from tests.support.pulsar_cluster import LOCAL, ClusterSpec, PulsarCluster, build_cluster

    monkeypatch.setenv("TIERED_NO_PROGRESS", "1")
    made = 0

    def make(register_other: bool = False, **fields) -> PulsarCluster:
        nonlocal made
        made += 1
        spec = ClusterSpec(**{"chroot": f"/pulsar-{uuid.uuid4().hex[:10]}", **fields})
        if spec.driver == LOCAL:
            from tieredcore.cold.backends.fs import FilesystemBlobStore

            root = tmp_path / f"bucket{made}"
            return build_cluster(zk_server.hosts, FilesystemBlobStore(root), f"file://{root}", str(root), spec=spec,
                                 root=str(root), register_other=register_other)
        from tieredcore.cold.backends.s3 import S3BlobStore

        endpoint = request.getfixturevalue("moto_endpoint")
        bucket = f"pulsar-{uuid.uuid4().hex[:20]}"
        store = S3BlobStore(bucket, endpoint_url=endpoint, region="us-east-1", max_attempts=2)
        store.client.create_bucket(Bucket=bucket)
        url = f"s3://{bucket}?endpoint={endpoint}&region=us-east-1"
        return build_cluster(zk_server.hosts, store, url, bucket, endpoint, spec, register_other=register_other)

    return make
