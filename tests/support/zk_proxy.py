"""A TCP proxy in front of a real ZooKeeper server that loses a connection at a chosen moment.

Failure injection a server cannot produce on demand: a write whose outcome the client never learns.
ZooKeeper's wire protocol frames every message with a 4-byte big-endian length; after the connect
handshake a request starts ``xid:int32, type:int32`` and a reply ``xid:int32, zxid:int64, err:int32``.

``arm("after_reply")``: the next write request is forwarded, the server's reply is read and
swallowed (so the write **did** land), then the client's connection is closed.
``arm("before_send")``: the next write request is not forwarded; the connection is closed (the write
did **not** land).
``on_cut`` runs after the cut and before the client can reconnect (e.g. another writer steps in).
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from collections.abc import Callable

WRITE_OPS = {1: "create", 2: "delete", 5: "setData", 14: "multi", 15: "create2", 19: "createContainer",
             20: "createTTL"}


def _read_frame(sock: socket.socket) -> bytes | None:
    head = _read_exact(sock, 4)
    if head is None:
        return None
    (n,) = struct.unpack(">i", head)
    body = _read_exact(sock, n)
    return None if body is None else head + body


def _read_exact(sock: socket.socket, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        try:
            chunk = sock.recv(n - len(buf))
        except OSError:
            return None
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


class ZkCutProxy:
    def __init__(self, server_port: int) -> None:
        self.server_port = server_port
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.port = self.listener.getsockname()[1]
        self._lock = threading.Lock()
        self._mode: str | None = None
        self._op_filter: set[int] | None = None
        self.on_cut: Callable[[], None] | None = None
        self.cuts: list[tuple[str, str]] = []  # (mode, op name) per cut done
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def hosts(self) -> str:
        return f"127.0.0.1:{self.port}"

    def arm(self, mode: str, ops: set[str] | None = None, on_cut: Callable[[], None] | None = None) -> None:
        assert mode in ("after_reply", "before_send")
        with self._lock:
            self._mode = mode
            self._op_filter = None if ops is None else {k for k, v in WRITE_OPS.items() if v in ops}
            self.on_cut = on_cut

    def _take(self, op_type: int) -> str | None:
        with self._lock:
            if self._mode is None or op_type not in WRITE_OPS:
                return None
            if self._op_filter is not None and op_type not in self._op_filter:
                return None
            mode, self._mode = self._mode, None
            return mode

    def close(self) -> None:
        self._closed = True
        self.listener.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(("127.0.0.1", self.server_port))
            except OSError:
                client.close()
                continue
            _Conn(self, client, server).start()


class _Conn:
    def __init__(self, proxy: ZkCutProxy, client: socket.socket, server: socket.socket) -> None:
        self.proxy, self.client, self.server = proxy, client, server
        self.doomed_xid: int | None = None
        self.doomed_op = ""
        self.cut = threading.Event()

    def start(self) -> None:
        threading.Thread(target=self._up, daemon=True).start()
        threading.Thread(target=self._down, daemon=True).start()

    def _close(self) -> None:
        self.cut.set()
        for s in (self.client, self.server):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def _finish_cut(self, mode: str) -> None:
        self._close()
        self.proxy.cuts.append((mode, self.doomed_op))
        if self.proxy.on_cut is not None:
            self.proxy.on_cut()

    def _up(self) -> None:  # client -> server
        first = True
        while not self.cut.is_set():
            frame = _read_frame(self.client)
            if frame is None:
                break
            if not first and len(frame) >= 12:
                xid, op_type = struct.unpack_from(">ii", frame, 4)
                mode = self.proxy._take(op_type)
                if mode == "before_send":
                    self.doomed_op = WRITE_OPS[op_type]
                    self._finish_cut(mode)
                    return
                if mode == "after_reply":
                    self.doomed_xid, self.doomed_op = xid, WRITE_OPS[op_type]
            first = False
            try:
                self.server.sendall(frame)
            except OSError:
                break
        if not self.cut.is_set():
            self._close()

    def _down(self) -> None:  # server -> client
        first = True
        while not self.cut.is_set():
            frame = _read_frame(self.server)
            if frame is None:
                break
            if not first and self.doomed_xid is not None and len(frame) >= 8:
                (xid,) = struct.unpack_from(">i", frame, 4)
                if xid == self.doomed_xid:  # the write landed; the client will never know
                    self._finish_cut("after_reply")
                    return
            first = False
            try:
                self.client.sendall(frame)
            except OSError:
                break
        if not self.cut.is_set():
            self._close()
