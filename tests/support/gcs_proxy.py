"""A proxy in front of gcp-storage-emulator that answers what the emulator ignores the way GCS does (its
JSON API documentation: objects.insert with ``ifGenerationMatch``, objects.list with ``maxResults``,
``pageToken`` and ``startOffset``), so the GCS store's precondition and paging paths run against a server
that enforces them:

- an upload with ``ifGenerationMatch=0`` of a name that exists is answered ``412`` with GCS's
  ``conditionNotMet`` error body (the emulator would overwrite the object);
- a listing is cut to ``maxResults`` names from ``startOffset`` on, with a ``nextPageToken`` when more
  follow (the emulator returns everything in one page).

Everything else is forwarded byte for byte (tests/support/faulty_s3_proxy.py, no faults)."""

from __future__ import annotations

import base64
import http.client
import json
from typing import BinaryIO
from urllib.parse import parse_qs, quote, urlsplit

from tests.support.faulty_s3_proxy import FaultyS3Proxy, _Head, _read_body, _read_head

PRECONDITION_FAILED = {"error": {"code": 412, "message": "At least one of the pre-conditions you specified did not hold.",
                                 "errors": [{"message": "At least one of the pre-conditions you specified did not hold.",
                                             "domain": "global", "reason": "conditionNotMet",
                                             "locationType": "header", "location": "If-Match"}]}}


def _upload_name(query: dict[str, list[str]], body: bytes) -> str | None:
    """The object name of an objects.insert: the ``name`` parameter, or the JSON metadata part of a
    multipart upload."""
    if "name" in query:
        return query["name"][0]
    start = body.find(b"{")
    end = body.find(b"\r\n--", start)
    if start < 0:
        return None
    try:
        return json.loads(body[start:end if end > 0 else None]).get("name")
    except ValueError:
        return None


class GcsConformingProxy(FaultyS3Proxy):
    def __init__(self, upstream: str) -> None:
        super().__init__(upstream, rate=0.0)
        self.refused = 0  # uploads answered 412
        self.pages = 0  # listings cut to a page

    def _upstream(self, method: str, target: str) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection(*self.upstream, timeout=self.upstream_timeout)
        try:
            conn.request(method, target, headers={"Accept-Encoding": "identity"})
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

    def _answer(self, client, status: int, reason: str, doc: dict, keep_alive: bool) -> bool:
        body = json.dumps(doc).encode()
        client.sendall((f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json; charset=UTF-8\r\n"
                        f"Content-Length: {len(body)}\r\n" + ("" if keep_alive else "Connection: close\r\n")
                        + "\r\n").encode() + body)
        return keep_alive

    def _one_exchange(self, client, rfile: BinaryIO) -> bool:
        head = _read_head(rfile)
        if head is None:
            return False
        method, target, version = (p.decode("latin-1") for p in head.start)
        if b"100-continue" in head.tokens(b"expect"):
            client.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
        body = _read_body(rfile, head)
        keep_alive = self._keep_alive(head, version)
        with self._lock:
            self.requests += 1
            self.events.append((method, target, ""))
        u = urlsplit(target)
        q = parse_qs(u.query, keep_blank_values=True)
        parts = u.path.split("/")
        if method == "POST" and u.path.startswith("/upload/storage/v1/b/") and q.get("ifGenerationMatch") == ["0"]:
            name = _upload_name(q, body)
            if name is not None:
                status, _ = self._upstream("GET", f"/storage/v1/b/{parts[5]}/o/{quote(name, safe='')}")
                if status == 200:
                    with self._lock:
                        self.refused += 1
                    return self._answer(client, 412, "Precondition Failed", PRECONDITION_FAILED, keep_alive)
        if method == "GET" and len(parts) == 6 and parts[:4] == ["", "storage", "v1", "b"] and parts[5] == "o":
            return self._list(client, target, q, keep_alive)
        return self._forward_as_is(client, head, body, method, keep_alive)

    def _list(self, client, target: str, q: dict[str, list[str]], keep_alive: bool) -> bool:
        status, raw = self._upstream("GET", target)
        if status != 200:
            return self._answer(client, status, "Error", json.loads(raw or b"{}"), keep_alive)
        doc = json.loads(raw)
        items = sorted(doc.get("items", []), key=lambda o: o["name"])
        start = q.get("startOffset", [""])[0]
        if "pageToken" in q:  # this proxy's tokens: the last name of the previous page
            start = base64.urlsafe_b64decode(q["pageToken"][0]).decode()
            items = [o for o in items if o["name"] > start]
        else:
            items = [o for o in items if o["name"] >= start]
        limit = int(q.get("maxResults", ["1000"])[0])
        page, more = items[:limit], len(items) > limit
        doc["items"] = page
        doc.pop("nextPageToken", None)
        if more:
            doc["nextPageToken"] = base64.urlsafe_b64encode(page[-1]["name"].encode()).decode()
            with self._lock:
                self.pages += 1
        if not page:
            doc.pop("items")
        return self._answer(client, 200, "OK", doc, keep_alive)

    def _forward_as_is(self, client, head: _Head, body: bytes, method: str, keep_alive: bool) -> bool:
        status_head, resp_body, until_close = self._forward(head, body, method)
        client.sendall(status_head.raw + resp_body)
        return keep_alive and not until_close and b"close" not in status_head.tokens(b"connection")
