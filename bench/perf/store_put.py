# ruff: noqa  (measurement scripts of docs/perf/broker.md, kept as run)
"""In-process: put_encoded_batch of 256 x 1 KiB entries (as a SEND body), async flush."""
import os
import resource
import shutil
import time

from ferry.codec.entry import append_entry
from ferry.store import MessageStore, StoreConfig

N = int(os.environ.get("N", "400128")); BATCH = 256
root = f"/tmp/store-put-{os.getpid()}"
body = os.urandom(1024)
from ferry.codec.msg_id import new_msg_id


def frame():  # ids as a producer makes them (new_msg_id: a prefix and a counter)
    parts = []
    for i in range(BATCH):
        append_entry(parts, new_msg_id(), 1, 0, b"", b"", b"", body)
    return b"".join(parts)
frames = [frame() for _ in range(32)]
cfg = StoreConfig(root_dir=root, commitlog_segment_bytes=256 << 20)
st = MessageStore(cfg)
prof = os.environ.get("PROF")
if prof:
    import cProfile; pr = cProfile.Profile(); pr.enable()
r0 = resource.getrusage(resource.RUSAGE_SELF); t0 = time.perf_counter()
for i in range(N // BATCH):
    st.put_encoded_batch("bench", i % 8, frames[i % 32], born_host="127.0.0.1:1")
dt = time.perf_counter() - t0; r1 = resource.getrusage(resource.RUSAGE_SELF)
if prof:
    pr.disable(); import pstats; pstats.Stats(pr).sort_stats("tottime").print_stats(15)
n = N // BATCH * BATCH
print(f"store_put {os.environ.get('TAG','')} wall_us_per_msg={dt/n*1e6:.3f} user_us={(r1.ru_utime-r0.ru_utime)/n*1e6:.3f} sys_us={(r1.ru_stime-r0.ru_stime)/n*1e6:.3f}")
st.close(); shutil.rmtree(root)
