"""tieredcore.config: defaults, TOML file, environment overrides, store URLs."""

from __future__ import annotations

import dataclasses
import socket
from pathlib import Path

import pytest

from tieredcore.cold.backends.fs import FilesystemBlobStore
from tieredcore.cold.location import open_blob_store
from tieredcore.config import CONFIG_FILE_NAME, ENV_CONFIG, ENV_OVERRIDES, Config, open_metadata_store
from tieredcore.errors import MetadataStoreError, ValidationError
from tieredcore.formats.constants import DEFAULT_MAX_BLOCK_SIZE, DEFAULT_READ_BUFFER_SIZE

MIB = 1024 * 1024


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


MINIMAL = 'metadata_url = "sqlite:///m.db"\nhot_url = "file:///h"\nstore_url = "file:///c"\n'


# --- defaults --------------------------------------------------------------------------------


def test_for_workspace_defaults(tmp_path: Path) -> None:
    cfg = Config.for_workspace(tmp_path / "ws")
    root = (tmp_path / "ws").resolve()
    assert cfg.metadata_url == f"sqlite:///{root}/metadata.db"
    assert cfg.hot_url == f"file://{root}/hot"
    assert cfg.store_url == f"file://{root}/cold"
    assert cfg.reports_dir == str(root / "reports")
    assert cfg.cluster == "standalone"
    assert cfg.spark_master == "local[*]"
    assert cfg.max_block_size == DEFAULT_MAX_BLOCK_SIZE
    assert cfg.read_buffer == DEFAULT_READ_BUFFER_SIZE
    assert cfg.store_fsync is True and cfg.hot_fsync is False
    # the URLs open the directories they name
    store, prefix = cfg.open_store()
    assert isinstance(store, FilesystemBlobStore) and store.root == root / "cold" and prefix == ""
    hot = cfg.open_hot()
    try:
        assert hot.root == root / "hot"
    finally:
        hot.close()


