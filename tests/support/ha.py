"""Replicated broker groups as real processes: namesrv plus masters and slaves on free ports.

A `Cluster` is one namesrv and broker processes over a real etcd, under an
etcd prefix of its own. Brokers of one name form a group (ids 0, 1, ...); the
election in etcd makes one of them master. Each broker keeps its ports and
data dir across restarts, so a killed master can rejoin as it was. Used by
tests/replication/ and bench/bench_replication.py.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.procs import (
    Etcd,
    Proc,
    free_port,
    spawn,
    start_namesrv,
    wait_until_ready,
)

READY_TIMEOUT_S = 30.0
#: Small preallocated segments (the disk once filled up); every broker of a group uses it.
SEGMENT_BYTES = 16 << 20


@dataclass
class HaBroker:
    """One broker process of a group and how to reach it."""

    name: str
    broker_id: int
    port: int
    repl_port: int
    http_port: int
    data_dir: Path
    proc: Proc | None = None

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def label(self) -> str:
        return f"{self.name}-{self.broker_id}"

    def alive(self) -> bool:
        return self.proc is not None and self.proc.alive()

    def get_json(self, path: str) -> Any:
        url = f"http://127.0.0.1:{self.http_port}{path}"
        with urllib.request.urlopen(url, timeout=5) as resp:
            return json.loads(resp.read())

    def kill9(self) -> None:
        if self.proc is not None:
            self.proc.kill9()

    def pause(self) -> None:
        """SIGSTOP: the process hangs (its lease keep-alives stop) without dying."""
        assert self.proc is not None
        os.kill(self.proc.popen.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.popen.pid, signal.SIGCONT)

    def stop(self) -> None:
        if self.proc is not None:
            if self.proc.alive():
                try:   # a paused process would never see SIGTERM
                    os.kill(self.proc.popen.pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
            self.proc.stop()


@dataclass
class Cluster:
    """namesrv + replicated broker groups over one etcd prefix."""

    etcd: Etcd
    workdir: Path
    replication: str = "sync"
    election_ttl_s: int = 3
    broker_env: dict[str, str] = field(default_factory=dict)
    prefix: str = field(default_factory=lambda: f"/ferry-ha-{uuid.uuid4().hex[:8]}/")
    namesrv_proc: Proc | None = None
    namesrv_port: int = 0
    brokers: dict[str, HaBroker] = field(default_factory=dict)   # by label "broker-a-0"

    @property
    def namesrv(self) -> str:
        return f"127.0.0.1:{self.namesrv_port}"

    def start_namesrv(self) -> None:
        self.namesrv_proc, self.namesrv_port = start_namesrv(
            self.etcd.endpoint, self.prefix, self.workdir / "namesrv",
            {"FERRY_NAMESRV_LOG_LEVEL": "WARNING"}, READY_TIMEOUT_S)

    def start_broker(self, name: str, broker_id: int, *, wait: bool = True) -> HaBroker:
        """Start (or restart, on its old ports and data) broker `name` id `broker_id`."""
        label = f"{name}-{broker_id}"
        b = self.brokers.get(label)
        if b is None:
            b = HaBroker(name, broker_id, free_port(), free_port(), free_port(),
                         self.workdir / label / "data")
            self.brokers[label] = b
        env = {"FERRY_BROKER_CLUSTER": "TestCluster", "FERRY_BROKER_NAME": name,
               "FERRY_BROKER_ID": str(broker_id), "FERRY_BROKER_HOST": "127.0.0.1",
               "FERRY_BROKER_PORT": str(b.port), "FERRY_BROKER_HTTP_PORT": str(b.http_port),
               "FERRY_BROKER_REPL_PORT": str(b.repl_port),
               "FERRY_BROKER_REPLICATION": self.replication,
               "FERRY_BROKER_ELECTION_TTL_S": str(self.election_ttl_s),
               "FERRY_BROKER_DATA_DIR": str(b.data_dir), "FERRY_BROKER_ETCD": self.etcd.endpoint,
               "FERRY_BROKER_ETCD_PREFIX": self.prefix, "FERRY_BROKER_FLUSH_MODE": "async",
               "FERRY_BROKER_AUTO_CREATE_TOPICS": "true", "FERRY_BROKER_DEFAULT_QUEUES": "4",
               "FERRY_BROKER_SEGMENT_BYTES": str(SEGMENT_BYTES),
               "FERRY_BROKER_LOG_LEVEL": "INFO", **self.broker_env}
        b.proc = spawn(label, [sys.executable, "-m", "ferry_broker"], self.workdir / label, env)
        wait_until_ready(b.proc, f"http://127.0.0.1:{b.http_port}/healthz", READY_TIMEOUT_S)
        if wait:
            self.wait_listed(b)
        return b

    # -- what namesrv sees ------------------------------------------------------------------
    def listed(self) -> list[dict[str, Any]]:
        """namesrv's /v1/brokers (each: name, id, addr, role, epoch, ...); [] if unreachable."""
        try:
            with urllib.request.urlopen(f"http://{self.namesrv}/v1/brokers", timeout=2) as resp:
                return list(json.loads(resp.read()).get("brokers", []))
        except (urllib.error.URLError, OSError, ValueError):
            return []

    def wait_listed(self, b: HaBroker, timeout_s: float = 20.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if any(x.get("addr") == b.addr for x in self.listed()):
                return
            time.sleep(0.1)
        raise RuntimeError(f"namesrv does not list {b.label} after {timeout_s}s")

    def master(self, name: str) -> tuple[HaBroker, int] | None:
        """The group's master as namesrv sees it now (highest epoch), with its epoch."""
        masters = [x for x in self.listed() if x.get("name") == name and x.get("role") == "master"]
        if not masters:
            return None
        top = max(masters, key=lambda x: int(x.get("epoch", 0)))
        for b in self.brokers.values():
            if b.addr == top.get("addr"):
                return b, int(top.get("epoch", 0))
        return None

    def wait_master(self, name: str, *, not_addr: str | None = None, min_epoch: int = 0,
                    timeout_s: float = 30.0) -> tuple[HaBroker, int]:
        """Until the group has a live master (other than `not_addr`, of epoch >= `min_epoch`)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            got = self.master(name)
            if got is not None and got[0].addr != not_addr and got[1] >= min_epoch \
                    and got[0].alive():
                return got
            time.sleep(0.05)
        raise RuntimeError(f"no master for {name} (besides {not_addr}) after {timeout_s}s: "
                           f"{self.listed()}")

    def wait_linked(self, name: str, slaves: int, timeout_s: float = 30.0) -> None:
        """Until the group's master reports `slaves` slaves linked over the replication port."""
        deadline = time.monotonic() + timeout_s
        linked: list[Any] = []
        while time.monotonic() < deadline:
            got = self.master(name)
            if got is not None:
                try:
                    section = got[0].get_json("/v1/stats").get("replication", {})
                except (OSError, ValueError):
                    section = {}
                linked = list(section.get("slaves") or [])
                if len(linked) >= slaves:
                    return
            time.sleep(0.1)
        raise RuntimeError(f"{name}'s master links {linked}, not {slaves} slave(s)")

    def insync(self, name: str) -> list[int] | None:
        """The in-sync set's members as the group's master reports them (None: no master)."""
        got = self.master(name)
        if got is None:
            return None
        try:
            section = got[0].get_json("/v1/stats").get("replication", {})
        except (OSError, ValueError):
            return None
        return list((section.get("insync") or {}).get("members") or [])

    def wait_insync(self, name: str, members: int, timeout_s: float = 30.0) -> list[int]:
        """Until the group's in-sync set (sync mode) has exactly `members` members."""
        deadline = time.monotonic() + timeout_s
        got: list[int] | None = None
        while time.monotonic() < deadline:
            got = self.insync(name)
            if got is not None and len(got) == members:
                return got
            time.sleep(0.1)
        raise RuntimeError(f"{name}'s in-sync set is {got}, not {members} member(s)")

    def wait_role(self, b: HaBroker, role: str, timeout_s: float = 30.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for x in self.listed():
                if x.get("addr") == b.addr and x.get("role") == role:
                    return x
            time.sleep(0.1)
        raise RuntimeError(f"{b.label} is not {role} after {timeout_s}s: {self.listed()}")

    def route(self, topic: str) -> dict[str, Any]:
        url = f"http://{self.namesrv}/v1/routes/{urllib.parse.quote(topic, safe='')}"
        with urllib.request.urlopen(url, timeout=5) as resp:
            return dict(json.loads(resp.read()))

    def stop(self) -> None:
        for b in self.brokers.values():
            b.stop()
        if self.namesrv_proc is not None:
            self.namesrv_proc.stop()

    def logs(self) -> str:
        """The tail of every broker's log, for a failing test's report."""
        out = []
        for b in self.brokers.values():
            if b.proc is not None:
                out.append(f"--- {b.label} ---\n{b.proc.log()[-3000:]}")
        return "\n".join(out)


def start_cluster(etcd: Etcd, workdir: Path, *, replication: str = "sync",
                  groups: tuple[str, ...] = ("broker-a",), per_group: int = 2,
                  election_ttl_s: int = 3, broker_env: dict[str, str] | None = None) -> Cluster:
    """namesrv, then `per_group` brokers of each name; returns once each group has a master."""
    cluster = Cluster(etcd, workdir, replication=replication, election_ttl_s=election_ttl_s,
                      broker_env=dict(broker_env or {}))
    try:
        cluster.start_namesrv()
        for name in groups:
            for broker_id in range(per_group):
                cluster.start_broker(name, broker_id)
            if replication != "none":
                cluster.wait_master(name)
                cluster.wait_linked(name, per_group - 1)
            if replication == "sync":
                cluster.wait_insync(name, per_group)
    except BaseException:
        cluster.stop()
        raise
    return cluster
