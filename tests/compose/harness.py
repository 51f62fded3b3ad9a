"""Docker for tests/compose: a private dockerd, a cached Debian base image, docker-compose on a copy of
the project.

- :class:`Daemon`: ``dockerd`` with its own data root, exec root, unix socket and pid file (never the
  system's daemon), no bridge and no iptables rules (containers use host networking); stopped by its pid
  and its directory removed afterwards.
- :func:`base_image`: Debian bookworm from ``debootstrap`` (the host's Debian mirror) with the packages
  every test image needs (:data:`BASE_PACKAGES`), made once and kept as a root-filesystem tar in the
  cache directory (``TIERED_COMPOSE_CACHE``, default ``~/.cache/tiered-compose``), keyed by the package
  list, the suite and the host's extra CA certificates (a TLS-intercepting proxy's, so pip and apt work
  inside); later runs only ``docker import`` it.
- :class:`Compose`: ``docker-compose`` (Debian's 1.29.2) on the project's file plus the test override,
  in a temporary copy of the project (the containers write ./logs and ./config there, not in the clone).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
SUITE = "bookworm"
# what the images built on the base need (docker/*.Dockerfile: a JVM, Python 3.11 with venv, curl, procps)
# and the services the override runs from Debian packages instead of their official images
BASE_PACKAGES = ("ca-certificates", "curl", "procps", "python3", "python3-venv", "openjdk-17-jre-headless",
                 "postgresql-15", "redis-server", "zookeeper")
BASE_RECIPE = 1  # bump when base_image() builds a different root from the same package list
DOCKER = shutil.which("docker", path="/usr/bin") or "docker"  # Debian's client: the daemon's version
# what the project's images and compose need from the checkout (the build context and the mounts)
PROJECT_FILES = ("docker-compose.yaml", ".dockerignore", "pyproject.toml", "constraints.txt", "README.md",
                 "docker", "dags", "plugins", "spark_jobs", "tieredcore", "scripts/build_pyfiles.sh")


class DockerError(AssertionError):
    """A docker / docker-compose step failed: the command and its output's end."""


def run(cmd: Sequence[str], env: dict[str, str] | None = None, timeout: float = 600, cwd: Path | None = None,
        check: bool = True, input: str | None = None) -> subprocess.CompletedProcess:
    r = subprocess.run(list(cmd), env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout, input=input)
    if check and r.returncode != 0:
        raise DockerError(f"{' '.join(cmd)}: exit {r.returncode}\n{r.stdout[-4000:]}\n{r.stderr[-6000:]}")
    return r


def cache_dir() -> Path:
    d = Path(os.environ.get("TIERED_COMPOSE_CACHE") or Path.home() / ".cache" / "tiered-compose")
    d.mkdir(parents=True, exist_ok=True)
    return d


def debian_mirror() -> str:
    """TIERED_DEBIAN_MIRROR, else the host's configured Debian mirror (apt sources), else deb.debian.org."""
    if os.environ.get("TIERED_DEBIAN_MIRROR"):
        return os.environ["TIERED_DEBIAN_MIRROR"]
    texts = []
    for p in [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]:
        try:
            texts.append(p.read_text())
        except OSError:
            continue
    for text in texts:
        # deb822 (URIs: + Suites: bookworm) or one-line (deb URI bookworm main)
        for stanza in re.split(r"\n\s*\n", text):
            uris = re.search(r"^URIs:\s*(\S+)", stanza, re.M)
            suites = re.search(r"^Suites:\s*(.+)$", stanza, re.M)
            if uris and suites and SUITE in suites.group(1).split() and "security" not in uris.group(1):
                return uris.group(1).rstrip("/")
        m = re.search(rf"^deb\s+(?:\[[^]]*\]\s+)?(\S+)\s+{SUITE}\s", text, re.M)
        if m and "security" not in m.group(1):
            return m.group(1).rstrip("/")
    return "http://deb.debian.org/debian"


def extra_ca_certs() -> list[Path]:
    return sorted(Path("/usr/local/share/ca-certificates").glob("*.crt"))


def base_key() -> str:
    h = hashlib.sha256(json.dumps([BASE_RECIPE, SUITE, sorted(BASE_PACKAGES)]).encode())
    for c in extra_ca_certs():
        h.update(c.read_bytes())
    return h.hexdigest()[:12]


# -- the daemon ---------------------------------------------------------------------------------------------


