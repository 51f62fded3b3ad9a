"""Object-store request counting (tieredcore.cold.requests): every store operation of the filesystem,
S3, Azure and GCS stores is one request of its billed kind, counted in every open counter, per namespace label; the
counts of several Spark tasks add up through the accumulator parameter."""

from __future__ import annotations

import threading

import pytest

from tieredcore.cold.requests import (
    RequestCountsParam,
    count_requests,
    counting_partition,
    request_document,
    request_label,
)


@pytest.mark.parametrize("blob_store", ["fs", "s3", "azure", "gcs"], indirect=True)
def test_each_operation_counts_as_its_billed_kind(blob_store):
    with count_requests() as outer:
        blob_store.put("a/1", b"x" * 10)
        with request_label("acme/orders"), count_requests() as inner:
            blob_store.get("a/1")
            blob_store.get_range("a/1", 0, 3)
            blob_store.head("a/1")
            blob_store.list("a/")
            uid = blob_store.initiate_multipart("a/2")
            part = blob_store.upload_part("a/2", uid, 1, b"y" * 5)
            blob_store.complete_multipart("a/2", uid, [part])
            blob_store.list_multipart_uploads("a/")
            blob_store.delete(["a/1", "a/2", "a/none"])
            blob_store.abort_multipart("a/3", "no-such-upload")
        blob_store.delete([])  # no keys: no request
    assert inner.as_dict() == {"acme/orders": {"GET": 3, "PUT": 3, "LIST": 2, "DELETE": 2}}
    assert outer.as_dict() == {"": {"GET": 0, "PUT": 1, "LIST": 0, "DELETE": 0},
                               "acme/orders": {"GET": 3, "PUT": 3, "LIST": 2, "DELETE": 2}}
    assert request_document(outer.as_dict()) == {
        "total": {"GET": 3, "PUT": 4, "LIST": 2, "DELETE": 2},
        "namespaces": {"acme/orders": {"GET": 3, "PUT": 3, "LIST": 2, "DELETE": 2}}}


def test_batch_delete_is_one_request_per_thousand_keys(fs_store):
    with count_requests() as c:
        fs_store.delete([f"k{i}" for i in range(2001)])
    assert c.total()["DELETE"] == 3


def test_failed_requests_count_and_threads_count_unlabelled(fs_store):
    from tieredcore.errors import NoSuchObjectError

    with count_requests() as c, request_label("a/b"):
        with pytest.raises(NoSuchObjectError):
            fs_store.get("missing")
        t = threading.Thread(target=lambda: fs_store.list(""))  # e.g. a read-ahead thread
        t.start()
        t.join()
    assert c.as_dict() == {"a/b": {"GET": 1, "PUT": 0, "LIST": 0, "DELETE": 0},
                           "": {"GET": 0, "PUT": 0, "LIST": 1, "DELETE": 0}}


def test_partition_counts_add_up_through_the_accumulator_param(fs_store):
    class Acc:  # what Spark's Accumulator does with the param, in one process
        def __init__(self) -> None:
            self.param = RequestCountsParam()
            self.value = self.param.zero({})

        def add(self, v: dict) -> None:
            self.value = self.param.addInPlace(self.value, v)

    acc = Acc()

    def work(it):
        for ns in it:
            with request_label(ns):
                fs_store.list("")
                yield ns

    for part in (["a/x", "a/y"], ["a/x"]):
        assert list(counting_partition(acc, work)(iter(part))) == part
    assert acc.value == {"a/x": {"GET": 0, "PUT": 0, "LIST": 2, "DELETE": 0},
                         "a/y": {"GET": 0, "PUT": 0, "LIST": 1, "DELETE": 0}}
