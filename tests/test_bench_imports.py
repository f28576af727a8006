"""Every bench module imports: `make bench` runs the suites one after another, so one
suite whose imports broke (a name moved out of a shared bench module) ends the run
for every suite after it, and nothing else in `make test` runs the benches."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"


def test_every_bench_module_imports() -> None:
    modules = sorted(p.stem for p in BENCH.glob("*.py"))
    assert "bench_replication" in modules and "mesh_workload" in modules
    # A fresh interpreter, as `make bench` runs them: the modules put bench/ and the
    # repository root on sys.path themselves.
    code = ("import importlib, sys\n"
            f"sys.path.insert(0, {str(BENCH)!r})\n"
            "failed = []\n"
            f"for name in {modules!r}:\n"
            "    try:\n"
            "        importlib.import_module(name)\n"
            "    except Exception as exc:\n"
            "        failed.append(f'{name}: {type(exc).__name__}: {exc}')\n"
            "print('\\n'.join(failed))\n"
            "sys.exit(1 if failed else 0)\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, f"bench modules that do not import:\n{done.stdout}{done.stderr}"