@dataclass
class Daemon:
    root: Path
    proc: subprocess.Popen | None = None
    env: dict[str, str] = field(default_factory=dict)

    @property
    def socket(self) -> Path:
        return self.root / "docker.sock"

    def start(self, deadline_s: float = 60) -> None:
        (self.root / "data").mkdir(parents=True)
        log = open(self.root / "dockerd.log", "w")  # noqa: SIM115 (the daemon's lifetime)
        self.proc = subprocess.Popen(
            ["dockerd", "--data-root", str(self.root / "data"), "--exec-root", str(self.root / "exec"),
             "--host", f"unix://{self.socket}", "--pidfile", str(self.root / "docker.pid"),
             "--bridge", "none", "--iptables=false", "--ip-masq=false", "--storage-driver", "overlay2"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("DOCKER_", "COMPOSE_"))}
        self.env.update(DOCKER_HOST=f"unix://{self.socket}", COMPOSE_DOCKER_CLI_BUILD="0",
                        DOCKER_BUILDKIT="0", COMPOSE_HTTP_TIMEOUT="300")
        deadline = time.monotonic() + deadline_s
        while True:
            if self.proc.poll() is not None:
                raise DockerError(f"dockerd exited {self.proc.returncode}:\n{self.log_tail()}")
            r = run([DOCKER, "version", "--format", "{{.Server.Version}}"], env=self.env, timeout=30, check=False)
            if r.returncode == 0:
                return
            if time.monotonic() > deadline:
                raise DockerError(f"dockerd not answering within {deadline_s}s:\n{self.log_tail()}")
            time.sleep(0.3)

    def log_tail(self, n: int = 4000) -> str:
        try:
            return (self.root / "dockerd.log").read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def docker(self, *args: str, timeout: float = 600, check: bool = True,
               input: str | None = None) -> subprocess.CompletedProcess:
        return run([DOCKER, *args], env=self.env, timeout=timeout, check=check, input=input)

    def stop(self) -> None:
        """SIGTERM by its pid (then SIGKILL), unmount what it left under its root, remove the root."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
        for mnt in reversed(mounts_under(self.root)):
            subprocess.run(["umount", "-l", mnt], capture_output=True)
        shutil.rmtree(self.root, ignore_errors=True)


def mounts_under(root: Path) -> list[str]:
    out = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        target = line.split()[1].replace("\\040", " ")
        if target == str(root) or target.startswith(f"{root}/"):
            out.append(target)
    return out


@contextmanager
def daemon() -> Iterator[Daemon]:
    d = Daemon(Path(tempfile.mkdtemp(prefix="tiered-dockerd-")))  # short: a unix socket path has ~100 bytes
    try:
        d.start()
        yield d
    finally:
        d.stop()


# -- the base image ------------------------------------------------------------------------------------------


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def base_rootfs() -> tuple[Path, bool]:
    """The cached root-filesystem tar of the base (built when missing); whether this call built it."""
    key = base_key()
    cache = cache_dir()
    tar = cache / f"base-{SUITE}-{key}.tar"
    with _locked(cache / f"base-{key}.lock"):
        if tar.is_file():
            return tar, False
        work = Path(tempfile.mkdtemp(prefix="build-", dir=cache))
        try:
            root = work / "root"
            run(["debootstrap", "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}", SUITE, str(root),
                 debian_mirror()], timeout=1800)
            for c in extra_ca_certs():
                shutil.copy(c, root / "usr/local/share/ca-certificates" / c.name)
            run(["chroot", str(root), "update-ca-certificates"], timeout=300)
            run(["chroot", str(root), "apt-get", "clean"], timeout=300)
            shutil.rmtree(root / "var/lib/apt/lists", ignore_errors=True)
            (root / "var/lib/apt/lists/partial").mkdir(parents=True)
            partial = work / "base.tar"
            run(["tar", "-C", str(root), "--numeric-owner", "-cf", str(partial), "."], timeout=1800)
            partial.rename(tar)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return tar, True


def base_image(d: Daemon) -> tuple[str, bool]:
    """The base image in the daemon, imported from the cached tar; (name, whether the tar was built)."""
    tar, built = base_rootfs()
    name = f"tiered-test-base:{base_key()}"
    bundle = "/etc/ssl/certs/ca-certificates.crt"  # pip and uv in the builds trust the system's store
    changes = [f"ENV {k}={bundle}" for k in ("SSL_CERT_FILE", "PIP_CERT", "REQUESTS_CA_BUNDLE")]
    changes.append("ENV LANG=C.UTF-8")
    args = ["import"]
    for c in changes:
        args += ["--change", c]
    d.docker(*args, str(tar), name, timeout=900)
    return name, built


# -- compose ------------------------------------------------------------------------------------------------


def copy_project(dest: Path) -> Path:
    """What the images and the compose file need, copied from the checkout (no caches, no venv)."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.so")
    for rel in PROJECT_FILES:
        src, dst = REPO / rel, dest / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dst, ignore=ignore)
        else:
            shutil.copy2(src, dst)
    shutil.copytree(HERE, dest / "tests" / "compose", ignore=ignore)
    return dest


