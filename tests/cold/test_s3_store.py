"""S3BlobStore against moto's server: the BlobStore contract (tests/support/blob_contract.py), then what
is specific to it: configuration and error mapping."""

from __future__ import annotations

import socket

import pytest

from tests.support.blob_contract import BlobStoreContract
from tieredcore.cold.backends.s3 import S3BlobStore
from tieredcore.cold.blob import CompletedPart
from tieredcore.errors import BlobStoreError, NoSuchObjectError, NoSuchUploadError, ValidationError

MOTO_PART_MIN_SIZE = 1024  # S3_UPLOAD_PART_MIN_SIZE set by conftest's moto_endpoint


class TestS3StoreContract(BlobStoreContract):
    @pytest.fixture
    def store(self, s3_store):
        return s3_store


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_driver_properties(moto_endpoint):
    store = S3BlobStore("bkt", endpoint_url=moto_endpoint, region="eu-west-1")
    assert store.driver == "aws-s3"
    # the four properties Pulsar's TieredStorageConfiguration.getOffloadDriverMetadata writes, its spelling
    assert store.driver_properties() == {
        "managedLedgerOffloadDriver": "AWS_S3",
        "bucket": "bkt",
        "region": "eu-west-1",
        "serviceEndpoint": moto_endpoint,
    }
    assert store.client.meta.config.s3["addressing_style"] == "path"
    # batch-job defaults (tieredcore.config), not botocore's 60 s timeouts and legacy retries
    cfg = store.client.meta.config
    assert cfg.retries == {"total_max_attempts": 3, "mode": "adaptive"}
    assert (cfg.connect_timeout, cfg.read_timeout) == (5.0, 10.0)  # one request <= 3 x 10 s + backoff
    assert S3BlobStore("bkt", region="us-west-2").driver_properties() == {  # AWS: no endpoint, '' as Pulsar's
        "managedLedgerOffloadDriver": "AWS_S3",
        "bucket": "bkt",
        "region": "us-west-2",
        "serviceEndpoint": "",
    }


def _count_sends(store: S3BlobStore, *operations: str) -> dict[str, int]:
    """HTTP requests actually sent per operation (botocore's before-send event), retries included."""
    counts = dict.fromkeys(operations, 0)
    for op in operations:
        def hook(op=op, **_kwargs):
            counts[op] += 1
        store.client.meta.events.register(f"before-send.s3.{op}", hook)
    return counts


def test_unreachable_endpoint_is_a_blob_store_error(aws_env):
    url = f"http://127.0.0.1:{free_port()}"  # nobody listens there
    store = S3BlobStore(
        "bkt", endpoint_url=url, access_key="AKIDTEST", secret_key="VERYSECRETKEY", max_attempts=1
    )
    sends = _count_sends(store, "GetObject")
    with pytest.raises(BlobStoreError) as ei:
        store.get("some/key")
    assert sends["GetObject"] == 1  # max_attempts=1: one try, no retries
    assert "s3://bkt/some/key" in str(ei.value)
    assert "VERYSECRETKEY" not in str(ei.value) and "AKIDTEST" not in str(ei.value)
    with pytest.raises(BlobStoreError):
        store.put("k", b"x")
    with pytest.raises(BlobStoreError):
        store.delete(["k"])


def test_missing_bucket_is_not_a_missing_object(moto_endpoint):
    store = S3BlobStore("no-such-bucket-here", endpoint_url=moto_endpoint, max_attempts=1)
    with pytest.raises(BlobStoreError) as ei:
        store.get("k")
    assert not isinstance(ei.value, NoSuchObjectError)
    assert "NoSuchBucket" in str(ei.value)
    with pytest.raises(BlobStoreError):
        store.list()


