"""Restart a test's own etcd on the same ports and data directory (an etcd outage)."""
from __future__ import annotations

import asyncio
import os
from pathlib import Path

from tests.support.procs import Etcd, spawn, wait_for_port


async def restart_etcd(own: Etcd, workdir: Path) -> None:
    """Start `own` again after `own.proc.stop()`, with the same argv; wait for its port."""
    argv = [str(a) for a in own.proc.popen.args]  # type: ignore[union-attr]
    own.proc = spawn("etcd", argv, workdir, env={"ETCD_UNSUPPORTED_ARCH": os.uname().machine})
    await asyncio.to_thread(wait_for_port, own.host, own.port)
