"""The fault-injection proxy itself (tests/support/faulty_s3_proxy.py): byte-exact forwarding, faults
injected before the server sees the request, seeded decisions."""

from __future__ import annotations

import socket
import threading
import uuid
from collections.abc import Iterator

import boto3
import pytest
from botocore.config import Config as BotoConfig
from botocore.exceptions import ClientError, ConnectionClosedError

from tests.support.faulty_s3_proxy import (
    DELAY,
    INTERNAL_ERROR,
    REQUEST_FAULT_KINDS,
    RESET,
    SLOW_DOWN,
    FaultyS3Proxy,
)

pytestmark = pytest.mark.timeout(120)


class CannedServer:
    """Upstream stand-in: per connection, reads exactly the next expected number of request bytes,
    records them, answers with the next canned response and closes."""

    def __init__(self, exchanges: list[tuple[int, bytes]]) -> None:
        self.exchanges = list(exchanges)
        self.received: list[bytes] = []
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        for n, response in self.exchanges:
            conn, _ = self.sock.accept()
            with conn:
                data = b""
                while len(data) < n:
                    chunk = conn.recv(n - len(data))
                    if not chunk:
                        break
                    data += chunk
                self.received.append(data)
                conn.sendall(response)

    def close(self) -> None:
        self.sock.close()


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            break
        data += chunk
    return data


def recv_all(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def test_forwards_requests_and_responses_byte_for_byte() -> None:
    put_cl = (b"PUT /bkt/some%20key?partNumber=1&uploadId=x HTTP/1.1\r\nHost: h\r\nX-Amz-Meta-MixedCase: A b\r\n"
              b"x-amz-meta-dup: 1\r\nx-amz-meta-dup: 2\r\nContent-Length: 11\r\n\r\nhello\x00world")
    put_chunked = (b"PUT /bkt/k2 HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\nTrailer: x-amz-checksum-crc32\r\n"
                   b"\r\n5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nx-amz-checksum-crc32: AAAAAA==\r\n\r\n")
    head = b"HEAD /bkt/k3 HTTP/1.1\r\nHost: h\r\n\r\n"
    get = b"GET /bkt/k4 HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n"
    resp_cl = b"HTTP/1.1 200 OK\r\nETag: \"abc\"\r\nContent-Length: 0\r\n\r\n"
    resp_chunked = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nx-amz-id-2: Q\r\n\r\n"
                    b"3\r\nabc\r\n2;x=y\r\nde\r\n0\r\nTrailer-A: 1\r\n\r\n")
    resp_head = b"HTTP/1.1 200 OK\r\nContent-Length: 12345\r\nx-amz-meta-role: data\r\n\r\n"
    resp_until_close = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n" + bytes(range(256)) * 40
    upstream = CannedServer([(len(put_cl), resp_cl), (len(put_chunked), resp_chunked), (len(head), resp_head),
                             (len(get), resp_until_close)])
    try:
        with FaultyS3Proxy(upstream.url, rate=0.0) as proxy, \
                socket.create_connection(("127.0.0.1", int(proxy.url.rsplit(":", 1)[1])), timeout=30) as c:
            # three requests on one kept-alive client connection, then one that asks to close it
            c.sendall(put_cl)
            assert recv_exactly(c, len(resp_cl)) == resp_cl
            c.sendall(put_chunked)
            assert recv_exactly(c, len(resp_chunked)) == resp_chunked
            c.sendall(head)
            assert recv_exactly(c, len(resp_head)) == resp_head  # no body after a HEAD answer
            c.sendall(get)
            assert recv_all(c) == resp_until_close  # body framed by the server closing: so is ours
            assert proxy.stats() == {"requests": 4, "forwarded": 4, "faults": {}}
        assert upstream.received == [put_cl, put_chunked, head, get]
    finally:
        upstream.close()


def test_expect_100_continue_is_answered_by_the_proxy() -> None:
    req = b"PUT /bkt/k HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\n"
    resp = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    # the server answers 100 Continue too: the proxy must not pass a second one on
    upstream = CannedServer([(len(req) + 3, b"HTTP/1.1 100 Continue\r\n\r\n" + resp)])
    try:
        with FaultyS3Proxy(upstream.url, rate=0.0) as proxy, \
                socket.create_connection(("127.0.0.1", int(proxy.url.rsplit(":", 1)[1])), timeout=30) as c:
            c.sendall(req)
            assert recv_exactly(c, 25) == b"HTTP/1.1 100 Continue\r\n\r\n"
            c.sendall(b"abc")
            assert recv_exactly(c, len(resp)) == resp
        assert upstream.received == [req + b"abc"]
    finally:
        upstream.close()


# --- against moto ------------------------------------------------------------------------------


def client_for(endpoint: str, attempts: int = 1):
    cfg = BotoConfig(s3={"addressing_style": "path"}, retries={"total_max_attempts": attempts, "mode": "standard"},
                     connect_timeout=5, read_timeout=10)
    return boto3.session.Session(region_name="us-east-1").client("s3", endpoint_url=endpoint, config=cfg)


@pytest.fixture
def bucket(moto_endpoint: str) -> Iterator[str]:
    name = f"proxy-{uuid.uuid4().hex[:20]}"
    client_for(moto_endpoint).create_bucket(Bucket=name)
    yield name