def test_unknown_upload_id_is_fast_despite_moto_500(moto_endpoint, aws_env):
    # moto answers an unknown upload id with a bare HTTP 500; it must not be retried max_attempts times
    store = S3BlobStore("fast-unknown-upload", endpoint_url=moto_endpoint, max_attempts=5)
    store.client.create_bucket(Bucket="fast-unknown-upload")
    sends = _count_sends(store, "UploadPart", "CompleteMultipartUpload")
    with pytest.raises(NoSuchUploadError):
        store.upload_part("k", "bogus-upload", 1, b"x")
    with pytest.raises(NoSuchUploadError):
        store.complete_multipart("k", "bogus-upload", [CompletedPart(1, '"abc"', 1)])
    # each sent once (max_attempts=5 would otherwise resend the bare 500 four more times)
    assert sends == {"UploadPart": 1, "CompleteMultipartUpload": 1}


def test_part_size_minimum_maps_to_validation_error(s3_store):
    uid = s3_store.initiate_multipart("small")
    p1 = s3_store.upload_part("small", uid, 1, b"x" * (MOTO_PART_MIN_SIZE - 1))
    p2 = s3_store.upload_part("small", uid, 2, b"y")
    with pytest.raises(ValidationError):
        s3_store.complete_multipart("small", uid, [p1, p2])
    s3_store.abort_multipart("small", uid)


def test_delete_batches_of_1000(s3_store, monkeypatch):
    for k in ("b/0", "b/1500", "b/2499"):
        s3_store.put(k, b"x")
    calls: list[int] = []
    real = s3_store.client.delete_objects

    def spy(**kwargs):
        calls.append(len(kwargs["Delete"]["Objects"]))
        return real(**kwargs)

    monkeypatch.setattr(s3_store.client, "delete_objects", spy)
    s3_store.delete([f"b/{i}" for i in range(2500)])
    assert calls == [1000, 1000, 500]
    assert s3_store.list().objects == []


def test_delete_per_key_errors_name_the_keys(s3_store, monkeypatch):
    def failing(**kwargs):
        return {"Errors": [{"Key": "locked/obj", "Code": "AccessDenied", "Message": "Access Denied"}]}

    monkeypatch.setattr(s3_store.client, "delete_objects", failing)
    with pytest.raises(BlobStoreError) as ei:
        s3_store.delete(["free/obj", "locked/obj"])
    assert "locked/obj" in str(ei.value) and "AccessDenied" in str(ei.value)
    assert "free/obj" not in str(ei.value)


def test_list_multipart_uploads_paginates(s3_store, monkeypatch):
    ids = [s3_store.initiate_multipart(f"u/{i}") for i in range(5)]
    real = s3_store.client.list_multipart_uploads
    # force small pages so the paginator has to follow KeyMarker/UploadIdMarker
    monkeypatch.setattr(
        s3_store.client, "list_multipart_uploads", lambda **kw: real(**{**kw, "MaxUploads": 2})
    )
    uploads = s3_store.list_multipart_uploads("u/")
    assert sorted(u.upload_id for u in uploads) == sorted(ids)


def test_head_metadata_lower_cased(s3_store):
    s3_store.put("m", b"x", {"Offload-Uuid": "abc"})
    assert s3_store.head("m").metadata == {"offload-uuid": "abc"}


def test_multipart_objects_carry_a_crc32_checksum_of_every_part(s3_store):
    """Uploads are created with CRC32 checksums: every part goes up with its CRC32 (the store checks it on
    receipt), the completion names each part's, and the object keeps a composite CRC32 of its parts."""
    import base64
    import zlib

    uid = s3_store.initiate_multipart("ck")
    a, b = bytes(range(256)) * (MOTO_PART_MIN_SIZE // 256), b"tail"
    p1 = s3_store.upload_part("ck", uid, 1, memoryview(a))
    p2 = s3_store.upload_part("ck", uid, 2, [b[:2], b[2:]])
    for part, data in ((p1, a), (p2, b)):
        assert part.checksum_crc32 == base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode()
    s3_store.complete_multipart("ck", uid, [p1, p2])
    head = s3_store.client.head_object(Bucket=s3_store.bucket, Key="ck", ChecksumMode="ENABLED")
    assert head.get("ChecksumCRC32")  # S3 keeps a composite ("...-2"); moto its own form of it
    assert s3_store.get("ck") == a + b