@dataclass
class Compose:
    daemon: Daemon
    project_dir: Path
    name: str
    env: dict[str, str]

    def _cmd(self, files: Sequence[Path], *args: str) -> list[str]:
        cmd = ["docker-compose", "--project-name", self.name, "--project-directory", str(self.project_dir)]
        for f in files:
            cmd += ["-f", str(f)]
        return [*cmd, *args]

    def resolved(self) -> Path:
        """The users' file with the test override, merged and interpolated by docker-compose itself
        (``config``, which writes ``$$`` back escaped), minus the ``ports`` of host-networked
        services: published ports mean nothing there and docker-compose 1.29 refuses the combination
        ("host" network_mode is incompatible with port_bindings), while an override file can add list
        entries but not remove them."""
        out = self.project_dir / "docker-compose.resolved.yaml"
        if not out.is_file():
            files = [self.project_dir / "docker-compose.yaml",
                     self.project_dir / "tests" / "compose" / "docker-compose.test.yaml"]
            merged = run(self._cmd(files, "config"), env={**self.daemon.env, **self.env},
                         timeout=120, cwd=self.project_dir).stdout
            config = yaml.safe_load(merged)
            for svc in config["services"].values():
                if svc.get("network_mode") == "host":
                    svc.pop("ports", None)
            out.write_text(yaml.safe_dump(config, sort_keys=False))
        return out

    def __call__(self, *args: str, timeout: float = 900, check: bool = True) -> subprocess.CompletedProcess:
        return run(self._cmd([self.resolved()], *args), env={**self.daemon.env, **self.env}, timeout=timeout,
                   cwd=self.project_dir, check=check)

    def up(self, deadline: float) -> None:
        """``up -d``, watched: docker-compose 1.29 waits for the dependencies' conditions and keeps waiting
        when one can never hold (a dependency exited), so a container that exits non-zero or turns
        unhealthy meanwhile stops the wait with a DockerError naming it."""
        cmd = self._cmd([self.resolved()], "up", "-d")
        with tempfile.TemporaryFile("w+") as out:
            proc = subprocess.Popen(cmd, env={**self.daemon.env, **self.env}, cwd=self.project_dir, stdout=out,
                                    stderr=subprocess.STDOUT, text=True)
            try:
                while proc.poll() is None:
                    problems = self.problems()
                    if problems or time.monotonic() > deadline:
                        proc.terminate()
                        proc.wait(timeout=30)
                        out.seek(0)
                        raise DockerError(f"{' '.join(cmd)}: "
                                          + ("; ".join(problems) if problems else "not done at the deadline")
                                          + f"\n{out.read()[-4000:]}")
                    time.sleep(1)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
            out.seek(0)
            if proc.returncode != 0:  # e.g. a dependency's condition failed: name it, with its log
                raise DockerError(f"{' '.join(cmd)}: exit {proc.returncode}\n{out.read()[-6000:]}\n"
                                  + "\n".join(self.problems()))

    def problems(self) -> list[str]:
        """Containers that exited non-zero or are unhealthy (with their last health check output)."""
        problems = []
        for c in self.containers():
            st = c["State"]
            if not st["Running"] and st["Status"] in ("exited", "dead") and st["ExitCode"] != 0:
                svc = c["Config"]["Labels"].get("com.docker.compose.service")
                problems.append(f"{c['Name'].lstrip('/')} {st['Status']} (exit {st['ExitCode']}):\n"
                                + self.logs(svc)[-2500:])
            elif (st.get("Health") or {}).get("Status") == "unhealthy":
                log = (st.get("Health") or {}).get("Log") or [{}]
                problems.append(f"{c['Name'].lstrip('/')} unhealthy: {log[-1].get('Output', '')[-800:]}")
        return problems

    def containers(self, all_: bool = True) -> list[dict]:
        """docker inspect of the project's containers."""
        ids = self.daemon.docker("ps", "-q", *(["-a"] if all_ else []), "--filter",
                                 f"label=com.docker.compose.project={self.name}").stdout.split()
        if not ids:
            return []
        return json.loads(self.daemon.docker("inspect", *ids).stdout)

    def logs(self, service: str) -> str:
        return self("logs", "--no-color", service, check=False, timeout=120).stdout

    def wait_healthy(self, services: set[str], deadline: float) -> dict[str, str]:
        """Until every container of ``services`` is running and healthy; fails naming the unhealthy
        ones (with their last health check outputs) or one that exited."""
        while True:
            states: dict[str, str] = {}
            for c in self.containers():
                svc = c["Config"]["Labels"].get("com.docker.compose.service")
                if svc not in services:
                    continue
                st = c["State"]
                health = (st.get("Health") or {}).get("Status", "none")
                states[c["Name"].lstrip("/")] = health if st["Running"] else st["Status"]
            seen = {s for s in services if any(n.split("_")[-2] == s for n in states)}
            problems = self.problems()
            if problems:
                raise DockerError("services failed: " + "; ".join(problems))
            if seen == services and all(v == "healthy" for v in states.values()):
                return states
            if time.monotonic() > deadline:
                raise DockerError(f"not healthy at the deadline: {states} (missing: {services - seen})")
            time.sleep(1)

    def leftovers(self) -> dict[str, list[str]]:
        """Containers, networks and volumes of the project still in the daemon."""
        label = f"label=com.docker.compose.project={self.name}"
        return {
            "containers": self.daemon.docker("ps", "-aq", "--filter", label).stdout.split(),
            "networks": self.daemon.docker("network", "ls", "-q", "--filter", label).stdout.split(),
            "volumes": self.daemon.docker("volume", "ls", "-q", "--filter", label).stdout.split(),
        }
