# ruff: noqa  (measurement scripts of docs/perf/broker.md, kept as run)
"""Raw-wire SEND blaster: CONNS connections, WINDOW frames in flight each, 256 x 1 KiB per frame."""
import asyncio
import os
import sys
import time

from ferry.codec.entry import append_entry
from ferry.codec.msg_id import new_msg_id
from ferry.wire import FrameDecoder, encode_frame, request
from ferry.wire.codes import RequestCode

ADDR = sys.argv[1]; TOTAL_FRAMES = int(sys.argv[2]); CONNS = int(os.environ.get("CONNS", "2"))
WINDOW = int(os.environ.get("WINDOW", "8")); QUEUES = int(os.environ.get("QUEUES", "8"))
BODY = os.urandom(1024); BATCH = 256
def template():
    parts = []
    for _ in range(BATCH):
        append_entry(parts, b"\0"*16, int(time.time()*1000), 0, b"", b"", b"", BODY)
    return b"".join(parts)
TPL = template(); ESZ = len(TPL) // BATCH
async def conn(idx, nframes, counts):
    host, port = ADDR.split(":")
    r, w = await asyncio.open_connection(host, int(port))
    dec = FrameDecoder()
    sent = done = 0; rid = 0
    async def reader():
        nonlocal done
        while done < nframes:
            data = await r.read(1 << 16)
            if not data: raise SystemExit("closed")
            for f in dec.feed(data):
                if f.error: raise SystemExit(f"error {f.error} {f.message}")
                done += 1
                counts[0] += 1
    rt = asyncio.ensure_future(reader())
    while sent < nframes:
        while sent - done >= WINDOW:
            await asyncio.sleep(0.0005)
            if rt.done(): rt.result()
        body = bytearray(TPL)
        for i in range(BATCH):  # ids as a producer makes them
            body[i*ESZ+4:i*ESZ+20] = new_msg_id()
        rid += 1
        w.write(encode_frame(request(RequestCode.SEND, rid, {"topic": "bench", "queue_id": (idx + sent) % QUEUES}, bytes(body))))
        sent += 1
        if sent % 4 == 0: await w.drain()
    await rt
    w.close()
async def main():
    counts = [0]
    per = TOTAL_FRAMES // CONNS
    t0 = time.perf_counter()
    await asyncio.gather(*(conn(i, per, counts) for i in range(CONNS)))
    dt = time.perf_counter() - t0
    print(f"blast msgs={per*CONNS*BATCH} secs={dt:.2f} msgs_s={per*CONNS*BATCH/dt:.0f}", flush=True)
asyncio.run(main())
