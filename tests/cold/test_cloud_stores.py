"""The Azure Blob (on Azurite) and GCS (on gcp-storage-emulator) stores: the BlobStore contract
(tests/support/blob_contract.py; GCS behind tests/support/gcs_proxy.py, which enforces the generation
preconditions and the paging the emulator ignores, so no contract case is skipped), then what they do beyond it: GCS compose rounds beyond 32 parts, Azure metadata names,
abort next to a committed blob, the reserved upload area, keys that need escaping; and the emulator
lookup's error."""

from __future__ import annotations

import pytest

from tests.support.blob_contract import BlobStoreContract
from tests.support.gcs_proxy import GcsConformingProxy
from tieredcore.errors import NoSuchUploadError, ValidationError


class TestAzureStoreContract(BlobStoreContract):
    @pytest.fixture
    def store(self, azure_store):
        return azure_store


class TestGcsStoreContract(BlobStoreContract):
    @pytest.fixture
    def store(self, gcs_store, gcs_emulator):
        """The store through a proxy that answers as GCS does where the emulator does not."""
        from tieredcore.cold.backends.gcs import GcsBlobStore

        with GcsConformingProxy(gcs_emulator.endpoint) as proxy:
            yield GcsBlobStore(gcs_store.bucket_name, endpoint=proxy.url, max_attempts=2, env={})


def test_the_gcs_proxy_refuses_a_conditional_create_and_pages_listings(gcs_store, gcs_emulator) -> None:
    """The proxy does what GCS does (so the contract above runs the store's 412 and paging paths)."""
    from tieredcore.cold.backends.gcs import GcsBlobStore
    from tieredcore.errors import ObjectExistsError

    with GcsConformingProxy(gcs_emulator.endpoint) as proxy:
        store = GcsBlobStore(gcs_store.bucket_name, endpoint=proxy.url, max_attempts=1, env={})
        store.put("k", b"1", if_absent=True)
        with pytest.raises(ObjectExistsError):
            store.put("k", b"2", if_absent=True)
        assert store.get("k") == b"1" and proxy.refused == 1
        for i in range(5):
            store.put(f"p/{i}", b"x")
        first = store.list("p/", page_size=2)
        assert [o.key for o in first.objects] == ["p/0", "p/1"] and first.next_token
        assert [o.key for o in store.list("p/", first.next_token, page_size=2).objects] == ["p/2", "p/3"]
        assert [o.key for o in store.list("p/", page_size=10, start_after="p/2").objects] == ["p/3", "p/4"]
        assert proxy.pages >= 2


@pytest.fixture(params=["azure", "gcs"])
def cloud_store(request):
    return request.getfixturevalue(f"{request.param}_store")


def _raw_names(store) -> list[str]:
    """Every object of the container/bucket, the reserved area included (the service's own listing)."""
    if store.driver == "azureblob":
        return sorted(b.name for b in store.client.list_blobs())
    return sorted(b.name for b in store.client.list_blobs(store.bucket))


def test_gcs_composes_more_than_32_parts_in_rounds(gcs_store) -> None:
    up = gcs_store.initiate_multipart("big/obj", {"role": "data"})
    chunks = [bytes([i]) * (10 + i) for i in range(70)]  # 70 parts: 3 rounds of intermediates, then one
    parts = [gcs_store.upload_part("big/obj", up, i + 1, c) for i, c in enumerate(chunks)]
    gcs_store.complete_multipart("big/obj", up, parts)
    assert gcs_store.get("big/obj") == b"".join(chunks)
    assert gcs_store.head("big/obj").metadata == {"role": "data"}
    assert _raw_names(gcs_store) == ["big/obj"]  # parts, intermediates and the marker are gone
    with pytest.raises(NoSuchUploadError):
        gcs_store.complete_multipart("big/obj", up, parts)


def test_azure_metadata_names(azure_store) -> None:
    """Identifier names are stored as they are (Pulsar's readers look them up by name); others are
    encoded, and every one reads back."""
    meta = {"S3ManagedLedgerOffloaderFormatVersion": "1", "format-version": "2", "tieredx_odd": "3", "ü": "4"}
    azure_store.put("m", b"x", meta)
    stored = azure_store.client.get_blob_client("m").get_blob_properties().metadata
    assert stored["s3managedledgeroffloaderformatversion"] == "1"
    assert "format-version" not in stored and "tieredx_odd" not in stored
    assert azure_store.head("m").metadata == {k.lower(): v for k, v in meta.items()}


