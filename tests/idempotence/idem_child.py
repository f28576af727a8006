"""A consumer process a test kills with -9 after it handled everything, before any commit.

Usage: python idem_child.py CONFIG_JSON, with namesrv, topic, group, expect,
signal (a file path) and setup (tests.idempotence.run_checks.Setup fields).
Auto-commit is off, so nothing it handled is committed; once its check
counted `expect` handler runs it writes its counts to the signal file and
waits to be killed.
"""
from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from ferry import Consumer  # noqa: E402

from tests.idempotence.run_checks import Setup, make_check  # noqa: E402

DEADLINE_S = 240.0


async def main(cfg: dict[str, object]) -> None:
    setup = Setup(**cfg["setup"])  # type: ignore[arg-type]
    check, handle, _close = make_check(setup)
    consumer = Consumer(str(cfg["topic"]), group=str(cfg["group"]), namesrv=str(cfg["namesrv"]),
                        auto_offset_reset="earliest", enable_auto_commit=False,
                        heartbeat_interval_ms=300, rebalance_interval_ms=300,
                        pull_max_wait_ms=1000, request_timeout_ms=5000)
    await consumer.start()
    running = asyncio.create_task(consumer.run(handle, concurrency=8, idempotence=check))
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEADLINE_S
    expect = int(cfg["expect"])  # type: ignore[call-overload]
    while (consumer.idempotence_stats is None or consumer.idempotence_stats.ran < expect):
        if running.done() or loop.time() > deadline:
            raise SystemExit(f"child: gave up with {consumer.idempotence_stats}")
        await asyncio.sleep(0.05)
    Path(str(cfg["signal"])).write_text(json.dumps(consumer.idempotence_stats.as_dict()))
    await asyncio.sleep(3600)   # killed -9 here: no stop(), no commit


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))
