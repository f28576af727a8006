# ruff: noqa  (measurement scripts of docs/perf/broker.md, kept as run)
import asyncio
import os
import sys
import time
from pathlib import Path

W = os.environ["W"]
sys.path.insert(0, W + "/bench")
import bench_mesh as bm

MODE = os.environ.get("MODE", "produce")
N = int(os.environ.get("N", "300032"))
TAG = os.environ.get("TAG", "x")

def cpu(pid):
    with open(f"/proc/{pid}/stat") as f:
        parts = f.read().rsplit(")", 1)[1].split()
    global LAST
    LAST = (int(parts[11]) / os.sysconf("SC_CLK_TCK"), int(parts[12]) / os.sysconf("SC_CLK_TCK"))
    return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")

def main():
    work = Path(f"/tmp/broker-put-w-{TAG}-{os.getpid()}"); work.mkdir(parents=True, exist_ok=True)
    etcd = bm.start_etcd(work / "etcd")
    bm.use_tracing(os.environ.get("TR", "default"))
    flush = "sync" if MODE == "sync" else "async"
    procs, ns = bm.start_ferry(work / "f", etcd.endpoint, flush)
    try:
        asyncio.run(bm.ferry_wait_route(ns, "bench"))
        pid = procs[0].popen.pid
        spy = None
        if os.environ.get("SPY"):
            import subprocess
            spy = subprocess.Popen(["/work/main/.venv/bin/py-spy","record","-r","200","-d",os.environ["SPY"],"-p",str(pid),"-f","raw","-o",f"/tmp/broker-put-{TAG}.txt"],stdout=subprocess.DEVNULL,stderr=subprocess.DEVNULL)
            time.sleep(1)
        c0 = cpu(pid); u0 = LAST; t0 = time.perf_counter()
        if MODE == "sync":
            bm.SYNC_SECONDS = float(os.environ.get("SECS", "8"))
            r = asyncio.run(bm.ferry_sync_flush(ns, "bench"))
            n = r * (time.perf_counter() - t0)
        else:
            if os.environ.get("BLAST"):
                import subprocess
                br_port = [v for v in [procs[0].popen.args] if v]  # unused
                env = dict(kv.split("=", 1) for kv in open(f"/proc/{pid}/environ").read().split("\0") if "=" in kv)
                addr = "127.0.0.1:" + env["FERRY_BROKER_PORT"]
                nfr = N // 256
                out = subprocess.run([sys.executable, "" + os.path.join(os.path.dirname(os.path.abspath(__file__)), "blast_send.py") + "", addr, str(nfr)], capture_output=True, text=True)
                print(out.stdout.strip(), out.stderr[-500:])
                r = float(out.stdout.split("msgs_s=")[1]); n = nfr // int(os.environ.get("CONNS","2")) * int(os.environ.get("CONNS","2")) * 256
            else:
                r = asyncio.run(bm.ferry_produce(ns, "bench", N)); n = N
        c1 = cpu(pid); u1 = LAST
        print(f"broker user_us={(u1[0]-u0[0])/n*1e6:.2f} sys_us={(u1[1]-u0[1])/n*1e6:.2f}")
        cc = os.times(); print(f"{TAG} {MODE} client_cpu_s={cc.user+cc.system:.1f} msgs_s={round(r)} broker_cpu_us_per_msg={(c1-c0)/n*1e6:.2f} broker_cpu_frac={(c1-c0)/(time.perf_counter()-t0):.2f}", flush=True)
        if spy: spy.wait()
    finally:
        for p in procs: p.stop()
        etcd.proc.stop()
        import shutil; shutil.rmtree(work, ignore_errors=True)
main()
