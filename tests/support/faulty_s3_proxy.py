"""A fault-injecting HTTP/1.1 proxy for S3 tests, on 127.0.0.1 in front of a real S3 server (moto).

For a seeded random share of requests (``rate``, default 10%) it injects one fault among ``kinds``,
drawn from a shuffled bag holding each kind once (refilled when empty), so that every kind shows up
even in a short run:

- ``delay``: wait a few hundred milliseconds, then forward;
- ``reset``: read the request, then close the connection with a TCP reset, answering nothing;
- ``internal-error``: answer HTTP 500 with an S3 ``InternalError`` XML body;
- ``slow-down``: answer HTTP 503 with an S3 ``SlowDown`` XML body (throttling);
- ``truncate`` (GET only): forward, then send the server's head (its Content-Length intact) and only
  half of the body, and close the connection: a response cut off mid-body;
- ``reset-body`` (GET only): the same, but end with a TCP reset after the partial body;
- ``drop-length`` (HEAD only): forward, and drop the answer's Content-Length header (a misbehaving
  proxy or gateway).

A drawn kind that does not apply to the request's method goes back into the bag for a later request.

Reset and error faults happen *before* forwarding: the request never reaches the server, so a retried
non-idempotent call (CreateMultipartUpload, CompleteMultipartUpload, a conditional PUT) is applied at
most once. Everything else is forwarded byte for byte: request line, headers (order and case kept),
bodies framed by Content-Length or chunked transfer encoding (chunk framing and trailers kept), and the
server's status line, headers and body. Each request goes to the server on a fresh connection; the
client's connection is kept alive as HTTP/1.1 allows. Bodies are held in memory (test-sized objects).

``blackhole = True`` turns the proxy into a dead store: from then on it reads each request and never
answers (the connection stays open until the proxy stops), as an endpoint whose server hangs; connections
are still accepted. (A store that refuses connections: stop the proxy, its port is then closed.)

Besides the random faults, :meth:`inject` targets one request: the first one (from now on) that a
predicate over (method, target) accepts gets the given fault, whatever the rate (for tests that need
one exact call to fail, e.g. the second UploadPart of an upload or a CompleteMultipartUpload).

``requests`` counts every request read, ``faults`` every fault injected by kind, ``forwarded`` the
requests that reached the server; ``events`` lists (method, target, fault or "") in arrival order.
"""

from __future__ import annotations

import contextlib
import random
import socket
import socketserver
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import BinaryIO
from urllib.parse import parse_qs, urlsplit

DELAY = "delay"
RESET = "reset"
INTERNAL_ERROR = "internal-error"
SLOW_DOWN = "slow-down"
TRUNCATE = "truncate"
RESET_BODY = "reset-body"
DROP_LENGTH = "drop-length"
REQUEST_FAULT_KINDS = (DELAY, RESET, INTERNAL_ERROR, SLOW_DOWN)  # botocore itself retries these
RESPONSE_FAULT_KINDS = (TRUNCATE, RESET_BODY, DROP_LENGTH)  # after the server answered: the store retries
FAULT_KINDS = REQUEST_FAULT_KINDS + RESPONSE_FAULT_KINDS
_ONLY_FOR = {TRUNCATE: "GET", RESET_BODY: "GET", DROP_LENGTH: "HEAD"}  # the method a kind applies to

MAX_HEAD = 64 * 1024  # bytes of request line + headers (or status line + headers)
_ERRORS = {
    INTERNAL_ERROR: (500, "Internal Server Error", "InternalError",
                     "We encountered an internal error. Please try again."),
    SLOW_DOWN: (503, "Slow Down", "SlowDown", "Please reduce your request rate."),
}


class ProtocolError(Exception):
    """The peer sent something this proxy cannot frame: the connection is dropped."""


@dataclass
class _Head:
    raw: bytes  # start line + headers + the empty line, exactly as received
    start: list[bytes]  # start line split in three (method, target, version / version, status, reason)
    headers: list[tuple[bytes, bytes]]  # (lower-cased name, value)

    def get(self, name: bytes) -> bytes | None:
        for k, v in self.headers:
            if k == name:
                return v
        return None

    def tokens(self, name: bytes) -> set[bytes]:
        """Comma-separated tokens of every header `name`, lower-cased."""
        out: set[bytes] = set()
        for k, v in self.headers:
            if k == name:
                out.update(t.strip().lower() for t in v.split(b","))
        return out


