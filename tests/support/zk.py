"""A real ZooKeeper server (Debian's zookeeper 3.8) on a free loopback port, for tests.

Started with ZooKeeperServerMain on a temporary data directory; ``restart()`` stops it and starts it
again on the same port and data (sessions and data survive, as across a real server restart);
``expire_session()`` expires a kazoo client's session the way ZooKeeper does when a second client
takes it over and closes it.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

# the jar's manifest names its own dependencies (jute, netty, slf4j-api); slf4j-simple sends the log to stderr
ZK_JARS = ("/usr/share/java/zookeeper.jar", "/usr/share/java/slf4j-simple.jar")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ruok(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(b"ruok")
            return s.recv(4) == b"imok"
    except OSError:
        return False


class ZooKeeperServer:
    def __init__(self, workdir: Path, port: int | None = None) -> None:
        missing = [j for j in ZK_JARS[:1] if not os.path.exists(j)]
        if missing:
            raise RuntimeError(
                f"ZooKeeper is not installed ({', '.join(missing)} missing): run ./scripts/setup.sh as root "
                "or `apt-get install zookeeper`"
            )
        self.workdir = Path(workdir)
        self.port = port or free_port()
        self.data = self.workdir / "data"
        self.data.mkdir(parents=True, exist_ok=True)
        self.cfg = self.workdir / "zoo.cfg"
        self.cfg.write_text(
            f"dataDir={self.data}\nclientPort={self.port}\nclientPortAddress=127.0.0.1\ntickTime=500\n"
            "minSessionTimeout=1000\nmaxSessionTimeout=60000\nadmin.enableServer=false\n"
            "4lw.commands.whitelist=*\nmaxClientCnxns=200\n"
        )
        self.log = self.workdir / "zookeeper.log"
        self.proc: subprocess.Popen | None = None

    @property
    def hosts(self) -> str:
        return f"127.0.0.1:{self.port}"

    def url(self, root: str = "/tiered-storage", **query: str) -> str:
        q = "&".join(f"{k}={v}" for k, v in query.items())
        return f"zk://{self.hosts}{root}" + (f"?{q}" if q else "")

    def start(self, timeout: float = 30.0) -> None:
        cp = ":".join(ZK_JARS)
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                ["java", "-Xmx256m", "-Dzookeeper.admin.enableServer=false", "-cp", cp,
                 "org.apache.zookeeper.server.ZooKeeperServerMain", str(self.cfg)],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while not _ruok(self.port):
            if self.proc.poll() is not None:
                raise RuntimeError(f"ZooKeeper exited with {self.proc.returncode}; log: {self.log.read_text()[-2000:]}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"ZooKeeper not ready on {self.hosts} within {timeout} s; log {self.log}")
            time.sleep(0.05)

    def stop(self) -> None:
        p, self.proc = self.proc, None
        if p is None or p.poll() is not None:
            return
        p.send_signal(signal.SIGKILL)  # a crash, as far as clients can tell; the txn log keeps the data
        p.wait(timeout=30)

    def restart(self) -> None:
        self.stop()
        self.start()

    def ensure_running(self) -> None:
        """Start it again if it is not answering (a test that restarts it may leave it down when it fails,
        and every later test on this session's server would fail for that one)."""
        if self.proc is None or self.proc.poll() is not None or not _ruok(self.port):
            self.restart()

    def __enter__(self) -> ZooKeeperServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def expire_session(server: ZooKeeperServer, zk) -> None:
    """Expire ``zk``'s session: a second client joins it with its id and password, then closes it."""
    from kazoo.client import KazooClient

    other = KazooClient(hosts=server.hosts, client_id=zk.client_id, timeout=zk._session_timeout / 1000)
    other.start(timeout=15)
    other.stop()
    other.close()
