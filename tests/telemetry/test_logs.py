"""Service logs are JSON lines whose extra fields an operator can filter on."""
from __future__ import annotations

import json
import logging

from ferry.telemetry.logs import JsonFormatter


def test_extra_fields_become_keys_and_exceptions_are_kept() -> None:
    record = logging.makeLogRecord({"name": "ferry.broker", "levelname": "WARNING",
                                    "msg": "bad frame from %s", "args": ("1.2.3.4:5",),
                                    "conn": 7, "code": 4})
    try:
        raise ValueError("boom")
    except ValueError:
        import sys
        record.exc_info = sys.exc_info()
    line = JsonFormatter().format(record)
    obj = json.loads(line)
    assert "\n" not in line
    assert obj["msg"] == "bad frame from 1.2.3.4:5"
    assert obj["level"] == "WARNING" and obj["logger"] == "ferry.broker"
    assert obj["conn"] == 7 and obj["code"] == 4
    assert "ValueError: boom" in obj["exc"]
    assert obj["ts"].endswith("Z")