def _read_head(f: BinaryIO) -> _Head | None:
    """One message head; None on a clean EOF before its first byte."""
    raw = bytearray()
    lines: list[bytes] = []
    while True:
        line = f.readline(MAX_HEAD + 1)
        if not line:
            if not raw:
                return None
            raise ProtocolError("connection closed inside a message head")
        raw += line
        if len(raw) > MAX_HEAD or not line.endswith(b"\n"):
            raise ProtocolError("message head too long")
        if line in (b"\r\n", b"\n"):
            if not lines:  # tolerated empty line(s) before a request line (RFC 9112 2.2)
                raw.clear()
                continue
            break
        lines.append(line.rstrip(b"\r\n"))
    start = lines[0].split(b" ", 2)
    if len(start) < 2:
        raise ProtocolError(f"bad start line {lines[0][:80]!r}")
    headers = []
    for h in lines[1:]:
        name, sep, value = h.partition(b":")
        if not sep or not name or name != name.strip():
            raise ProtocolError(f"bad header line {h[:80]!r}")
        headers.append((name.lower(), value.strip()))
    return _Head(bytes(raw), start + [b""] * (3 - len(start)), headers)


def _read_exact(f: BinaryIO, n: int) -> bytes:
    data = f.read(n)
    if len(data) != n:
        raise ProtocolError(f"connection closed after {len(data)} of {n} body bytes")
    return data


def _read_chunked(f: BinaryIO) -> bytes:
    """A chunked body with its framing (sizes, extensions, trailers) exactly as received."""
    raw = bytearray()
    while True:
        line = f.readline(MAX_HEAD + 1)
        if not line.endswith(b"\n"):
            raise ProtocolError("bad chunk size line")
        raw += line
        try:
            size = int(line.split(b";", 1)[0].strip(), 16)
        except ValueError:
            raise ProtocolError(f"bad chunk size {line[:40]!r}") from None
        if size == 0:
            while True:  # trailer fields, then the empty line
                t = f.readline(MAX_HEAD + 1)
                if not t.endswith(b"\n"):
                    raise ProtocolError("connection closed inside the chunked trailer")
                raw += t
                if t in (b"\r\n", b"\n"):
                    return bytes(raw)
        raw += _read_exact(f, size)
        crlf = f.readline(3)
        if crlf not in (b"\r\n", b"\n"):
            raise ProtocolError("chunk data not followed by CRLF")
        raw += crlf


def _read_body(f: BinaryIO, head: _Head) -> bytes:
    """The body that follows `head`, framing included (chunked, else Content-Length, else none)."""
    if b"chunked" in head.tokens(b"transfer-encoding"):
        return _read_chunked(f)
    length = head.get(b"content-length")
    if length is None:
        return b""
    try:
        n = int(length)
    except ValueError:
        raise ProtocolError(f"bad Content-Length {length!r}") from None
    return _read_exact(f, n)