def test_for_workspace_relative_root_and_overrides(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    cfg = Config.for_workspace("rel", cluster="c1", max_block_size=8 * MIB)
    assert cfg.hot_url == f"file://{tmp_path.resolve()}/rel/hot"
    assert cfg.cluster == "c1" and cfg.max_block_size == 8 * MIB
    with pytest.raises(TypeError):
        Config.for_workspace("rel", no_such_field=1)


def test_for_workspace_path_with_url_special_characters(tmp_path: Path) -> None:
    root = tmp_path / "a b%41#c?d"
    cfg = Config.for_workspace(root)
    store, _ = cfg.open_store()
    assert store.root == root / "cold"
    hot = cfg.open_hot()
    try:
        assert hot.root == root / "hot"
    finally:
        hot.close()
    meta = cfg.open_metadata()
    try:
        meta.get("/")
    finally:
        meta.close()
    assert (root / "metadata.db").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == [root.name]


def test_post_init_validation() -> None:
    base = dict(metadata_url="sqlite:///m", hot_url="file:///h", store_url="file:///c")
    for name in ("metadata_url", "hot_url", "store_url"):
        with pytest.raises(ValidationError, match=name):
            Config(**{**base, name: ""})
    with pytest.raises(ValidationError, match="read_buffer"):
        Config(**base, read_buffer=0)
    # small blocks are fine on the filesystem store, not on S3 (5 MiB minimum part size)
    assert Config(**base, max_block_size=1024).max_block_size == 1024
    with pytest.raises(ValidationError, match="5 MiB"):
        Config(**{**base, "store_url": "s3://bucket/p"}, max_block_size=5 * MIB - 1)
    assert Config(**{**base, "store_url": "s3://bucket/p"}, max_block_size=5 * MIB).max_block_size == 5 * MIB


# --- loading ---------------------------------------------------------------------------------


def test_load_from_file(tmp_path: Path) -> None:
    p = write(tmp_path / "t.toml", MINIMAL + 'cluster = "east"\nmax_block_size = 1048576\nhot_fsync = true\n')
    cfg = Config.load(p, env={})
    assert cfg == Config(metadata_url="sqlite:///m.db", hot_url="file:///h", store_url="file:///c",
                         cluster="east", max_block_size=MIB, hot_fsync=True)
    assert Config.load(str(p), env={}) == cfg


def test_load_path_resolution(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a = write(tmp_path / "a.toml", MINIMAL + 'cluster = "a"\n')
    monkeypatch.chdir(tmp_path)
    # nothing anywhere
    with pytest.raises(ValidationError, match="incomplete"):
        Config.load(env={})
    # ./tiered.toml
    write(tmp_path / CONFIG_FILE_NAME, MINIMAL + 'cluster = "cwd"\n')
    assert Config.load(env={}).cluster == "cwd"
    # $TIERED_CONFIG wins over ./tiered.toml, an explicit path over both
    assert Config.load(env={ENV_CONFIG: str(a)}).cluster == "a"
    assert Config.load(tmp_path / CONFIG_FILE_NAME, env={ENV_CONFIG: str(a)}).cluster == "cwd"
    with pytest.raises(ValidationError, match="does not exist"):
        Config.load(tmp_path / "missing.toml", env={})
    with pytest.raises(ValidationError, match="does not exist"):
        Config.load(env={ENV_CONFIG: str(tmp_path / "missing.toml")})


def test_env_overrides(tmp_path: Path) -> None:
    p = write(tmp_path / "t.toml", MINIMAL + 'cluster = "file"\n')
    env = {
        "TIERED_METADATA_URL": "sqlite:///env.db",
        "TIERED_HOT_URL": "file:///env-hot",
        "TIERED_STORE_URL": "s3://bkt/pre?region=eu-west-1",
        "TIERED_CLUSTER": "env",
        "TIERED_REPORTS_DIR": "/reports",
        "TIERED_SPARK_MASTER": "spark://x:7077",
        "TIERED_SPARK_SHARDS": "5",
        "TIERED_MAX_BLOCK_SIZE": str(16 * MIB),
        "TIERED_READ_BUFFER": "4096",
        "TIERED_CHECKPOINT_INTERVAL": "0",
        "TIERED_CHECKSUM_CHUNK": "4096",
        "TIERED_VERIFY_READS": "false",
        "TIERED_STORE_FAILURE_LIMIT": "2",
        "TIERED_STORE_DEAD_AFTER": "7.5",
        "TIERED_LEASE_TTL_MS": "60000",
        "TIERED_KEY_RING": "/keys/ring",
        "TIERED_CHUNK_CACHE": "disk:/var/cache/tiered",
        "TIERED_CHUNK_CACHE_SIZE": "1048576",
        "TIERED_CHUNK_CACHE_PREFETCH": "0",
        "TIERED_CHUNK_CACHE_TTL_MS": "5000",
        "TIERED_UPLOAD_CONCURRENCY": "8",
        "TIERED_UPLOAD_PART_SIZE": str(16 * MIB),
        "TIERED_PRICE_STORAGE_GB_MONTH": "0.0125",
        "TIERED_PRICE_GET_1000": "0.001",
        "TIERED_PRICE_PUT_1000": "0.01",
        "TIERED_PRICE_LIST_1000": "0",
        "TIERED_PRICE_DELETE_1000": "0.5",
        "TIERED_EXPORT_CATALOG_URL": "postgresql+psycopg2://u@db/iceberg",
        "TIERED_EXPORT_WAREHOUSE": "s3://lake/warehouse",
        "TIERED_MANIFESTS_KEEP": "5",
        "TIERED_REPLICA_OF": "s3://bkt/pre?region=eu-west-1",
        "UNRELATED": "x",
    }
    # every variable but TIERED_BROKERS_DEFAULT, which needs an attached workspace (the test below)
    assert set(env) - {"UNRELATED"} == set(ENV_OVERRIDES) - {"TIERED_BROKERS_DEFAULT"}
    cfg = Config.load(p, env=env)
    assert cfg == Config(metadata_url="sqlite:///env.db", hot_url="file:///env-hot",
                         store_url="s3://bkt/pre?region=eu-west-1", cluster="env", reports_dir="/reports",
                         spark_master="spark://x:7077", spark_shards=5, max_block_size=16 * MIB, read_buffer=4096,
                         checkpoint_interval=0, checksum_chunk=4096, verify_reads=False, store_failure_limit=2, store_dead_after=7.5,
                         lease_ttl_ms=60000, key_ring="/keys/ring", chunk_cache="disk:/var/cache/tiered",
                         chunk_cache_size=1048576, chunk_cache_prefetch=0, chunk_cache_ttl_ms=5000,
                         upload_concurrency=8, upload_part_size=16 * MIB,
                         price_storage_gb_month=0.0125, price_get_per_1000=0.001, price_put_per_1000=0.01,
                         price_list_per_1000=0.0, price_delete_per_1000=0.5,
                         export_catalog_url="postgresql+psycopg2://u@db/iceberg",
                         export_warehouse="s3://lake/warehouse", manifests_keep=5,
                         replica_of="s3://bkt/pre?region=eu-west-1")
    # without a file, the environment alone is enough; an empty variable does not override
    cfg = Config.load(env={**env, "TIERED_CLUSTER": ""})
    assert cfg.cluster == "standalone" and cfg.read_buffer == 4096
    assert Config.load(p, env={"TIERED_CLUSTER": ""}).cluster == "file"


def test_a_replica_reads_the_bucket_it_follows(tmp_path: Path) -> None:
    """replica_of (a read replica) is the store_url's bucket and prefix, and not with an attached store."""
    cfg = Config.for_workspace(tmp_path, store_url="s3://bkt/pre?region=eu-west-1",
                               replica_of="s3://bkt/pre?region=eu-west-1&max_attempts=5")
    assert cfg.replica and not Config.for_workspace(tmp_path).replica
    assert Config.load(write(tmp_path / "r.toml", cfg.to_toml()), env={}) == cfg  # round trip
    with pytest.raises(ValidationError, match="store_url 's3://bkt/other' must be replica_of"):
        Config.for_workspace(tmp_path, store_url="s3://bkt/other", replica_of="s3://bkt/pre")
    with pytest.raises(ValidationError, match="replica_of: .*bad"):
        Config.for_workspace(tmp_path, store_url="s3://bkt/pre", replica_of="ftp://bad")


def test_prices_default_to_s3_standard_and_bad_ones_are_refused(tmp_path: Path) -> None:
    p = write(tmp_path / "t.toml", MINIMAL + "price_storage_gb_month = 1\n")
    cfg = Config.load(p, env={})
    assert cfg.price_storage_gb_month == 1.0 and isinstance(cfg.price_storage_gb_month, float)
    assert (cfg.price_get_per_1000, cfg.price_put_per_1000, cfg.price_list_per_1000) == (0.0004, 0.005, 0.005)
    assert Config.load(write(tmp_path / "r.toml", cfg.to_toml()), env={}) == cfg  # round trip
    with pytest.raises(ValidationError, match="price_get_per_1000 must be a number, got 'cheap'"):
        Config.load(p, env={"TIERED_PRICE_GET_1000": "cheap"})
    for bad in ("-0.1", "nan", "inf"):
        with pytest.raises(ValidationError, match="price_put_per_1000 must be a non-negative number"):
            Config.load(p, env={"TIERED_PRICE_PUT_1000": bad})


def test_env_bad_integer(tmp_path: Path) -> None:
    p = write(tmp_path / "t.toml", MINIMAL)
    with pytest.raises(ValidationError, match="read_buffer must be an integer"):
        Config.load(p, env={"TIERED_READ_BUFFER": "lots"})
    with pytest.raises(ValidationError, match="5 MiB"):
        Config.load(p, env={"TIERED_STORE_URL": "s3://bkt/p", "TIERED_MAX_BLOCK_SIZE": "1024"})
    with pytest.raises(ValidationError, match="upload_concurrency must be 1..64, got 0"):
        Config.load(p, env={"TIERED_UPLOAD_CONCURRENCY": "0"})
    with pytest.raises(ValidationError, match="upload_part_size 1048576 is below S3's 5 MiB"):
        Config.load(p, env={"TIERED_UPLOAD_PART_SIZE": str(MIB)})


def test_unknown_key_in_file(tmp_path: Path) -> None:
    p = write(tmp_path / "t.toml", MINIMAL + "stor_url = 'typo'\n")
    with pytest.raises(ValidationError, match="unknown key 'stor_url'") as e:
        Config.load(p, env={})
    assert str(p) in str(e.value) and "store_url" in str(e.value)
    p = write(tmp_path / "t2.toml", MINIMAL + "[store]\nurl = 'x'\n")
    with pytest.raises(ValidationError, match="unknown key 'store'"):
        Config.load(p, env={})


def test_missing_required_lists_env_names(tmp_path: Path) -> None:
    p = write(tmp_path / "t.toml", 'metadata_url = "sqlite:///m.db"\n')
    with pytest.raises(ValidationError) as e:
        Config.load(p, env={})
    msg = str(e.value)
    assert "hot_url" in msg and "store_url" in msg
    assert "TIERED_HOT_URL" in msg and "TIERED_STORE_URL" in msg
    assert "TIERED_METADATA_URL" not in msg
    assert Config.load(p, env={"TIERED_HOT_URL": "file:///h", "TIERED_STORE_URL": "file:///c"}).hot_url == "file:///h"


@pytest.mark.parametrize(
    "text",
    ["metadata_url = ", "metadata_url = 'a'\nmetadata_url = 'b'\n", "[[x", 'hot_url = "unterminated\n',
     "\x00"],
)
def test_bad_toml(tmp_path: Path, text: str) -> None:
    p = write(tmp_path / "t.toml", text)
    with pytest.raises(ValidationError, match="configuration file"):
        Config.load(p, env={})


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ("max_block_size = 'big'", "max_block_size"),
        ("max_block_size = 1.5", "max_block_size"),
        ("read_buffer = true", "read_buffer"),
        ("cluster = 5", "cluster"),
        ("store_fsync = 'sometimes'", None),  # strings are coerced: only 1/true/yes/on are true
        ("hot_fsync = 1", "hot_fsync"),
        ("reports_dir = ['a']", "reports_dir"),
    ],
)
def test_wrong_value_types(tmp_path: Path, extra: str, field: str | None) -> None:
    p = write(tmp_path / "t.toml", MINIMAL + extra + "\n")
    if field is None:
        assert Config.load(p, env={}).store_fsync is False
        return
    with pytest.raises(ValidationError, match=field):
        Config.load(p, env={})


