"""A stand-in broker process for tests: registers in etcd, keeps its lease alive, waits.

Run as `python broker_proc.py ENDPOINT PREFIX NAME ADDR TTL_S`. Killing it with
SIGKILL is how a test simulates a broker that died without unregistering.
"""
from __future__ import annotations

import asyncio
import sys

from ferry.routing import BrokerInfo, EtcdRegistry


async def main(endpoint: str, prefix: str, name: str, addr: str, ttl_s: int) -> None:
    reg = EtcdRegistry(endpoint, prefix=prefix)
    await reg.start()
    await reg.register_broker(BrokerInfo("c1", name, 0, addr), ttl_s=ttl_s,
                              keepalive_s=ttl_s / 4)
    print("registered", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    endpoint, prefix, name, addr, ttl = sys.argv[1:6]
    asyncio.run(main(endpoint, prefix, name, addr, int(ttl)))
