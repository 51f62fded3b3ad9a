"""Real Azure Blob and GCS emulators on free loopback ports, for tests.

- :class:`Azurite`: Microsoft's Azurite blob service from npm (``azurite-blob``), in memory, telemetry
  off. Found through ``TIERED_AZURITE`` (the executable), the repository's ``.tools/azurite`` (installed
  by scripts/setup.sh), then PATH; absent -> RuntimeError saying how to install it.
- :class:`GcsEmulator`: the ``gcp-storage-emulator`` package (PyPI), in memory.

Both are subprocesses in their own process group; ``stop()`` ends exactly that group.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# Azurite's fixed development account (public, documented by Microsoft; not a secret)
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1):
            return True
    except urllib.error.HTTPError:
        return True  # any HTTP answer: the server is up
    except (urllib.error.URLError, OSError):
        return False


def find_azurite() -> str:
    """The azurite-blob executable (module docstring); RuntimeError with the reason when there is none."""
    configured = os.environ.get("TIERED_AZURITE")
    if configured:
        if not os.access(configured, os.X_OK):
            raise RuntimeError(f"TIERED_AZURITE={configured!r} is not an executable file")
        return configured
    candidates = [REPO / ".tools/azurite/node_modules/.bin/azurite-blob"]
    # a git worktree's own .tools may be empty: the main checkout's is the same install
    common = _git_common_dir()
    if common is not None:
        candidates.append(common.parent / ".tools/azurite/node_modules/.bin/azurite-blob")
    for c in candidates:
        if os.access(c, os.X_OK):
            return str(c)
    found = shutil.which("azurite-blob")
    if found:
        return found
    raise RuntimeError(
        "Azurite (azurite-blob) not found: run ./scripts/setup.sh (installs it into .tools/azurite), "
        "`npm install azurite@3.35.0`, or set TIERED_AZURITE to the azurite-blob executable"
    )


def _git_common_dir() -> Path | None:
    git = REPO / ".git"
    if git.is_file():  # a worktree: "gitdir: /main/.git/worktrees/NAME"
        text = git.read_text().strip()
        if text.startswith("gitdir:"):
            return Path(text.split(":", 1)[1].strip()).parents[1]
    return None


class _Server:
    name = "server"

    def __init__(self, workdir: Path) -> None:
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.log = self.workdir / f"{self.name}.log"
        self.port = 0
        self.proc: subprocess.Popen | None = None

    def _command(self) -> list[str]:
        raise NotImplementedError

    def _probe_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    def start(self, timeout: float = 30.0) -> None:
        for _attempt in range(3):  # the free port may be taken between probing and binding
            self.port = free_port()
            with open(self.log, "ab") as log:
                self.proc = subprocess.Popen(self._command(), stdout=log, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL, start_new_session=True,
                                             cwd=self.workdir)
            deadline = time.monotonic() + timeout
            while self.proc.poll() is None and time.monotonic() < deadline:
                if _answers(self._probe_url()):
                    return
                time.sleep(0.05)
            if self.proc.poll() is None:
                self.stop()
                raise RuntimeError(f"{self.name} did not answer on port {self.port} within {timeout} s; log {self.log}")
        raise RuntimeError(f"{self.name} failed to start; log {self.log}:\n{self.log.read_text()[-2000:]}")

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        except ProcessLookupError:
            pass


class Azurite(_Server):
    name = "azurite"

    def __init__(self, workdir: Path) -> None:
        super().__init__(workdir)
        self.exe = find_azurite()

    def _command(self) -> list[str]:
        return [self.exe, "--blobHost", "127.0.0.1", "--blobPort", str(self.port), "--inMemoryPersistence",
                "--extentMemoryLimit", "512", "--silent", "--skipApiVersionCheck", "--disableTelemetry"]

    @property
    def endpoint(self) -> str:
        """The blob endpoint of the development account (path-style, as Azurite serves it)."""
        return f"http://127.0.0.1:{self.port}/{AZURITE_ACCOUNT}"

    @property
    def connection_string(self) -> str:
        return (f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};"
                f"BlobEndpoint={self.endpoint};")

    def env(self) -> dict[str, str]:
        return {"AZURE_STORAGE_CONNECTION_STRING": self.connection_string}


class GcsEmulator(_Server):
    name = "gcs-emulator"

    def _command(self) -> list[str]:
        exe = Path(sys.executable).parent / "gcp-storage-emulator"
        if not exe.exists():
            raise RuntimeError(f"gcp-storage-emulator not found in {exe.parent}: run ./scripts/setup.sh")
        return [str(exe), "start", "--host", "127.0.0.1", "--port", str(self.port), "--in-memory", "--quiet"]

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        return {"STORAGE_EMULATOR_HOST": self.endpoint, "GOOGLE_CLOUD_PROJECT": "tiered-test"}
