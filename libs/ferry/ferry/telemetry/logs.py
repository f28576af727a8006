"""Structured logs for every Ferry service: one JSON object per line on stderr.

Fields passed with `extra={...}` become keys of the object (`conn`, `peer`,
`method`, `status`, ...), so operators filter on fields instead of parsing
sentences, and every service's lines have the same shape.
"""
from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

# Attributes every LogRecord has; anything else came from `extra=`.
_STANDARD = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """A record as JSON: ts (UTC), level, logger, msg, the extra fields, exc."""

    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        out: dict[str, Any] = {"ts": f"{ts}.{int(record.msecs):03d}Z", "level": record.levelname,
                               "logger": record.name, "msg": record.getMessage()}
        out.update((k, v) for k, v in vars(record).items()
                   if k not in _STANDARD and not k.startswith("_"))
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def setup_logging(level: str) -> None:
    """Send the root logger's records to stderr as JSON lines at `level`."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # aiohttp's own access log duplicates the services' request lines.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
