"""Celery's own integration suite (`t/integration` of Celery's source distribution), run here.

The suite is not in this tree: `suite_dir()` downloads the source distribution
of the Celery version installed here (`pip download --no-binary :all: --no-deps
celery==X`) into a cache directory (FERRY_CELERY_SUITE_CACHE, default
`~/.cache/ferry/celery-suite`) once, and unpacks it there. `run_suite()` runs
the chosen files with Celery's own fixtures (`celery.contrib.pytest`: one
in-process prefork session worker) against a broker URL and a Redis result
backend, as Celery's CI does (TEST_BROKER, TEST_BACKEND, REDIS_HOST/PORT), and
returns every test's outcome from the JUnit report.

`python -m tests.celery.celery_suite BROKER_URL REDIS_HOST:PORT` runs it by
hand (for the side-by-side counts of docs/celery.md, e.g. on Redis).
"""
from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path

#: The files run: tasks, canvas, and the worker / inspect tests.
SUITE_FILES = ("t/integration/test_tasks.py", "t/integration/test_canvas.py",
               "t/integration/test_inspect.py", "t/integration/test_worker.py")
#: Failures the suite may show on `ferry://`, each with its reason (docs/celery.md).
EXPECTED_FILE = Path(__file__).with_name("celery_suite_failures.txt")


def cache_dir() -> Path:
    return Path(os.environ.get("FERRY_CELERY_SUITE_CACHE")
                or Path.home() / ".cache" / "ferry" / "celery-suite")


def suite_dir() -> Path:
    """The unpacked source distribution of the installed Celery (downloaded once)."""
    celery_version = version("celery")
    root = cache_dir()
    unpacked = root / f"celery-{celery_version}"
    if (unpacked / "t" / "integration" / "conftest.py").exists():
        return unpacked
    root.mkdir(parents=True, exist_ok=True)
    sdist = root / f"celery-{celery_version}.tar.gz"
    if not sdist.exists():
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-binary", ":all:",
                        "--no-deps", f"celery=={celery_version}",
                        "-d", str(root)], check=True, capture_output=True, timeout=600)
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers()
                   if m.name.startswith(f"celery-{celery_version}/t/")
                   or m.name == f"celery-{celery_version}/pyproject.toml"]
        tar.extractall(root, members=members, filter="data")
    return unpacked


@dataclass
class SuiteResult:
    passed: set[str] = field(default_factory=set)
    failed: set[str] = field(default_factory=set)    # failures and errors
    skipped: set[str] = field(default_factory=set)
    output: str = ""

    def counts(self) -> dict[str, int]:
        return {"passed": len(self.passed), "failed": len(self.failed),
                "skipped": len(self.skipped)}


def run_suite(broker: str, redis_host: str, redis_port: int, workdir: Path,
              files: tuple[str, ...] = SUITE_FILES, timeout_s: float = 3_600) -> SuiteResult:
    """Run Celery's `files` against `broker` with Redis `redis_host:redis_port` as backend."""
    where = suite_dir()
    files = tuple(os.environ.get("FERRY_CELERY_SUITE_FILES", "").split()) or files
    workdir.mkdir(parents=True, exist_ok=True)
    report = workdir / "junit.xml"
    env = {**os.environ, "TEST_BROKER": broker,
           "TEST_BACKEND": f"redis://{redis_host}:{redis_port}/1",
           "REDIS_HOST": redis_host, "REDIS_PORT": str(redis_port),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("PYTEST_XDIST_WORKER", None)
    env.pop("PYTEST_ADDOPTS", None)
    output = workdir / "output.txt"   # written as the suite runs (`-v`: one line per test)
    with output.open("w") as out:
        # `-p ferry`: Celery's conftest never imports Ferry; importing it registers ferry://
        subprocess.run(
            [sys.executable, "-m", "pytest", "-p", "ferry", "-p", "celery.contrib.pytest",
             "-p", "no:cacheprovider", "-p", "no:xdist", "-v", "-rfE", "--durations=30",
             "--timeout=300", "-o", "addopts=", f"--junitxml={report}", *files],
            cwd=where, env=env, stdout=out, stderr=subprocess.STDOUT, text=True,
            timeout=timeout_s)
    result = parse_junit(report)
    result.output = output.read_text()[-5_000:]
    return result


def parse_junit(report: Path) -> SuiteResult:
    result = SuiteResult()
    if not report.exists():
        return result
    for case in ET.parse(report).getroot().iter("testcase"):
        test_id = f"{case.get('classname')}::{case.get('name')}"
        if case.find("failure") is not None or case.find("error") is not None:
            result.failed.add(test_id)
        elif case.find("skipped") is not None:
            result.skipped.add(test_id)
        else:
            result.passed.add(test_id)
    return result


def expected_failures(path: Path = EXPECTED_FILE) -> dict[str, str]:
    """`test id  # reason` lines of the expected-failures file (blank and `#` lines skipped)."""
    expected: dict[str, str] = {}
    for line in path.read_text().splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        test_id, _, reason = line.partition("#")
        expected[test_id.strip()] = reason.strip()
    return expected


if __name__ == "__main__":   # pragma: no cover - run by hand
    host, _, port = sys.argv[2].partition(":")
    res = run_suite(sys.argv[1], host, int(port), Path(sys.argv[3] if len(sys.argv) > 3
                                                       else "/tmp/celery-suite"))
    print(res.counts())
    for test_id in sorted(res.failed):
        print("FAILED", test_id)
