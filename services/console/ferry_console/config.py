"""The console's configuration: one frozen value built from FERRY_CONSOLE_* variables.

`ConsoleConfig.from_env()` reads the environment; command-line flags (see
`__main__`) arrive as `overrides` and win. The table is in docs/console.md.
"""
from __future__ import annotations

from dataclasses import dataclass

from ferry.service.config import ServiceConfig, check_service

from ferry_console.proxies import COOKIE_SECURE_MODES, parse_networks

ENV_PREFIX = "FERRY_CONSOLE_"
MAX_LIST_ROWS = 1000  # no page lists more messages than this
MAX_PREVIEW_BYTES = 64 * 1024
MAX_SESSIONS = 100_000  # each holds a user's clients in memory
MAX_CHART_POINTS = 10_000   # samples kept per chart series
MAX_CHART_SERIES = 100_000  # chart series held at once (about 100 bytes a point)


@dataclass(frozen=True)
class ConsoleConfig(ServiceConfig):
    """Everything the console needs to start; defaults run on one machine.

    `delay_scheduler`, `txn_checker` and `dedup` are HTTP addresses (h:p, or
    h:p,h:p to try in turn) whose /v1/stats the services page shows; empty
    leaves that service out.
    """

    ENV_PREFIX = ENV_PREFIX

    http_port: int = 10927
    namesrv: str = "127.0.0.1:9876"
    delay_scheduler: str = "127.0.0.1:10922"
    txn_checker: str = "127.0.0.1:10923"
    dedup: str = "127.0.0.1:10926"
    request_timeout_ms: int = 5000     # one broker or service call
    preview_bytes: int = 4096          # of a message body on its page
    list_rows: int = 100               # messages per search or DLQ page
    rate_interval_ms: int = 10_000     # rates and charts: the brokers sampled this often
    chart_points: int = 360            # samples kept per chart series (1 h at 10 s)
    chart_series: int = 1000           # series held at once; past it the stalest is dropped
    # Charts from this Prometheus (its HTTP API, query_range) instead of the console's own
    # samples; empty: own samples only (prometheus.py).
    prometheus_url: str = ""
    # With auth on (FERRY_AUTH=on) every page and action needs a login, and acts with the
    # logged-in user's own rights (sessions.py).
    session_ttl_ms: int = 8 * 3_600_000   # a login lasts this long
    max_sessions: int = 1000              # past this many a new login is refused
    max_sessions_per_identity: int = 10   # past this many an identity's own oldest ends
    # Failed logins allowed per client address / per access key within login_window_ms
    # (from the first failure); past it logins from there / for it get 429 (throttle.py).
    login_failures_per_address: int = 10
    login_failures_per_identity: int = 20
    login_window_ms: int = 60_000
    # Behind a reverse proxy (proxies.py): `Secure` on the session cookie auto|on|off, and
    # the proxies (IPs or CIDRs) whose X-Forwarded-Proto / X-Forwarded-For are believed.
    cookie_secure: str = "auto"
    trusted_proxies: str = ""

    def __post_init__(self) -> None:
        check_service(self, ENV_PREFIX)
        if self.preview_bytes > MAX_PREVIEW_BYTES:
            raise ValueError(f"preview_bytes cannot exceed {MAX_PREVIEW_BYTES}")
        if self.max_sessions > MAX_SESSIONS:
            raise ValueError(f"max_sessions cannot exceed {MAX_SESSIONS}")
        if self.chart_points > MAX_CHART_POINTS or self.chart_series > MAX_CHART_SERIES:
            raise ValueError(f"chart_points cannot exceed {MAX_CHART_POINTS}, chart_series "
                             f"{MAX_CHART_SERIES}")
        for name in ("rate_interval_ms", "chart_points", "chart_series", "max_sessions",
                     "max_sessions_per_identity", "login_failures_per_address",
                     "login_failures_per_identity", "login_window_ms"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        if self.cookie_secure not in COOKIE_SECURE_MODES:
            raise ValueError(f"cookie_secure must be one of {', '.join(COOKIE_SECURE_MODES)}, "
                             f"not {self.cookie_secure!r}")
        parse_networks(self.trusted_proxies)
        if self.prometheus_url and not self.prometheus_url.startswith(("http://", "https://")):
            raise ValueError("prometheus_url must be an http:// or https:// URL (or empty), not "
                             f"{self.prometheus_url!r}")
        if self.list_rows > MAX_LIST_ROWS:
            raise ValueError(f"list_rows cannot exceed {MAX_LIST_ROWS}")