def test_wrong_type_for_a_url(tmp_path: Path) -> None:
    p = write(tmp_path / "t.toml", 'metadata_url = "sqlite:///m"\nhot_url = "file:///h"\nstore_url = 5\n')
    with pytest.raises(ValidationError, match="store_url"):
        Config.load(p, env={})


# --- to_toml ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "cfg",
    [
        Config.for_workspace("/tmp/x"),
        Config(metadata_url="sqlite:///m", hot_url="file:///h", store_url="s3://bkt/p?endpoint=http://h:9000",
               max_block_size=5 * MIB, read_buffer=1, store_fsync=False, hot_fsync=True),
        Config(metadata_url='sqlite:///we"ird\\path', hot_url="file:///é ünï/ç", store_url="file:///c",
               cluster="c-1", reports_dir="tab\there\nnewline \x7f end", spark_master="k8s://https://a:443"),
    ],
)
def test_to_toml_round_trip(tmp_path: Path, cfg: Config) -> None:
    p = write(tmp_path / "t.toml", cfg.to_toml())
    assert Config.load(p, env={}) == cfg
    assert p.read_text().startswith("#")
    # every field is written, so the file alone is a complete configuration
    assert {line.split(" = ")[0] for line in p.read_text().splitlines()[1:]} == {
        f.name for f in dataclasses.fields(Config)
    }


