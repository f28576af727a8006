"""Tracing settings from the environment, read once per process by `setup_tracing`.

| variable | default | meaning |
|---|---|---|
| `FERRY_TRACING` | `on` | `off`: no tracer provider, no span anywhere in the process |
| `FERRY_TRACE_SAMPLE_RATIO` | `0.001` | fraction of messages a producer traces (0: only forced ones) |
| `FERRY_TRACE_DIR` | unset | write spans as JSON lines to `<dir>/<service>-<pid>.jsonl` |
| `OTEL_EXPORTER_OTLP_ENDPOINT` | unset | also export over OTLP/HTTP to that endpoint |
| `FERRY_TRACE_TOPIC` | `on` | write spans to the `%TRACE%` topic (needs a known namesrv) |
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from ferry.env import parse_bool
from ferry.errors import FerryError

DEFAULT_SAMPLE_RATIO = 0.001   # 1 in 1,000 messages: the cost is measured in docs/tracing.md "Cost"


class TracingConfigError(FerryError, ValueError):
    """A tracing environment variable has a value that does not parse."""


@dataclass(frozen=True, slots=True)
class TracingSettings:
    """What `setup_tracing` builds: on/off, the sampling ratio and the exporters."""

    enabled: bool = True
    sample_ratio: float = DEFAULT_SAMPLE_RATIO
    trace_dir: str | None = None
    otlp_endpoint: str | None = None
    trace_topic: bool = True

    def __post_init__(self) -> None:
        if not 0.0 <= self.sample_ratio <= 1.0:
            raise TracingConfigError(
                f"FERRY_TRACE_SAMPLE_RATIO must be between 0 and 1, got {self.sample_ratio}")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> TracingSettings:
        """The settings from the environment (or `env`); a bad value raises TracingConfigError."""
        env = os.environ if env is None else env

        def flag(name: str, default: bool) -> bool:
            raw = env.get(name, "").strip()
            return default if not raw else parse_bool(raw, name, TracingConfigError)

        raw_ratio = env.get("FERRY_TRACE_SAMPLE_RATIO", "").strip()
        try:
            ratio = float(raw_ratio) if raw_ratio else DEFAULT_SAMPLE_RATIO
        except ValueError:
            raise TracingConfigError(
                f"FERRY_TRACE_SAMPLE_RATIO must be a number, got {raw_ratio!r}") from None
        return cls(enabled=flag("FERRY_TRACING", True), sample_ratio=ratio,
                   trace_dir=env.get("FERRY_TRACE_DIR", "").strip() or None,
                   otlp_endpoint=env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip() or None,
                   trace_topic=flag("FERRY_TRACE_TOPIC", True))