def test_s3_through_the_proxy_without_faults(moto_endpoint: str, bucket: str) -> None:
    with FaultyS3Proxy(moto_endpoint, rate=0.0) as proxy:
        s3 = client_for(proxy.url)
        big = bytes(range(256)) * (12 * 1024)  # 3 MiB
        s3.put_object(Bucket=bucket, Key="big", Body=big, Metadata={"role": "data"})
        assert s3.get_object(Bucket=bucket, Key="big")["Body"].read() == big
        assert s3.get_object(Bucket=bucket, Key="big", Range="bytes=5-9")["Body"].read() == big[5:10]
        assert s3.head_object(Bucket=bucket, Key="big")["Metadata"] == {"role": "data"}
        up = s3.create_multipart_upload(Bucket=bucket, Key="mp")["UploadId"]
        e1 = s3.upload_part(Bucket=bucket, Key="mp", UploadId=up, PartNumber=1, Body=b"a" * 2048)["ETag"]
        e2 = s3.upload_part(Bucket=bucket, Key="mp", UploadId=up, PartNumber=2, Body=b"b")["ETag"]
        s3.complete_multipart_upload(Bucket=bucket, Key="mp", UploadId=up, MultipartUpload={
            "Parts": [{"PartNumber": 1, "ETag": e1}, {"PartNumber": 2, "ETag": e2}]})
        assert s3.get_object(Bucket=bucket, Key="mp")["Body"].read() == b"a" * 2048 + b"b"
        assert [o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]] == ["big", "mp"]
        s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": "big"}, {"Key": "mp"}]})
        assert "Contents" not in s3.list_objects_v2(Bucket=bucket)
        stats = proxy.stats()
        assert stats["faults"] == {} and stats["requests"] == stats["forwarded"] >= 12


@pytest.mark.parametrize("kind", [RESET, INTERNAL_ERROR, SLOW_DOWN])
def test_failing_faults_never_reach_the_server(moto_endpoint: str, bucket: str, kind: str) -> None:
    direct = client_for(moto_endpoint)
    with FaultyS3Proxy(moto_endpoint, rate=1.0, kinds=[kind]) as proxy:
        s3 = client_for(proxy.url, attempts=1)
        if kind == RESET:
            with pytest.raises(ConnectionClosedError):
                s3.put_object(Bucket=bucket, Key="k", Body=b"x" * 1000)
        else:
            with pytest.raises(ClientError) as e:
                s3.put_object(Bucket=bucket, Key="k", Body=b"x" * 1000)
            err = e.value.response
            code, status = {INTERNAL_ERROR: ("InternalError", 500), SLOW_DOWN: ("SlowDown", 503)}[kind]
            assert (err["Error"]["Code"], err["ResponseMetadata"]["HTTPStatusCode"]) == (code, status)
            with pytest.raises(ClientError) as e:  # a HEAD answer has no body: the status says it all
                s3.head_object(Bucket=bucket, Key="k")
            assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == status
        assert proxy.forwarded == 0 and proxy.faults[kind] == proxy.requests >= 1
    assert "Contents" not in direct.list_objects_v2(Bucket=bucket)  # the PUT never landed


def test_a_delay_is_forwarded(moto_endpoint: str, bucket: str) -> None:
    with FaultyS3Proxy(moto_endpoint, rate=1.0, kinds=[DELAY], delay_range=(0.01, 0.02)) as proxy:
        s3 = client_for(proxy.url)
        s3.put_object(Bucket=bucket, Key="k", Body=b"late")
        assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == b"late"
        assert proxy.faults[DELAY] == proxy.forwarded == proxy.requests == 2


def test_retries_ride_through_faults_and_decisions_are_seeded(moto_endpoint: str, bucket: str) -> None:
    sequences = []
    for _ in range(2):
        with FaultyS3Proxy(moto_endpoint, seed=42, rate=0.3, delay_range=(0.0, 0.01),
                           kinds=REQUEST_FAULT_KINDS) as proxy:  # botocore alone: faults before the body
            s3 = client_for(proxy.url, attempts=10)
            for i in range(20):
                s3.put_object(Bucket=bucket, Key=f"k{i}", Body=b"%d" % i)
            for i in range(20):
                assert s3.get_object(Bucket=bucket, Key=f"k{i}")["Body"].read() == b"%d" % i
            sequences.append([fault for _m, _t, fault in proxy.events])
            assert set(proxy.faults) == set(REQUEST_FAULT_KINDS)
    assert sequences[0] == sequences[1]  # same seed, same requests: the same faults


def test_an_injected_fault_hits_exactly_the_matching_request(moto_endpoint: str, bucket: str) -> None:
    with FaultyS3Proxy(moto_endpoint, rate=0.0) as proxy:
        s3 = client_for(proxy.url, attempts=1)
        proxy.inject(lambda method, target: method == "PUT" and target.split("?")[0].endswith("/k2"))
        s3.put_object(Bucket=bucket, Key="k1", Body=b"1")
        with pytest.raises(ClientError) as e:
            s3.put_object(Bucket=bucket, Key="k2", Body=b"2")
        assert e.value.response["Error"]["Code"] == "InternalError"
        s3.put_object(Bucket=bucket, Key="k2", Body=b"2")  # once only
        assert [f for _m, _t, f in proxy.events] == ["", INTERNAL_ERROR, ""]
        assert proxy.forwarded == 2
