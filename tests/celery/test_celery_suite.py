"""Celery's own integration suite on `ferry://`: its tasks, canvas, worker and inspect tests.

The suite comes from the source distribution of the installed Celery version
(`tests.celery.celery_suite`: downloaded into a cache directory at the first
run, never copied into this tree) and runs with Celery's own fixtures (an
in-process prefork session worker) against this package's mesh, with a Redis
result backend. Every failure must be one listed, with its reason, in
`celery_suite_failures.txt` (docs/celery.md, Celery's own suite).
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.celery.celery_suite import SUITE_FILES, expected_failures, run_suite, suite_dir
from tests.celery.conftest import CeleryMesh, none_left, per_caller_topics
from tests.support.procs import start_redis

pytestmark = [pytest.mark.integration, pytest.mark.slow]
#: The whole suite takes about 25 minutes here (Redis: 20): beyond `make test`'s budget.
full_suite = pytest.mark.skipif(os.environ.get("FERRY_CELERY_SUITE") != "1",
                                reason="Celery's whole suite runs with FERRY_CELERY_SUITE=1")

#: What `make test` runs of the suite: its remote-control module whole, and the
#: revocation, requeue and retry tests of its task module (docs/celery.md).
MAKE_TEST_PART = (
    "t/integration/test_inspect.py",
    *(f"t/integration/test_tasks.py::test_tasks::{name}" for name in (
        "test_reject_with_requeue_redelivers_and_succeeds",
        "test_reject_without_requeue_stores_failure", "test_revoked",
        "test_revoke_keeps_state_of_task_started_elsewhere",
        "test_revoked_by_headers_simple_canvas", "test_revoke_by_stamped_headers_no_match",
        "test_task_retried_once")),
)
#: Fewer tests than this in the part means it did not really run.
MIN_PART_TESTS = 15

#: The whole run (Celery's tests wait for real results: several minutes).
SUITE_TIMEOUT_S = float(os.environ.get("FERRY_CELERY_SUITE_TIMEOUT_S", "3000"))
#: Fewer tests than this means the suite did not really run (collection failed).
MIN_TESTS = 250


def run_on_ferry(celery_mesh: CeleryMesh, tmp_path: Path, files: tuple[str, ...],
                 min_tests: int) -> None:
    """Run `files` of the suite on the mesh; fail on any failure not listed."""
    try:
        suite_dir()
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"Celery's source distribution could not be downloaded: {exc}")
    before = frozenset(per_caller_topics(celery_mesh.namesrv))
    redis = start_redis(tmp_path / "redis")
    try:
        result = run_suite(f"ferry://{celery_mesh.namesrv}", redis.host, redis.port,
                           tmp_path / "suite", files=files, timeout_s=SUITE_TIMEOUT_S)
    finally:
        redis.proc.stop()
    total = len(result.passed) + len(result.failed) + len(result.skipped)
    assert total >= min_tests, result.output
    unexpected = result.failed - set(expected_failures())
    assert not unexpected, (f"{result.counts()}; {len(unexpected)} failures not in "
                            f"celery_suite_failures.txt: {sorted(unexpected)[:20]}\n"
                            f"{result.output}\n(whole output: {tmp_path}/suite/output.txt)")
    # Every inspect call's reply queue, the worker's pidbox and event queues went with
    # the suite's process: no topic of theirs is left on the mesh.
    none_left(celery_mesh.namesrv, before=before)


@pytest.mark.timeout(SUITE_TIMEOUT_S + 120)
def test_celery_suite_remote_control_revoke_and_requeue(celery_mesh: CeleryMesh,
                                                        tmp_path: Path) -> None:
    run_on_ferry(celery_mesh, tmp_path, MAKE_TEST_PART, MIN_PART_TESTS)


@full_suite
@pytest.mark.timeout(SUITE_TIMEOUT_S + 120)
def test_celery_integration_suite_fails_only_where_listed(celery_mesh: CeleryMesh,
                                                         tmp_path: Path) -> None:
    run_on_ferry(celery_mesh, tmp_path, SUITE_FILES, MIN_TESTS)
