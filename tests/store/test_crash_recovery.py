"""Crash recovery with real SIGKILLs: every acknowledged append survives, nothing else is served.

A child process (crash_child.py) appends and prints each acknowledged message;
the parent kills it with SIGKILL at a random moment, reopens the store and checks
it. Trials run one after another on the same directory, so each recovery also
starts from a store that was itself recovered.
"""
from __future__ import annotations

import importlib.util
import os
import random
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

from ferry.store import GetStatus, MessageStore, StoreConfig, decode_record

CHILD = Path(__file__).with_name("crash_child.py")
_spec = importlib.util.spec_from_file_location("ferry_store_crash_child", CHILD)
assert _spec is not None and _spec.loader is not None
_child = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_child)
CONFIG, body_for = _child.CONFIG, _child.body_for
REPO = Path(__file__).resolve().parents[2]


def _run_and_kill(root: Path, mode: str, seed: int, run_s: float) -> list[tuple[str, str, int, int]]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, str(CHILD), str(root), mode, str(seed)],
                            stdout=subprocess.PIPE, env=env)
    assert proc.stdout is not None
    out = b""
    deadline = None
    try:
        while True:
            ready, _, _ = select.select([proc.stdout], [], [], 0.05)
            if ready:
                chunk = os.read(proc.stdout.fileno(), 1 << 16)
                if not chunk:
                    break
                out += chunk
            if deadline is None and b"ready\n" in out:
                deadline = time.monotonic() + run_s
            if deadline is not None and time.monotonic() >= deadline:
                break
            assert proc.poll() is None, "the child died on its own"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    out += proc.stdout.read()  # lines written before the kill are acknowledged
    proc.stdout.close()
    acks = []
    for line in out.split(b"\n")[:-1]:  # a last line without its newline is not an ack
        if line.startswith(b"ack "):
            _, mid, topic, qid, qoff = line.decode().split()
            acks.append((mid, topic, int(qid), int(qoff)))
    return acks


def _check(root: Path, acked: dict[str, tuple[str, int, int]]) -> None:
    with MessageStore(StoreConfig(root_dir=str(root), **CONFIG)) as s:  # type: ignore[arg-type]
        served: dict[str, tuple[str, int, int]] = {}
        for topic, qids in s.topic_queues().items():
            for q in qids:
                off = 0
                while True:
                    got = s.get_messages(topic, q, off, max_count=256, max_bytes=8 << 20)
                    if got.status is not GetStatus.FOUND:
                        assert got.status in (GetStatus.OFFSET_OVERFLOW_ONE,
                                              GetStatus.NO_MESSAGE_IN_QUEUE)
                        break
                    for raw in got.records:
                        m = decode_record(raw)  # verifies the CRC again
                        assert (m.topic, m.queue_id, m.queue_offset) == (topic, q, off)
                        assert m.body == body_for(m.msg_id, len(m.body)), "garbage served"
                        served[m.msg_id.hex()] = (topic, q, off)
                        off += 1
        missing = [mid for mid in acked if mid not in served]
        assert not missing, f"{len(missing)} acknowledged appends lost"
        for mid, where in acked.items():
            assert served[mid] == where
        for mid in rng_sample(list(acked), 20):
            msg = s.query_by_id(bytes.fromhex(mid))
            assert msg is not None and msg.msg_id.hex() == mid


def rng_sample(items: list[str], n: int) -> list[str]:
    return random.Random(len(items)).sample(items, min(n, len(items)))


def test_sigkill_sync_and_async_never_loses_acknowledged_appends(tmp_path: Path) -> None:
    rng = random.Random(20261121)
    acked: dict[str, tuple[str, int, int]] = {}
    trials = ["sync"] * 16 + ["async"] * 6
    rng.shuffle(trials)
    for mode in trials:
        acks = _run_and_kill(tmp_path, mode, rng.randrange(1 << 30), rng.uniform(0.0, 0.25))
        for mid, topic, qid, qoff in acks:
            acked[mid] = (topic, qid, qoff)
        _check(tmp_path, acked)
    assert len(acked) > 1000
    assert len(list((tmp_path / "commitlog").iterdir())) > 2  # the trials crossed segments
