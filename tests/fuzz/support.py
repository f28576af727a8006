"""What the fuzz tests measure of a service process: its heap, sampled during the run."""
from __future__ import annotations

import asyncio
from pathlib import Path

#: How often `RssSampler` reads each process's /proc status.
SAMPLE_INTERVAL_S = 0.25


def rss_anon_bytes(pid: int) -> int:
    """The process's anonymous resident memory (heap): what a leak grows.

    RssAnon leaves out file pages (the store's mapped segments), which the
    kernel may keep or drop and which are not the process's own allocations.
    """
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no RssAnon in /proc/{pid}/status")


class RssSampler:
    """Samples the RssAnon of some processes while a run goes on: the baseline and the peak.

    `async with RssSampler({"broker": pid}) as rss:` reads every process
    before the run and every SAMPLE_INTERVAL_S during it; `rss.growth(name)`
    is the peak over the baseline (a leak shows as growth over time, a burst
    as a peak the end would not show).
    """

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self.before = {name: rss_anon_bytes(pid) for name, pid in pids.items()}
        self.peak = dict(self.before)
        self.samples = 0
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> RssSampler:
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            pass
        self._sample()

    async def _run(self) -> None:
        while True:
            self._sample()
            await asyncio.sleep(SAMPLE_INTERVAL_S)

    def _sample(self) -> None:
        self.samples += 1
        for name, pid in self.pids.items():
            try:
                rss = rss_anon_bytes(pid)
            except (OSError, RuntimeError):
                continue  # the process ended: the test's liveness check says so
            self.peak[name] = max(self.peak[name], rss)

    def growth(self, name: str) -> int:
        return self.peak[name] - self.before[name]

    def report(self, name: str) -> str:
        return (f"RssAnon {self.before[name] >> 20} MiB, peak {self.peak[name] >> 20} MiB "
                f"({self.samples} samples)")