class FaultyS3Proxy:
    """See the module docstring. Use as a context manager, or start() / stop()."""

    def __init__(
        self,
        upstream: str,
        *,
        seed: int = 0,
        rate: float = 0.1,
        kinds: Iterable[str] = FAULT_KINDS,
        delay_range: tuple[float, float] = (0.2, 0.5),
        upstream_timeout: float = 60.0,
    ) -> None:
        u = urlsplit(upstream)
        if u.scheme != "http" or not u.hostname or not u.port:
            raise ValueError(f"upstream must be http://host:port, got {upstream!r}")
        self.kinds = tuple(kinds)
        unknown = set(self.kinds) - set(FAULT_KINDS)
        if unknown or not self.kinds:
            raise ValueError(f"fault kinds must be among {FAULT_KINDS}, got {self.kinds}")
        self.upstream = (u.hostname, u.port)
        self.rate = rate
        self.delay_range = delay_range
        self.upstream_timeout = upstream_timeout
        self._rng = random.Random(seed)
        self._bag: list[str] = []
        self._lock = threading.Lock()
        self.requests = 0
        self.forwarded = 0
        self.faults: Counter[str] = Counter()
        self.events: list[tuple[str, str, str]] = []
        self._targeted: list[tuple[Callable[[str, str], bool], str]] = []
        self.blackhole = False  # read requests, never answer (see the module docstring)
        self.blackholed = 0  # requests left unanswered
        self._stopping = threading.Event()
        self._clients: set[socket.socket] = set()
        self._server: socketserver.ThreadingTCPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("proxy not started")
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> FaultyS3Proxy:
        proxy = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                proxy._serve(self.request)

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True
            block_on_close = False

        self._stopping.clear()
        self._server = Server(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="faulty-s3-proxy", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is None:
            return
        self._stopping.set()  # releases blackholed connections
        self._server.shutdown()
        self._server.server_close()
        with self._lock:
            clients = list(self._clients)
        for c in clients:  # unblock handler threads waiting on idle keep-alive connections
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._server = None

    def __enter__(self) -> FaultyS3Proxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- observation

    def stats(self) -> dict[str, object]:
        with self._lock:
            return {"requests": self.requests, "forwarded": self.forwarded, "faults": dict(self.faults)}

    def inject(self, match: Callable[[str, str], bool], fault: str = INTERNAL_ERROR) -> None:
        """Give ``fault`` to the first request from now on for which ``match(method, target)`` is true
        (once; the random faults' draws are not consumed by it)."""
        if fault not in FAULT_KINDS:
            raise ValueError(f"fault must be one of {FAULT_KINDS}, got {fault!r}")
        with self._lock:
            self._targeted.append((match, fault))

    def _decide(self, method: str, target: str) -> tuple[str, float]:
        with self._lock:
            self.requests += 1
            fault, delay = "", 0.0
            hit = next((i for i, (match, _f) in enumerate(self._targeted) if match(method, target)), None)
            if hit is not None:
                fault = self._targeted.pop(hit)[1]
                self.faults[fault] += 1
                if fault == DELAY:
                    delay = self._rng.uniform(*self.delay_range)
            elif self.rate > 0 and self._rng.random() < self.rate:
                if not self._bag:
                    self._bag = list(self.kinds)
                    self._rng.shuffle(self._bag)
                fits = [i for i, k in enumerate(self._bag) if _ONLY_FOR.get(k, method) == method]
                if not fits:
                    self.events.append((method, target, ""))
                    return "", 0.0
                fault = self._bag.pop(fits[-1])
                self.faults[fault] += 1
                if fault == DELAY:
                    delay = self._rng.uniform(*self.delay_range)
            self.events.append((method, target, fault))
            return fault, delay

    # -- one client connection

    def _serve(self, client: socket.socket) -> None:
        with self._lock:
            self._clients.add(client)
        rfile = client.makefile("rb")
        try:
            while self._one_exchange(client, rfile):
                pass
        except (OSError, ProtocolError):
            pass  # the client went away or spoke something unframeable: drop the connection
        finally:
            rfile.close()
            with self._lock:
                self._clients.discard(client)

    def _one_exchange(self, client: socket.socket, rfile: BinaryIO) -> bool:
        """Reads one request and answers it; False when the client connection is done."""
        head = _read_head(rfile)
        if head is None:
            return False
        method, target, version = (p.decode("latin-1") for p in head.start)
        if b"100-continue" in head.tokens(b"expect"):
            client.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
        body = _read_body(rfile, head)
        if self.blackhole:
            with self._lock:
                self.blackholed += 1
            self._stopping.wait()  # never answered: the client times out
            return False
        fault, delay = self._decide(method, target)
        if fault == RESET:
            # RST instead of FIN: what a crashed server or a dropped load-balancer connection looks like
            client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            client.close()
            return False
        keep_alive = self._keep_alive(head, version)
        if fault in _ERRORS:
            client.sendall(self._error_response(fault, method, keep_alive))
            return keep_alive
        if fault == DELAY:
            time.sleep(delay)
        status_head, resp_body, until_close = self._forward(head, body, method)
        if fault == DROP_LENGTH:
            status_head = _without_header(status_head, b"content-length")
        if fault in (TRUNCATE, RESET_BODY) and len(resp_body) > 1:
            client.sendall(status_head.raw + resp_body[: len(resp_body) // 2])
            if fault == RESET_BODY:
                client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            client.close()
            return False
        client.sendall(status_head.raw + resp_body)
        return keep_alive and not until_close and b"close" not in status_head.tokens(b"connection")

    @staticmethod
    def _keep_alive(head: _Head, version: str) -> bool:
        conn = head.tokens(b"connection")
        if version == "HTTP/1.0":
            return b"keep-alive" in conn
        return b"close" not in conn

    def _error_response(self, fault: str, method: str, keep_alive: bool) -> bytes:
        status, reason, code, message = _ERRORS[fault]
        with self._lock:
            request_id = f"FAULTY{self.requests:010d}"
        body = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code><Message>{message}'
                f"</Message><RequestId>{request_id}</RequestId></Error>").encode()
        head = (f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/xml\r\n"
                f"Content-Length: {len(body)}\r\nx-amz-request-id: {request_id}\r\n"
                + ("" if keep_alive else "Connection: close\r\n") + "\r\n").encode()
        return head if method == "HEAD" else head + body  # a HEAD answer announces its body, sends none

    def _forward(self, head: _Head, body: bytes, method: str) -> tuple[_Head, bytes, bool]:
        """Sends the request to the server on a fresh connection; (final response head, body as framed,
        whether the body was framed by the server closing the connection)."""
        with socket.create_connection(self.upstream, timeout=self.upstream_timeout) as up:
            up.sendall(head.raw + body)
            with self._lock:
                self.forwarded += 1
            f = up.makefile("rb")
            try:
                while True:
                    resp = _read_head(f)
                    if resp is None:
                        raise ProtocolError("server closed the connection without answering")
                    status = int(resp.start[1]) if resp.start[1].isdigit() else 0
                    if 100 <= status < 200 and status != 101:
                        continue  # interim (100 Continue): the client got its own from this proxy
                    break
                if method == "HEAD" or status in (101, 204, 304):
                    return resp, b"", False
                if b"chunked" in resp.tokens(b"transfer-encoding") or resp.get(b"content-length") is not None:
                    return resp, _read_body(f, resp), False
                return resp, f.read(), True  # no framing: the body ends when the server closes
            finally:
                f.close()


def _without_header(head: _Head, name: bytes) -> _Head:
    """``head`` with every ``name`` header line removed (raw bytes rebuilt, order and case kept)."""
    lines = head.raw.split(b"\r\n")
    kept = [ln for ln in lines[1:] if ln.partition(b":")[0].strip().lower() != name]
    raw = b"\r\n".join([lines[0], *kept])
    return _Head(raw, head.start, [(k, v) for k, v in head.headers if k != name])


def s3_request(method: str, target: str) -> tuple[str, str, int]:
    """(operation, key path, part number) of an S3 request as the proxy sees it."""
    path, _, query = target.partition("?")
    q = parse_qs(query, keep_blank_values=True)
    if method == "PUT" and "uploadId" in q and "partNumber" in q:
        return "upload_part", path, int(q["partNumber"][0])
    if method == "POST" and "uploadId" in q:
        return "complete_multipart", path, 0
    if method == "PUT" and "uploadId" not in q and "uploads" not in q:
        return "put", path, 0
    return method, path, 0


def segment_write_request(op: str, uuid: str):
    """The proxy predicate for one request writing segment ``uuid``: ``upload_part`` (its part 2),
    ``complete_multipart``, or (anything else) the PUT of its index."""
    def match(method: str, target: str) -> bool:
        call, path, part = s3_request(method, target)
        if op == "upload_part":
            return call == op and path.endswith(f"/{uuid}") and part == 2
        if op == "complete_multipart":
            return call == op and path.endswith(f"/{uuid}")
        return call == "put" and path.endswith(f"/{uuid}-index")

    return match
