# ruff: noqa  (measurement scripts of docs/perf/broker.md, kept as run)
"""In-process sync group commit: 64 asyncio appenders, put one 1 KiB message then await the group."""
import asyncio
import os
import shutil
import time

from ferry.store import FlushMode, MessageIn, MessageStore, StoreConfig

SECS = float(os.environ.get("SECS", "4")); SENDERS = int(os.environ.get("SENDERS", "64"))
root = f"/tmp/store-sync-{os.getpid()}"
from ferry.store.commit_log import CommitLog

_orig = CommitLog.flush
fl = []
def _timed(self, target=None):
    t = time.perf_counter(); r = _orig(self, target); fl.append(time.perf_counter() - t); return r
CommitLog.flush = _timed
body = os.urandom(1024)
st = MessageStore(StoreConfig(root_dir=root, commitlog_segment_bytes=256 << 20, flush_mode=FlushMode.SYNC))
lat = []
async def main():
    groups = {}
    def wait(fut):
        g = groups.get(id(fut))
        if g is None:
            g = groups[id(fut)] = asyncio.wrap_future(fut)
            g.add_done_callback(lambda _f, k=id(fut): groups.pop(k, None))
        return asyncio.shield(g)
    done = 0
    stop = time.perf_counter() + SECS
    async def sender(i):
        nonlocal done
        while time.perf_counter() < stop:
            t = time.perf_counter()
            r = st.put(MessageIn("bench", i % 8, body))
            await wait(st.wait_durable(r.end_offset))
            lat.append(time.perf_counter() - t)
            done += 1
    t0 = time.perf_counter()
    await asyncio.gather(*(sender(i) for i in range(SENDERS)))
    return done / (time.perf_counter() - t0)
time.sleep(float(os.environ.get("PRE", "0.5")))  # let the warmer start
r = asyncio.run(main())
lat.sort()
print(f"store_sync {os.environ.get('TAG','')} msgs_s={r:.0f} p50_ms={lat[len(lat)//2]*1e3:.2f} p99_ms={lat[len(lat)*99//100]*1e3:.2f} flushes={len(fl)} flush_p50_ms={sorted(fl)[len(fl)//2]*1e3:.3f} flush_mean_ms={sum(fl)/len(fl)*1e3:.3f}")
st.close(); shutil.rmtree(root)