# --- store URLs ------------------------------------------------------------------------------


def test_open_blob_store_file(tmp_path: Path) -> None:
    store, prefix = open_blob_store(f"file://{tmp_path}/objects", fsync=False)
    assert isinstance(store, FilesystemBlobStore)
    assert store.root == tmp_path / "objects" and prefix == ""
    assert store.fsync is False
    store, _ = open_blob_store(f"file://localhost{tmp_path}/o2")
    assert store.root == tmp_path / "o2"
    store, _ = open_blob_store(f"file://{tmp_path}/with%20space")
    assert store.root == tmp_path / "with space"


@pytest.mark.parametrize("url", ["file://relative/dir", "file://", "file:relative"])
def test_open_blob_store_file_needs_an_absolute_path(tmp_path: Path, monkeypatch, url: str) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValidationError, match="store_url"):
        open_blob_store(url)
    assert list(tmp_path.iterdir()) == []  # nothing created in the current directory


@pytest.fixture
def no_aws(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Creating an S3 client reads no user configuration (and opens no connection)."""
    for var in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_REGION",
                "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))


def test_open_blob_store_s3(no_aws: None) -> None:
    from tieredcore.cold.backends.s3 import S3BlobStore

    store, prefix = open_blob_store("s3://my-bucket/some/prefix?endpoint=http://127.0.0.1:9000&region=eu-west-3")
    assert isinstance(store, S3BlobStore)
    assert store.bucket == "my-bucket"
    assert store.endpoint_url == "http://127.0.0.1:9000"
    assert store.region == "eu-west-3"
    assert prefix == "some/prefix/"  # normalised: the key prefix ends with "/"

    store, prefix = open_blob_store("s3://bkt2?region=us-east-2&max_attempts=2")
    assert (store.bucket, store.endpoint_url, store.region, prefix) == ("bkt2", None, "us-east-2", "")
    store, prefix = open_blob_store("s3://bkt3/")
    assert store.bucket == "bkt3" and prefix == "" and store.region == "us-east-1"
    store, prefix = open_blob_store("s3://bkt4/a%20b/c")
    assert prefix == "a b/c/"


@pytest.mark.parametrize(
    ("url", "match"),
    [
        ("hdfs://nn/p", "unsupported scheme 'hdfs'"),
        ("http://host/p", "unsupported scheme 'http'"),
        ("/plain/path", "unsupported scheme ''"),
        ("s3:///prefix", "missing bucket"),
        ("s3://bkt/p?endpiont=http://x", "unknown parameter.*endpiont"),
        ("s3://bkt/p?region=us-east-1&acl=private", "unknown parameter.*acl"),
        ("s3://bkt/p?max_attempts=many", "max_attempts"),
        ("s3://bkt/p?max_attempts=0", "max_attempts"),
    ],
)
def test_open_blob_store_rejects(no_aws: None, url: str, match: str) -> None:
    with pytest.raises(ValidationError, match=match):
        open_blob_store(url)


def test_open_metadata_store(tmp_path: Path) -> None:
    store = open_metadata_store(f"sqlite:///{tmp_path}/m.db")
    try:
        assert store.get("/") is not None or store.children("/") == []
    finally:
        store.close()
    assert (tmp_path / "m.db").is_file()
    with pytest.raises(ValidationError, match="metadata_url.*unsupported scheme 'etcd'"):
        open_metadata_store("etcd://localhost:2379")


def test_open_metadata_store_names_an_unreachable_zookeeper() -> None:
    # a port nobody listens on: the first operation fails within the URL's timeout, naming the server
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(MetadataStoreError, match=rf"cannot connect to ZooKeeper at 127.0.0.1:{port}"):
        store = open_metadata_store(f"zk://127.0.0.1:{port}/t?timeout=1s")
        try:
            store.get("/")
        finally:
            store.close()


def test_open_hot_rejects_non_file_urls(tmp_path: Path) -> None:
    base = dict(metadata_url="sqlite:///m", store_url="file:///c")
    with pytest.raises(ValidationError, match="hot_url"):
        Config(**base, hot_url="s3://bucket/hot").open_hot()
    with pytest.raises(ValidationError, match="hot_url"):
        Config(**base, hot_url="file://relative/hot").open_hot()


def test_an_attached_workspace_from_the_environment_alone() -> None:
    """The scale-out stack pointed at a Pulsar cluster (docs/pulsar.md): no file, TIERED_* only."""
    env = {"TIERED_METADATA_URL": "zk://zk1:2181/tiered-storage?chroot=/pulsar&attached=true",
           "TIERED_HOT_URL": "bookkeeper:", "TIERED_STORE_URL": "s3://pulsar-offload?region=eu-west-1",
           "TIERED_CLUSTER": "prod-1", "TIERED_BROKERS_DEFAULT": "true"}
    cfg = Config.load(None, env=env)
    assert cfg.attached and cfg.brokers_default and cfg.cluster == "prod-1"
    with pytest.raises(ValidationError, match="brokers_default applies to a workspace attached"):
        Config.load(None, env={**env, "TIERED_METADATA_URL": "zk://zk1:2181/tiered-storage",
                               "TIERED_HOT_URL": "file:///hot"})

