"""Reconciliation reports kept on disk: one JSON file per report under data_dir/reports.

A report's id starts with its start time (13 digits, ms), so file names sort
by age. Each is written atomically (temp file, fsync, rename); after a save
only the newest `max_reports` are kept. Listing reads the summaries (every
field but the samples) newest first.
"""
from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

from ferry.atomic_file import replace_durably

log = logging.getLogger("ferry_dedup")

REPORT_ID = re.compile(r"[0-9]{13}-[0-9a-f]{6}")
SUFFIX = ".json"


class ReportStore:
    """The reports directory."""

    def __init__(self, directory: Path, max_reports: int) -> None:
        self.directory = directory
        self.max_reports = max_reports

    def open(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        for tmp in self.directory.glob("*.tmp"):   # a save cut short by a crash
            tmp.unlink(missing_ok=True)

    def _ids(self) -> list[str]:
        """Report ids, newest first."""
        names = (p.name[:-len(SUFFIX)] for p in self.directory.glob("*" + SUFFIX))
        return sorted((n for n in names if REPORT_ID.fullmatch(n)), reverse=True)

    def save(self, report: dict[str, Any]) -> None:
        """Write `report` (its "id" names the file), then drop the oldest beyond the limit."""
        payload = json.dumps(report, separators=(",", ":")).encode()
        replace_durably(self.directory / f"{report['id']}{SUFFIX}", payload)
        for old in self._ids()[self.max_reports:]:
            (self.directory / f"{old}{SUFFIX}").unlink(missing_ok=True)

    def get(self, report_id: str) -> dict[str, Any] | None:
        """The whole report, or None when there is no such id (or it was pruned)."""
        if not REPORT_ID.fullmatch(report_id):
            return None
        try:
            data = json.loads((self.directory / f"{report_id}{SUFFIX}").read_bytes())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            log.warning("report %s unreadable: %s", report_id, exc)
            return None
        return data if isinstance(data, dict) else None

    def list(self, limit: int) -> tuple[list[dict[str, Any]], int]:
        """Summaries (no samples) of the newest `limit` reports, and how many are kept."""
        ids = self._ids()
        out = []
        for report_id in ids[:limit]:
            report = self.get(report_id)
            if report is not None:
                out.append({k: v for k, v in report.items() if k != "samples"})
        return out, len(ids)
