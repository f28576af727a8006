"""Run the Ferry mesh as local processes: what `make up` and `make down` call.

`up` starts every component in order with its data under ./var/, waits until
each answers, prints where things are, and then supervises: Ctrl-C or SIGTERM
(which `make down` sends) stops the children in reverse order.

`up --ha` (`make up HA=1`) runs two brokers per broker name instead of one:
ids 0 and 1 of broker-a and of broker-b, in sync replication
(`FERRY_BROKER_REPLICATION=sync` and `FERRY_BROKER_MIN_INSYNC_REPLICAS=2`: an
acknowledged message is on both brokers of its group), each with its own data dir
(var/broker-a-0, ...), wire port, replication port and HTTP port. The election in
etcd makes one of each pair master; the banner says which. The HA topology, for users with Docker, is
deploy/docker-compose.yml.

Authentication is OFF in this mesh, always (FERRY_AUTH=off for every process,
whatever the caller's environment says): it is for one developer's machine, and
`up` says so first thing and in its banner. deploy/docker-compose.yml runs with
auth on (docs/security.md).

Tracing: every process gets `FERRY_TRACE_DIR=var/traces` (JSON-lines spans,
one file per process; a value already in the environment wins), and the
brokers write their spans to the `%TRACE%` topic through namesrv too.

Metrics: the banner lists each service's `GET /metrics` (Prometheus text,
docs/metrics.md) for a scrape config; `up --prometheus` (`make up PROMETHEUS=1`) also
runs a Prometheus scraping them all (deploy/local_prometheus.py).
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "deploy"))   # its helper modules, also when loaded from a path
from local_prometheus import PROMETHEUS_PORT, prometheus_argv  # noqa: E402
from mesh_probe import port_open, wait_ready  # noqa: E402

# Overridable so tests can run this very script on free ports in a temp dir.
VAR = Path(os.environ.get("FERRY_MESH_VAR_DIR", ROOT / "var"))
PIDFILE = VAR / "run" / "mesh.pid"
#: Where every process of the mesh writes its spans as JSON lines (docs/tracing.md).
TRACE_DIR = VAR / "traces"


def _port(name: str, default: int) -> int:
    return int(os.environ.get(f"FERRY_MESH_{name}_PORT", default))


@dataclass(frozen=True)
class Component:
    """One process of the mesh: how to start it and how to tell it is ready.

    Ready means: `ready_url` answers 200 when given, else `port` accepts.
    """

    name: str
    argv: list[str]
    port: int
    env: dict[str, str]
    ready_url: str = ""


def components(ha: bool = False, prometheus: bool = False) -> list[Component]:
    if prometheus:   # last: it scrapes the others
        return [*components(ha), Component(
            "prometheus", prometheus_argv(metrics_urls(ha), VAR), PROMETHEUS_PORT, {},
            ready_url=f"http://127.0.0.1:{PROMETHEUS_PORT}/-/ready")]
    etcd_port, redis_port = _port("ETCD", 2379), _port("REDIS", 6379)
    etcd_peer = _port("ETCD_PEER", 2380)
    etcd_dir = VAR / "etcd"
    return [
        Component(
            "etcd",
            ["etcd", "--name", "ferry", "--data-dir", str(etcd_dir),
             "--listen-client-urls", f"http://127.0.0.1:{etcd_port}",
             "--advertise-client-urls", f"http://127.0.0.1:{etcd_port}",
             "--listen-peer-urls", f"http://127.0.0.1:{etcd_peer}",
             "--initial-advertise-peer-urls", f"http://127.0.0.1:{etcd_peer}",
             "--initial-cluster", f"ferry=http://127.0.0.1:{etcd_peer}", "--log-level", "error"],
            etcd_port, {},
        ),
        Component(
            "redis",
            ["redis-server", "--port", str(redis_port), "--bind", "127.0.0.1",
             "--dir", str(VAR / "redis"), "--appendonly", "yes"],
            redis_port, {},
        ),
        Component(
            "namesrv", [sys.executable, "-m", "ferry_namesrv"], NAMESRV_PORT,
            {"FERRY_NAMESRV_PORT": str(NAMESRV_PORT), "FERRY_NAMESRV_ETCD": f"127.0.0.1:{etcd_port}",
             "FERRY_NAMESRV_CONSOLE_URL": f"http://127.0.0.1:{CONSOLE_PORT}/console"},
            ready_url=f"http://127.0.0.1:{NAMESRV_PORT}/readyz",
        ),
        *(_ha_brokers(etcd_port) if ha else
          [_broker(name, port, http_port, etcd_port) for name, port, http_port in BROKERS]),
        Component(
            "scheduler", [sys.executable, "-m", "ferry_delay_scheduler"], SCHEDULER_PORT,
            {"FERRY_DELAY_SCHEDULER_HTTP_PORT": str(SCHEDULER_PORT),
             "FERRY_DELAY_SCHEDULER_DATA_DIR": str(VAR / "delay-scheduler"),
             "FERRY_DELAY_SCHEDULER_NAMESRV": f"127.0.0.1:{NAMESRV_PORT}",
             "FERRY_DELAY_SCHEDULER_ETCD": f"127.0.0.1:{etcd_port}"},
            ready_url=f"http://127.0.0.1:{SCHEDULER_PORT}/readyz",
        ),
        Component(
            "txn-checker", [sys.executable, "-m", "ferry_txn_checker"], TXN_CHECKER_PORT,
            {"FERRY_TXN_CHECKER_HTTP_PORT": str(TXN_CHECKER_PORT),
             "FERRY_TXN_CHECKER_DATA_DIR": str(VAR / "txn-checker"),
             "FERRY_TXN_CHECKER_NAMESRV": f"127.0.0.1:{NAMESRV_PORT}",
             "FERRY_TXN_CHECKER_ETCD": f"127.0.0.1:{etcd_port}"},
            ready_url=f"http://127.0.0.1:{TXN_CHECKER_PORT}/readyz",
        ),
        Component(
            # Idempotence over HTTP and reconciliation; its ledger is SQLite under
            # var/dedup (deploy/docker-compose.yml runs it on PostgreSQL).
            "dedup", [sys.executable, "-m", "ferry_dedup"], DEDUP_PORT,
            {"FERRY_DEDUP_HTTP_PORT": str(DEDUP_PORT),
             "FERRY_DEDUP_DATA_DIR": str(VAR / "dedup"),
             "FERRY_DEDUP_NAMESRV": f"127.0.0.1:{NAMESRV_PORT}",
             "FERRY_DEDUP_REDIS": f"redis://127.0.0.1:{redis_port}/0"},
            ready_url=f"http://127.0.0.1:{DEDUP_PORT}/readyz",
        ),
        Component(
            # The web console (namesrv's /console redirects here); it keeps no state.
            "console", [sys.executable, "-m", "ferry_console"], CONSOLE_PORT,
            {"FERRY_CONSOLE_HTTP_PORT": str(CONSOLE_PORT),
             "FERRY_CONSOLE_NAMESRV": f"127.0.0.1:{NAMESRV_PORT}",
             "FERRY_CONSOLE_DELAY_SCHEDULER": f"127.0.0.1:{SCHEDULER_PORT}",
             "FERRY_CONSOLE_TXN_CHECKER": f"127.0.0.1:{TXN_CHECKER_PORT}",
             "FERRY_CONSOLE_DEDUP": f"127.0.0.1:{DEDUP_PORT}"},
            ready_url=f"http://127.0.0.1:{CONSOLE_PORT}/readyz",
        ),
    ]


NAMESRV_PORT = _port("NAMESRV", 9876)
# (name, wire port, HTTP port): 10911 is RocketMQ's broker port; HTTP APIs from 10920 up.
BROKERS = [("broker-a", _port("BROKER_A", 10911), _port("BROKER_A_HTTP", 10920)),
           ("broker-b", _port("BROKER_B", 10915), _port("BROKER_B_HTTP", 10921))]
SCHEDULER_PORT = _port("SCHEDULER", 10922)  # the delay scheduler's HTTP API
TXN_CHECKER_PORT = _port("TXN_CHECKER", 10923)  # the txn-checker's HTTP API
DEDUP_PORT = _port("DEDUP", 10926)  # the dedup service's HTTP API
CONSOLE_PORT = _port("CONSOLE", 10927)  # the web console (ferry-console)


def _broker(name: str, port: int, http_port: int, etcd_port: int) -> Component:
    return Component(
        name, [sys.executable, "-m", "ferry_broker"], port,
        {"FERRY_BROKER_NAME": name, "FERRY_BROKER_PORT": str(port),
         "FERRY_BROKER_HTTP_PORT": str(http_port),
         "FERRY_BROKER_DATA_DIR": str(VAR / name), "FERRY_BROKER_ETCD": f"127.0.0.1:{etcd_port}",
         "FERRY_BROKER_NAMESRV": f"127.0.0.1:{NAMESRV_PORT}"},
        ready_url=f"http://127.0.0.1:{http_port}/readyz",
    )


# HA (`up --ha`): (name, broker id, wire port, replication port, HTTP port). Id 0 keeps the
# single-broker ports; id 1 takes the next free ones of the same ranges.
HA_BROKERS = [
    ("broker-a", 0, _port("BROKER_A", 10911), _port("BROKER_A_REPL", 10912),
     _port("BROKER_A_HTTP", 10920)),
    ("broker-a", 1, _port("BROKER_A1", 10913), _port("BROKER_A1_REPL", 10914),
     _port("BROKER_A1_HTTP", 10924)),
    ("broker-b", 0, _port("BROKER_B", 10915), _port("BROKER_B_REPL", 10916),
     _port("BROKER_B_HTTP", 10921)),
    ("broker-b", 1, _port("BROKER_B1", 10917), _port("BROKER_B1_REPL", 10918),
     _port("BROKER_B1_HTTP", 10925)),
]
#: The replication mode of `up --ha`: sync, so that `make up HA=1` loses no acknowledged
#: message when a master dies (async is faster and may lose the last writes).
HA_REPLICATION = os.environ.get("FERRY_MESH_REPLICATION", "sync")
#: ... and an ack means both brokers of the group have it: with the slave out of the
#: in-sync set, writes answer SlaveNotAvailableError (retriable) instead of taking one copy.
HA_MIN_INSYNC_REPLICAS = "2"


def _ha_brokers(etcd_port: int) -> list[Component]:
    out = []
    for name, broker_id, port, repl_port, http_port in HA_BROKERS:
        comp = _broker(name, port, http_port, etcd_port)
        env = {**comp.env, "FERRY_BROKER_ID": str(broker_id),
               "FERRY_BROKER_REPLICATION": HA_REPLICATION,
               "FERRY_BROKER_MIN_INSYNC_REPLICAS": HA_MIN_INSYNC_REPLICAS,
               "FERRY_BROKER_REPL_PORT": str(repl_port),
               "FERRY_BROKER_DATA_DIR": str(VAR / f"{name}-{broker_id}")}
        out.append(Component(f"{name}-{broker_id}", comp.argv, port, env, comp.ready_url))
    return out


def ha_roles(timeout_s: float = 15.0) -> dict[str, str]:
    """`{"broker-a-0": "master", ...}` as namesrv lists them, once every group has a master."""
    deadline = time.monotonic() + timeout_s
    roles: dict[str, str] = {}
    while time.monotonic() < deadline:
        try:
            url = f"http://127.0.0.1:{NAMESRV_PORT}/v1/brokers"
            with urllib.request.urlopen(url, timeout=1) as resp:
                brokers = json.loads(resp.read()).get("brokers", [])
        except (OSError, ValueError):
            brokers = []
        roles = {f"{b.get('name')}-{b.get('id')}": str(b.get("role") or "?")
                 for b in brokers}
        masters = {k.rsplit("-", 1)[0] for k, r in roles.items() if r == "master"}
        if masters >= {name for name, *_ in HA_BROKERS}:
            break
        time.sleep(0.2)
    return roles


#: Said when `up` starts and in its banner: anyone who reaches these ports may do anything.
AUTH_OFF_NOTICE = ("Authentication is OFF in this local mesh (FERRY_AUTH=off): anyone who can "
                   "reach its ports can do anything.\nFor a mesh with identities, signatures "
                   "and permissions, run deploy/docker-compose.yml (FERRY_AUTH=on; "
                   "docs/security.md).")


def process_env(comp: Component) -> dict[str, str]:
    """The environment `comp` runs with: tracing to var/traces (unless the caller's own
    environment says otherwise), the caller's environment, then the component's own;
    auth always off (a FERRY_AUTH=on in the caller's shell would lock the mesh: it has
    no identities)."""
    return {"FERRY_TRACE_DIR": str(TRACE_DIR), **os.environ, **comp.env, "FERRY_AUTH": "off"}


def _log_tail(name: str, lines: int = 15) -> str:
    """The last lines of a component's log, to say why it failed where it is seen."""
    try:
        text = (VAR / "log" / f"{name}.log").read_text(errors="replace")
    except OSError as exc:
        return f"    (no log: {exc})"
    return "\n".join("    " + line for line in text.splitlines()[-lines:])


