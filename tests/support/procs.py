"""Start real etcd and Redis servers (and later, Ferry services) on free ports.

Nothing here is a fake: each helper runs the real binary in a temporary
directory and waits until it answers on its port.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path


def _port_block() -> range:
    """This test process's ports: below the kernel's ephemeral range (where the source ports
    of outgoing connections come from, so a port found free there can be taken by a client's
    connection before the service binds it), one block per pytest-xdist worker."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    first, blocks = 10_000, 8
    size = max((low - first) // blocks, 0)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    index = int(worker) % blocks if worker.isdigit() else 0
    return range(first + index * size, first + (index + 1) * size)


_PORTS = _port_block()
# Start at a point of the block that depends on the process: two pytest runs outside
# xdist (helpers, a developer's second terminal) share block 0 but not its ports.
_next_port = [os.getpid() * 97 % max(len(_PORTS), 1)]


def free_port() -> int:
    """A TCP port that was free a moment ago on 127.0.0.1: taken in turn from this
    process's block (not handed out twice in a row), else any the kernel gives."""
    for _ in range(len(_PORTS)):
        port = _PORTS[_next_port[0] % len(_PORTS)]
        _next_port[0] += 1
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for_port(host: str, port: int, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listens on {host}:{port} after {timeout_s}s")


def wait_for_http(url: str, expect: bytes, timeout_s: float = 15.0) -> None:
    """Wait until GET url answers 200 with `expect` in its body."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=1) as resp:
                if resp.status == 200 and expect in resp.read():
                    return
        except (OSError, ValueError):
            pass
        time.sleep(0.05)
    raise TimeoutError(f"{url} did not answer with {expect!r} after {timeout_s}s")


def wait_until_ready(proc: Proc, url: str, timeout_s: float = 20.0) -> None:
    """Wait until GET `url` answers 200 while `proc` lives; else stop it and fail with its log."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not proc.alive():
            raise RuntimeError(f"{proc.name} exited:\n{proc.log()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=1) as resp:
                if resp.status == 200:
                    return
        except (OSError, ValueError):
            pass
        time.sleep(0.05)
    proc.stop()
    raise RuntimeError(f"{proc.name} not ready at {url} after {timeout_s}s:\n{proc.log()[-3000:]}")


@dataclass
class Proc:
    """A child process with its log file; `stop()` is idempotent."""

    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    extra: dict[str, object] = field(default_factory=dict)

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def kill9(self) -> None:
        if self.alive():
            self.popen.send_signal(signal.SIGKILL)
        self.popen.wait(timeout=10)

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.alive():
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout=5)


def spawn(name: str, argv: list[str], workdir: Path, env: dict[str, str] | None = None) -> Proc:
    workdir.mkdir(parents=True, exist_ok=True)
    log_path = workdir / f"{name}.log"
    log = open(log_path, "ab")  # noqa: SIM115 - owned by the child for its life
    full_env = dict(os.environ)
    if env:
        full_env.update(env)
    popen = subprocess.Popen(
        argv, stdout=log, stderr=subprocess.STDOUT, cwd=workdir, env=full_env,
        start_new_session=True,
    )
    log.close()
    return Proc(name, popen, log_path)


@dataclass
class Etcd:
    proc: Proc
    host: str
    port: int
    peer_port: int

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"


def start_namesrv(etcd_endpoint: str, prefix: str, workdir: Path,
                  extra_env: dict[str, str] | None = None,
                  timeout_s: float = 20.0) -> tuple[Proc, int]:
    """A namesrv process on a free port over `prefix` of etcd, once ready: (proc, port)."""
    port = free_port()
    env = {"FERRY_NAMESRV_HOST": "127.0.0.1", "FERRY_NAMESRV_PORT": str(port),
           "FERRY_NAMESRV_ETCD": etcd_endpoint, "FERRY_NAMESRV_ETCD_PREFIX": prefix,
           "FERRY_NAMESRV_AUTO_CREATE_TOPICS": "true", "FERRY_NAMESRV_DEFAULT_QUEUES": "4",
           **(extra_env or {})}
    proc = spawn("namesrv", [sys.executable, "-m", "ferry_namesrv"], workdir, env)
    wait_until_ready(proc, f"http://127.0.0.1:{port}/readyz", timeout_s)
    return proc, port


def start_etcd(workdir: Path) -> Etcd:
    binary = shutil.which("etcd")
    if binary is None:
        raise RuntimeError("etcd is not installed: run `make setup`")
    port, peer = free_port(), free_port()
    url = f"http://127.0.0.1:{port}"
    purl = f"http://127.0.0.1:{peer}"
    argv = [
        binary, "--name", "test", "--data-dir", str(workdir / "etcd-data"),
        "--listen-client-urls", url, "--advertise-client-urls", url,
        "--listen-peer-urls", purl, "--initial-advertise-peer-urls", purl,
        "--initial-cluster", f"test={purl}", "--log-level", "error",
    ]
    proc = spawn("etcd", argv, workdir, env={"ETCD_UNSUPPORTED_ARCH": os.uname().machine})
    # An open port is not a ready etcd: until it has elected itself leader and
    # published its member, requests hang, and a stop in that window can leave a
    # data dir that never becomes healthy again. /health answers true only after.
    _wait_ready(proc, lambda: wait_for_http(f"{url}/health", b'"health":"true"'))
    return Etcd(proc, "127.0.0.1", port, peer)


@dataclass
class Redis:
    proc: Proc
    host: str
    port: int

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"


def start_redis(workdir: Path, *extra_args: str) -> Redis:
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("redis-server is not installed: run `make setup`")
    port = free_port()
    argv = [
        binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(workdir),
        "--save", "", "--appendonly", "no", "--protected-mode", "yes", *extra_args,
    ]
    proc = spawn("redis", argv, workdir)
    _wait_ready(proc, lambda: wait_for_port("127.0.0.1", port))
    return Redis(proc, "127.0.0.1", port)


def _wait_ready(proc: Proc, probe: Callable[[], None]) -> None:
    try:
        probe()
    except TimeoutError:
        proc.stop()
        raise RuntimeError(f"{proc.name} did not start:\n{proc.log()[-2000:]}") from None


@dataclass
class Postgres:
    """A throwaway PostgreSQL cluster; `dsn` logs in as the `postgres` superuser (trust auth)."""

    proc: Proc
    host: str
    port: int

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@{self.host}:{self.port}/postgres"

    @property
    def sqlalchemy_url(self) -> str:
        return f"postgresql+psycopg://postgres@{self.host}:{self.port}/postgres"


def postgres_bindir() -> Path:
    """The newest PostgreSQL server's bin dir (Debian puts it under /usr/lib/postgresql)."""
    candidates = sorted(Path("/usr/lib/postgresql").glob("*/bin/postgres"),
                        key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit() else 0)
    if not candidates:
        raise RuntimeError("the PostgreSQL server is not installed: run `make setup`")
    return candidates[-1].parent


def _as_postgres_user(argv: list[str]) -> list[str]:
    # The server refuses to run as root; as another user it runs as itself.
    if os.getuid() == 0:
        return ["runuser", "-u", "postgres", "--", *argv]
    return argv


def start_postgres(workdir: Path) -> Postgres:
    """initdb a cluster in `workdir` and run it on a free port (socket dir inside it too)."""
    bindir = postgres_bindir()
    workdir.mkdir(parents=True, exist_ok=True)
    data = workdir / "pgdata"
    if os.getuid() == 0:
        # The temp dir's parents belong to root: let the postgres user reach its own dir.
        shutil.chown(workdir, user="postgres", group="postgres")
        for parent in workdir.parents:
            if parent == Path("/"):
                break
            parent.chmod(parent.stat().st_mode | 0o011)
    init = subprocess.run(
        _as_postgres_user([str(bindir / "initdb"), "-D", str(data), "-U", "postgres",
                           "-A", "trust", "-E", "UTF8", "--no-sync"]),
        capture_output=True, cwd=workdir, check=False)
    if init.returncode != 0:
        raise RuntimeError(f"initdb failed:\n{init.stdout.decode()}{init.stderr.decode()}")
    port = free_port()
    argv = _as_postgres_user([
        str(bindir / "postgres"), "-D", str(data), "-p", str(port), "-h", "127.0.0.1",
        "-k", str(workdir), "-c", "fsync=off", "-c", "max_connections=50",
    ])
    proc = spawn("postgres", argv, workdir)
    _wait_ready(proc, lambda: _wait_pg_ready(bindir, port))
    return Postgres(proc, "127.0.0.1", port)


def _wait_pg_ready(bindir: Path, port: int, timeout_s: float = 30.0) -> None:
    """Wait until the server accepts connections (an open port may still be starting up)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        probe = subprocess.run([str(bindir / "pg_isready"), "-h", "127.0.0.1", "-p", str(port)],
                               capture_output=True, check=False)
        if probe.returncode == 0:
            return
        time.sleep(0.1)
    raise TimeoutError(f"postgres on port {port} not ready after {timeout_s}s")
