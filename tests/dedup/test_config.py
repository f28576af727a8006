"""The dedup service's settings, report files, and docs/idempotence.md held to them (no processes)."""
from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from pathlib import Path

import pytest
from ferry_dedup.config import ENV_PREFIX, DedupConfig, ReconcileTarget
from ferry_dedup.reconcile import SECTIONS
from ferry_dedup.reports import ReportStore

DOC = Path(__file__).resolve().parents[2] / "docs" / "idempotence.md"


def test_scheduled_targets_default_their_scene_to_the_group() -> None:
    targets = ReconcileTarget.parse_list(" orders:billing , orders:shipping:ship.v2,")
    assert targets == (ReconcileTarget("orders", "billing", "billing"),
                       ReconcileTarget("orders", "shipping", "ship.v2"))


@pytest.mark.parametrize("spec", ["orders", "orders:billing:s:x", "%RETRY%g:g", "t:bad group",
                                  "t:g:-scene"])
def test_a_bad_target_names_itself(spec: str) -> None:
    with pytest.raises(ValueError, match=re.escape(repr(spec.strip()))):
        DedupConfig.from_env(env={"FERRY_DEDUP_RECONCILE": spec})


def test_the_ledger_defaults_to_sqlite_under_the_data_dir() -> None:
    cfg = DedupConfig.from_env(env={"FERRY_DEDUP_DATA_DIR": "/srv/dedup"})
    assert cfg.ledger == "sqlite:////srv/dedup/ledger.db" and cfg.http_port == 10926
    pg = DedupConfig.from_env(env={"FERRY_DEDUP_LEDGER_URL": "postgresql://u@db:5432/app"})
    assert pg.ledger == "postgresql://u@db:5432/app"
    with pytest.raises(ValueError, match="ledger_url"):
        DedupConfig.from_env(env={"FERRY_DEDUP_LEDGER_URL": "mysql://db/app"})


def test_the_scheduled_window_must_cover_interval_and_grace() -> None:
    """A shorter window would leave messages that are never judged after their grace."""
    with pytest.raises(ValueError, match="reconcile_window_ms"):
        DedupConfig.from_env(env={"FERRY_DEDUP_RECONCILE_INTERVAL_S": "600",
                                  "FERRY_DEDUP_RECONCILE_WINDOW_MS": "600000"})


def test_reports_are_kept_newest_first_up_to_the_limit(tmp_path: Path) -> None:
    store = ReportStore(tmp_path / "reports", max_reports=3)
    store.open()
    for i in range(5):
        store.save({"id": f"{1_700_000_000_000 + i:013d}-abcdef", "counts": {"n": i},
                    "samples": {"missing": []}})
    listed, total = store.list(10)
    assert total == 3 and [r["counts"]["n"] for r in listed] == [4, 3, 2]
    assert all("samples" not in r for r in listed)
    assert store.get("1700000000004-abcdef")["samples"] == {"missing": []}
    assert store.get("1700000000000-abcdef") is None       # pruned
    assert store.get("../../etc/passwd") is None           # not a report id


def _table(heading: str) -> list[dict[str, str]]:
    lines = DOC.read_text(encoding="utf-8").splitlines()
    rows: list[list[str]] = []
    for line in lines[lines.index(heading) + 1:]:
        if line.startswith("#"):
            break
        if line.startswith("|"):
            rows.append([c.strip() for c in line.strip().strip("|").split("|")])
        elif rows:
            break
    return [dict(zip(rows[0], r, strict=True)) for r in rows[2:]]


def test_every_setting_is_documented_with_its_default() -> None:
    rows = {r["variable"].strip("`"): r["default"] for r in _table("### dedup configuration")}
    for f in dataclasses.fields(DedupConfig):
        # `auth` is the one switch every service shares: FERRY_AUTH
        name = "FERRY_AUTH" if f.name == "auth" else ENV_PREFIX + f.name.upper()
        assert name in rows, name
        documented = re.match(r"`([^`]*)`", rows[name])
        assert documented is not None and documented.group(1) == str(f.default), name
    assert len(rows) == len(dataclasses.fields(DedupConfig))


def test_every_report_section_is_documented() -> None:
    text = DOC.read_text(encoding="utf-8")
    for name in ("recorded", "stored", "ledger_rows", *SECTIONS):
        assert f"`{name}`" in text, name


def test_ferry_dedup_commands_have_help() -> None:
    for action in ([], ["reconcile"], ["reports"], ["lookup"]):
        done = subprocess.run([sys.executable, "-m", "ferry.cli.main", "dedup", *action,
                               "--help"], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0 and "usage: ferry dedup" in done.stdout, done.stderr


def test_the_service_has_help() -> None:
    done = subprocess.run([sys.executable, "-m", "ferry_dedup", "--help"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "FERRY_DEDUP_" in done.stdout, done.stderr