def test_azure_abort_never_touches_a_committed_blob(azure_store) -> None:
    azure_store.put("k", b"committed", {"v": "1"})
    up = azure_store.initiate_multipart("k")
    azure_store.upload_part("k", up, 1, b"staged")
    azure_store.abort_multipart("k", up)
    assert azure_store.get("k") == b"committed" and azure_store.head("k").metadata == {"v": "1"}
    assert azure_store.list_multipart_uploads() == [] and _raw_names(azure_store) == ["k"]


def test_upload_of_another_key_is_not_found(cloud_store) -> None:
    up = cloud_store.initiate_multipart("a/key")
    with pytest.raises(NoSuchUploadError, match="is one of key 'a/key'"):
        cloud_store.upload_part("b/key", up, 1, b"x")
    cloud_store.abort_multipart("b/key", up)  # not that key's upload: nothing happens
    assert [u.upload_id for u in cloud_store.list_multipart_uploads()] == [up]
    cloud_store.abort_multipart("a/key", up)
    assert cloud_store.list_multipart_uploads() == [] and _raw_names(cloud_store) == []


def test_the_reserved_area_is_refused(cloud_store) -> None:
    for call in (lambda: cloud_store.put(".tiered/uploads/x", b"x"),
                 lambda: cloud_store.initiate_multipart(".tiered/parts/y"),
                 lambda: cloud_store.delete([".tiered/uploads/x"])):
        with pytest.raises(ValidationError, match="reserved area '.tiered/'"):
            call()
    up = cloud_store.initiate_multipart("k")
    assert cloud_store.list().objects == []  # the marker is not an object
    cloud_store.abort_multipart("k", up)


def test_keys_that_need_escaping(cloud_store) -> None:
    keys = ["a b/c", "ü/ß-ledger-1", "q?x=1&y#z", "pct%20"]
    for k in keys:
        cloud_store.put(k, k.encode())
    assert sorted(o.key for o in cloud_store.list().objects) == sorted(keys)
    assert [cloud_store.get(k) for k in keys] == [k.encode() for k in keys]
    cloud_store.delete(keys)
    assert cloud_store.list().objects == []


def test_bad_continuation_token(cloud_store) -> None:
    with pytest.raises(ValidationError, match="not a continuation token of this store"):
        cloud_store.list("", "garbage!")