def up(ha: bool = False, prometheus: bool = False) -> int:
    if PIDFILE.exists():
        pid = int(PIDFILE.read_text())
        try:
            os.kill(pid, 0)
            print(f"the mesh is already running (pid {pid}); `make down` stops it")
            return 1
        except ProcessLookupError:
            PIDFILE.unlink()
    for sub in ("run", "log", "redis", "traces"):
        (VAR / sub).mkdir(parents=True, exist_ok=True)
    for comp in components(ha, prometheus):
        if port_open(comp.port):
            print(f"port {comp.port} for {comp.name} is taken by another process; stop it first")
            return 1
    PIDFILE.write_text(str(os.getpid()))
    print(AUTH_OFF_NOTICE)
    started: list[tuple[Component, subprocess.Popen[bytes]]] = []
    stopping = False

    def on_signal(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        for comp in components(ha, prometheus):
            log = open(VAR / "log" / f"{comp.name}.log", "ab")  # noqa: SIM115
            env = process_env(comp)
            proc = subprocess.Popen(comp.argv, stdout=log, stderr=subprocess.STDOUT, env=env,
                                    cwd=ROOT, start_new_session=True)
            log.close()
            started.append((comp, proc))
            wait_ready(comp.name, comp.port, comp.ready_url, proc,
                       functools.partial(_log_tail, comp.name))
            print(f"  {comp.name:<10} ready on 127.0.0.1:{comp.port}")
        print(ha_banner(ha_roles()) if ha else banner())
        if prometheus:
            print(f"Prometheus: http://127.0.0.1:{PROMETHEUS_PORT} (scrapes every /metrics above)")
        while not stopping:
            for comp, proc in started:
                if proc.poll() is not None:
                    print(f"{comp.name} exited with {proc.returncode}; stopping the mesh")
                    stopping = True
            time.sleep(0.5)
        return 0
    except RuntimeError as exc:
        print(f"make up failed: {exc}")
        return 1
    finally:
        for comp, proc in reversed(started):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
            print(f"  {comp.name:<10} stopped")
        PIDFILE.unlink(missing_ok=True)


def metrics_urls(ha: bool = False) -> dict[str, str]:
    """Each service's GET /metrics (Prometheus text, docs/metrics.md), by component name."""
    brokers = [(f"{n}-{i}", h) for n, i, _, _, h in HA_BROKERS] if ha else \
        [(n, h) for n, _, h in BROKERS]
    ports = [("namesrv", NAMESRV_PORT), *brokers, ("scheduler", SCHEDULER_PORT),
             ("txn-checker", TXN_CHECKER_PORT), ("dedup", DEDUP_PORT), ("console", CONSOLE_PORT)]
    return {name: f"http://127.0.0.1:{port}/metrics" for name, port in ports}


def metrics_lines(ha: bool = False) -> str:
    """The banner's lines saying where each service's /metrics is."""
    return "Metrics (Prometheus, docs/metrics.md):\n" + "".join(
        f"  {name:<12} {url}\n" for name, url in metrics_urls(ha).items())


def banner(ha: bool = False) -> str:
    return (
        f"\nFerry is up. namesrv: 127.0.0.1:{NAMESRV_PORT} (export FERRY_NAMESRV=127.0.0.1:{NAMESRV_PORT})\n"
        "Brokers: " + ", ".join(f"{n} 127.0.0.1:{p} (HTTP {h})" for n, p, h in BROKERS) + "\n"
        f"Delay scheduler: HTTP 127.0.0.1:{SCHEDULER_PORT}   "
        f"txn-checker: HTTP 127.0.0.1:{TXN_CHECKER_PORT}   "
        f"dedup: HTTP 127.0.0.1:{DEDUP_PORT} (ledger var/dedup/ledger.db)\n"
        f"Console: http://127.0.0.1:{CONSOLE_PORT}/console\n"
        + metrics_lines(ha) + AUTH_OFF_NOTICE + "\n"
        "Data and logs: ./var/   Traces: ./var/traces/ (JSON lines; `export "
        "FERRY_TRACE_DIR=var/traces` for your clients too)\n"
        "Stop: Ctrl-C here, or `make down` from another shell.\n\n"
        "Try, in another shell:\n"
        "  . .venv/bin/activate\n"
        "  ferry topic create demo\n"
        "  ferry send demo hello\n"
        "  ferry consume demo --group g --from earliest --count 1\n"
        "  ferry send demo later --delay-ms 5000     # consume again: `later` arrives ~5 s on\n"
        "  ferry send demo big --prop amount=500\n"
        "  ferry consume demo --group g2 --from earliest --count 1 --sql 'amount > 100'"
        "   # only `big`\n"
    )


def ha_banner(roles: dict[str, str]) -> str:
    """The banner of `up --ha`: every broker with its role, then the usual hints."""
    lines = [f"  {name}-{bid} 127.0.0.1:{port} (repl {repl}, HTTP {http}): "
             f"{roles.get(f'{name}-{bid}', '?')}"
             for name, bid, port, repl, http in HA_BROKERS]
    text = banner(ha=True)
    head, _, rest = text.partition("Brokers: ")
    rest = rest.partition("\n")[2]
    return (f"{head}Brokers ({HA_REPLICATION} replication; roles come from the election in "
            "etcd and move on failover: `ferry broker list`):\n" + "\n".join(lines) + "\n"
            + rest)


def down() -> int:
    if not PIDFILE.exists():
        print("the mesh is not running")
        return 0
    pid = int(PIDFILE.read_text())
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        PIDFILE.unlink(missing_ok=True)
        print("the mesh was not running (stale pid file removed)")
        return 0
    for _ in range(200):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            print("the mesh is stopped")
            return 0
        time.sleep(0.1)
    print(f"the mesh (pid {pid}) did not stop within 20 s")
    return 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("action", choices=["up", "down"])
    parser.add_argument("--ha", action="store_true",
                        help="a master and a slave per broker name (sync replication)")
    parser.add_argument("--prometheus", action="store_true",
                        help="also run Prometheus scraping every service (var/prometheus)")
    args = parser.parse_args(argv)
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    return up(args.ha, args.prometheus) if args.action == "up" else down()


if __name__ == "__main__":
    sys.exit(main())
