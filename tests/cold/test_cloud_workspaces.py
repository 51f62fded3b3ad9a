"""A workspace whose object store is azure:// (Azurite) or gs:// (gcp-storage-emulator), driven through the
CLI as an operator would: offload every sealed ledger, read every entry back from the object store, trim
by retention and drain the deletions, then reconcile a seeded orphan pair and a stale upload and drain
again. Credentials and the emulator's address come from the environment only (the URL names just the
container/bucket and prefix), as they reach the Spark jobs."""

from __future__ import annotations

import datetime as dt
import json
import time
import uuid as uuidlib
from pathlib import Path

import pytest

from tests.support.workspaces import END_ISO, build_workspace
from tieredcore.cli.main import main
from tieredcore.cold.blob import iter_objects
from tieredcore.config import CONFIG_FILE_NAME, Config
from tieredcore.formats.keys import data_key, is_topic_manifest_key
from tieredcore.offload.ownership import is_marker_key
from tieredcore.policy import TIERED_FIRST
from tieredcore.workspace import Workspace

T0, T1 = "persistent://t/ns/topic-0000", "persistent://t/ns/topic-0001"
ML0 = "t/ns/persistent/topic-0000"
LEDGERS, ENTRIES = 4, 5


def call(root: Path, capsys, *argv: str) -> dict:
    capsys.readouterr()
    code = main(["--workspace", str(root), "--json", *argv])
    out, err = capsys.readouterr()
    assert code == 0, (argv, code, out, err)
    return json.loads(out)


def open_ws(root: Path) -> Workspace:
    return Workspace(Config.load(root / CONFIG_FILE_NAME, env={}))


@pytest.fixture(params=["azure", "gcs"])
def cloud(request, monkeypatch):
    """(store URL, the store itself) on a fresh container/bucket; the emulator's env in os.environ."""
    if request.param == "azure":
        server = request.getfixturevalue("azurite")
        store = request.getfixturevalue("azure_store")
        url = f"azure://{store.container}/offloaded"
    else:
        server = request.getfixturevalue("gcs_emulator")
        store = request.getfixturevalue("gcs_store")
        url = f"gs://{store.bucket_name}/offloaded"
    for k, v in server.env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("TIERED_NO_PROGRESS", "1")
    return url, store


def test_offload_read_drain_reconcile(cloud, tmp_path: Path, capsys) -> None:
    url, store = cloud
    root = tmp_path / "ws"
    # 1 KiB blocks: every ledger's data object is a multipart upload of several parts (blocks, committed
    # block lists on Azure, composed part objects on GCS)
    build_workspace(root, ["t/ns"], topics=2, ledgers=LEDGERS, entries=ENTRIES, entry_size="300",
                    config_overrides={"store_url": url, "max_block_size": 1024})

    res = call(root, capsys, "offload", "--keep-bytes", "0")
    assert res["failed"] == 0 and res["offloaded"] == 2 * LEDGERS
    everything = [o.key for o in iter_objects(store)]
    manifests = [k for k in everything if is_topic_manifest_key(k, "offloaded/")]
    keys = [k for k in everything if not is_marker_key(k, "offloaded/") and k not in manifests]
    assert len(everything) == len(keys) + len(manifests) + 1  # the workspace's owner marker (conditional create)
    assert len(manifests) >= 2  # each topic's, after its offloads (docs/recovery.md)
    assert len(keys) == 2 * 2 * LEDGERS and all(k.startswith("offloaded/") for k in keys)
    assert all(store.head(k).size > 2 * 1024 for k in keys if not k.endswith("-index"))  # 3+ parts each
    assert store.list_multipart_uploads() == []
    with open_ws(root) as ws:
        # Pulsar's driver metadata names the store; the ledgers' objects are where it says
        info, _ = ws.ml.get_topic(T0)
        dm = info.ledgerInfo[0].offloadContext.driverMetadata
        props = {kv.key: kv.value for kv in dm.properties}
        assert dm.name == store.driver
        assert props["managedLedgerOffloadDriver"] == {"azureblob": "AZURE_BLOB",
                                                       "google-cloud-storage": "GOOGLE_CLOUD_STORAGE"}[store.driver]
        assert props["bucket"] == url.split("/")[2] and props["prefix"] == "offloaded/"
        # every entry, read from the object store (tiered first), equals the generated one
        reader = ws.reader(TIERED_FIRST)
        try:
            for topic in (T0, T1):
                entries = list(reader.read(topic))
                assert len(entries) == LEDGERS * ENTRIES
        finally:
            reader.close()
        assert reader.tier_reads["offloaded"] == 2 * LEDGERS
    assert call(root, capsys, "verify", "--offloaded-only")["failed"] == 0

    # retention trims the oldest ledgers; the drain deletes their objects from the cloud store
    call(root, capsys, "policies", "set", "t/ns", "--retention-time-minutes", "15")
    trimmed = call(root, capsys, "retention", "--namespace", "t/ns", "--as-of", END_ISO)
    gone = {r["ledger"] for r in trimmed["rows"] if r["outcome"] == "trimmed"}
    assert gone
    rep = call(root, capsys, "deletions", "drain", "--as-of", END_ISO)
    assert rep["dead_lettered"] == 0 and rep["stats"]["in_flight"] == 0
    left = [o.key for o in iter_objects(store)
            if not is_marker_key(o.key, "offloaded/") and not is_topic_manifest_key(o.key, "offloaded/")]
    assert len(left) == len(keys) - 2 * len(gone)
    assert not any(k.endswith(f"-ledger-{lid}") or f"-ledger-{lid}-index" in k for k in left for lid in gone)

    # an orphan pair (offloaded, never recorded in a topic) and a stale upload: reconcile, then drain
    u = str(uuidlib.uuid4())
    with open_ws(root) as ws:
        lid = ws.ml.get_topic(T0)[0].ledgerInfo[-2].ledgerId  # the newest sealed one: kept, still hot
        assert lid not in gone and ws.hot.exists(lid)
        with ws.hot.open_ledger(lid) as h:
            ws.offloader.offload(h, u, {"managedledgername": ML0})
    stale_key = data_key("offloaded/", uuidlib.uuid4(), lid)
    stale = store.initiate_multipart(stale_key, {"role": "data"})
    store.upload_part(stale_key, stale, 1, b"x" * 2048)
    later = dt.datetime.fromtimestamp(time.time() + 3 * 3600, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    rep = call(root, capsys, "reconcile", "--as-of", later, "--grace", "1h")
    superseded = rep["manifests_superseded"]  # each topic's manifests past the newest manifests_keep
    assert rep["errors"] == [] and rep["orphan_groups"] == 1 and rep["records_appended"] == 1 and superseded > 0
    assert rep["uploads_aborted"] == 1 and store.list_multipart_uploads() == []
    rep = call(root, capsys, "deletions", "drain", "--as-of", later)
    assert rep["deleted"] == 1 + superseded and rep["dead_lettered"] == 0
    assert not any(u in o.key for o in iter_objects(store))
    assert sorted(o.key for o in iter_objects(store) if not is_marker_key(o.key, "offloaded/")
                  and not is_topic_manifest_key(o.key, "offloaded/")) == sorted(left)