def test_a_missing_azurite_fails_with_the_reason(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    from tests.support.object_stores import find_azurite

    monkeypatch.setenv("TIERED_AZURITE", str(tmp_path / "nope"))
    with pytest.raises(RuntimeError, match="TIERED_AZURITE=.*nope' is not an executable file"):
        find_azurite()


def test_gcs_requests_carry_the_preconditions_and_paging_the_emulator_ignores(gcs_store, gcs_emulator) -> None:
    """gcp-storage-emulator ignores ifGenerationMatch, maxResults/pageToken and startOffset (the contract
    cases needing them are skipped on it): through a recording proxy, the store sends them as GCS
    expects, and keeps the listing correct when a server ignores them."""
    from tests.support.faulty_s3_proxy import FaultyS3Proxy
    from tieredcore.cold.backends.gcs import GcsBlobStore

    with FaultyS3Proxy(gcs_emulator.endpoint, rate=0) as proxy:
        store = GcsBlobStore(gcs_store.bucket_name, endpoint=proxy.url, max_attempts=1, env={})
        store.put("marker", b"x", if_absent=True)
        assert any(m == "POST" and "ifGenerationMatch=0" in t for m, t, _ in proxy.events)
        for k in ("p/k1", "p/k2", "p/k3", "q/z"):
            store.put(k, b"x")
        page = store.list("p/", page_size=2, start_after="p/k1")
        assert [o.key for o in page.objects] == ["p/k2", "p/k3"]  # the emulator: one page, filtered here
        listing = [t for m, t, _ in proxy.events if m == "GET" and "/o?" in t][-1]
        # startOffset is inclusive in GCS: one name more is asked for (p/k1 itself may come back)
        assert "maxResults=3" in listing and "startOffset=p%2Fk1" in listing and "prefix=p%2F" in listing
        from tieredcore.cold.backends.cloud import encode_token

        token = encode_token("opaque-token", "p/k1")
        assert [o.key for o in store.list("p/", token, page_size=2).objects] == ["p/k2", "p/k3"]
        listing = [t for m, t, _ in proxy.events if m == "GET" and "/o?" in t][-1]
        assert "pageToken=opaque-token" in listing and "startOffset=p%2Fk1" in listing  # the same start


def test_azure_with_a_shared_access_signature(azurite, azure_store) -> None:
    """AZURE_STORAGE_ACCOUNT + AZURE_STORAGE_SAS_TOKEN (no account key in the job's environment)."""
    import datetime as dt

    from azure.storage.blob import ContainerSasPermissions, generate_container_sas

    from tests.support.object_stores import AZURITE_ACCOUNT, AZURITE_KEY
    from tieredcore.cold.backends.azure import AzureBlobStore
    from tieredcore.errors import BlobStoreError

    def sas(**perms: bool) -> str:
        return generate_container_sas(AZURITE_ACCOUNT, azure_store.container, account_key=AZURITE_KEY,
                                      permission=ContainerSasPermissions(**perms),
                                      expiry=dt.datetime.now(dt.UTC) + dt.timedelta(hours=1))

    env = {"AZURE_STORAGE_ACCOUNT": AZURITE_ACCOUNT, "AZURE_STORAGE_BLOB_ENDPOINT": azurite.endpoint,
           "AZURE_STORAGE_SAS_TOKEN": "?" + sas(read=True, write=True, delete=True, list=True, add=True, create=True)}
    store = AzureBlobStore(azure_store.container, env=env)
    up = store.initiate_multipart("mp", {"role": "data"})
    store.complete_multipart("mp", up, [store.upload_part("mp", up, 1, b"abc"), store.upload_part("mp", up, 2, b"d")])
    assert store.get("mp") == b"abcd" and [o.key for o in store.list().objects] == ["mp"]
    store.delete(["mp"])
    assert store.list().objects == []
    read_only = AzureBlobStore(azure_store.container, env={**env, "AZURE_STORAGE_SAS_TOKEN": sas(read=True, list=True)})
    with pytest.raises(BlobStoreError, match=rf"azure://{azure_store.container}/k: put failed: .*403"):
        read_only.put("k", b"x")


@pytest.mark.parametrize("kind", ["azure", "gcs"])
def test_a_failing_server_gets_max_attempts_requests_then_a_clear_error(kind, request) -> None:
    """Every request answered 500 (a fault-injecting proxy in front of the emulator): exactly
    max_attempts requests, then BlobStoreError naming the store, key and operation."""
    from tests.support.faulty_s3_proxy import INTERNAL_ERROR, FaultyS3Proxy
    from tieredcore.errors import BlobStoreError

    server = request.getfixturevalue("azurite" if kind == "azure" else "gcs_emulator")
    base = request.getfixturevalue(f"{kind}_store")
    upstream = f"http://127.0.0.1:{server.port}"
    with FaultyS3Proxy(upstream, rate=1.0, kinds=[INTERNAL_ERROR]) as proxy:
        if kind == "azure":
            from tieredcore.cold.backends.azure import AzureBlobStore

            store = AzureBlobStore(base.container, endpoint=f"{proxy.url}/devstoreaccount1", max_attempts=3,
                                   env=server.env())
            where = f"azure://{base.container}/k"
        else:
            from tieredcore.cold.backends.gcs import GcsBlobStore

            store = GcsBlobStore(base.bucket_name, endpoint=proxy.url, max_attempts=3, env={})
            where = f"gs://{base.bucket_name}/k"
        with pytest.raises(BlobStoreError, match=rf"{where}: get failed: .*500"):
            store.get("k")
        # requests for the object (google-cloud-storage may also fetch the bucket's metadata in the background)
        assert len([t for _, t, _ in proxy.events if "/k" in t]) == 3 and proxy.stats()["forwarded"] == 0
