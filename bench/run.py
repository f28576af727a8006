"""Run Ferry's benchmarks: `make bench` runs every suite, `make bench BENCH=store` one.

A suite is a module `bench/bench_<name>.py` with a `main()` that prints one
JSON line per case, each with a `bench` field. Suites run one after another in
this one process tree, so their figures come from the same run and machine.
"""
from __future__ import annotations

import importlib
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def suites() -> list[str]:
    return sorted(p.stem.removeprefix("bench_") for p in HERE.glob("bench_*.py"))


def main(argv: list[str]) -> int:
    wanted = argv or suites()
    unknown = [s for s in wanted if s not in suites()]
    if unknown:
        print(f"unknown bench suite(s) {unknown}; known: {suites()}", file=sys.stderr)
        return 2
    sys.path.insert(0, str(HERE))
    for name in wanted:
        importlib.import_module(f"bench_{name}").main()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
