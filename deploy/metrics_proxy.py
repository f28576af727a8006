"""Prometheus's way into Ferry's `/metrics` with auth on: a proxy that signs the scrapes.

With FERRY_AUTH=on every service's `GET /metrics` needs a signed request (admin
`read`; the console a login), and Prometheus cannot sign Ferry's requests. This
proxy runs under an identity of its own (`svc-metrics` in
deploy/docker-compose.yml, admin `read` only) and answers

    GET /metrics?target=broker-a:10920

with that service's `GET /metrics`, fetched signed (the multi-target exporter
pattern of Prometheus's blackbox exporter: the scrape config names the service
as the target and relabels the address to this proxy; deploy/prometheus/
prometheus.yml). Only the targets given at start are scraped (`--targets`,
`--console`): anything else is refused with 400, so the proxy lends its identity
to nothing but reading metrics. A console target is read with a console session:
the proxy logs in with its identity's secret (`POST /console/login`) on its
first scrape and again whenever the session has ended. A service that refuses
or does not answer gives a 502 with the reason (Prometheus: `up` 0 and the
reason in its targets page). `GET /healthz` answers 200 while the proxy serves.

With no identity in the environment (FERRY_ACCESS_KEY / FERRY_SECRET_KEY) it
forwards unsigned, for a mesh with auth off. See docs/metrics.md.
"""
from __future__ import annotations

import argparse
import sys

import aiohttp
from aiohttp import web
from ferry.auth.credentials import Credentials
from ferry.auth.http import client_session

#: The query parameter that names the service to scrape (host:port of its HTTP API).
TARGET_PARAM = "target"
#: The console's session cookie and login form (ferry_console/login.py).
CONSOLE_COOKIE = "ferry_console_session"
CONSOLE_LOGIN_PATH = "/console/login"
#: A scrape that takes longer is a failure (Prometheus's own timeout is 10 s).
UPSTREAM_TIMEOUT_S = 9.0
#: The largest metrics document passed on (a broker at its label cap is far below).
MAX_METRICS_BYTES = 32 * 1024 * 1024


class UpstreamError(Exception):
    """The service did not give its metrics; the message says why."""


class MetricsProxy:
    """Fetches the metrics of the allowed targets, signed with `credentials` when given."""

    def __init__(self, credentials: Credentials | None, targets: frozenset[str],
                 consoles: frozenset[str]) -> None:
        self.credentials = credentials
        self.consoles = consoles
        self.allowed = targets | consoles
        self._sessions: dict[str, str] = {}   # console target -> its session cookie
        self._http: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        self._http = client_session(self.credentials,
                                    timeout=aiohttp.ClientTimeout(total=UPSTREAM_TIMEOUT_S),
                                    cookie_jar=aiohttp.DummyCookieJar())

    async def stop(self) -> None:
        if self._http is not None:
            await self._http.close()

    async def scrape(self, target: str) -> tuple[str, bytes]:
        """The content type and body of `target`'s `GET /metrics`; UpstreamError if none."""
        try:
            if target in self.consoles and self.credentials is not None:
                return await self._scrape_console(target)
            return await self._get(target, {})
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise UpstreamError(f"{target} did not answer: {exc!r}") from None

    async def _get(self, target: str, headers: dict[str, str]) -> tuple[str, bytes]:
        assert self._http is not None, "start() first"
        async with self._http.get(f"http://{target}/metrics", headers=headers,
                                  allow_redirects=False) as resp:
            body = await resp.content.read(MAX_METRICS_BYTES + 1)
            if len(body) > MAX_METRICS_BYTES:
                raise UpstreamError(f"{target}: metrics larger than {MAX_METRICS_BYTES} bytes")
            if resp.status != 200:
                raise UpstreamError(f"{target} answered {resp.status}: "
                                    f"{body[:300].decode('utf-8', 'replace')}")
            return resp.headers.get("Content-Type", "text/plain"), body

    async def _scrape_console(self, target: str) -> tuple[str, bytes]:
        """The console's metrics need a session: log in when there is none or it ended."""
        cookie = self._sessions.get(target)
        if cookie is not None:
            try:
                return await self._get(target, {"Cookie": f"{CONSOLE_COOKIE}={cookie}"})
            except UpstreamError as exc:
                if " answered 401" not in str(exc):
                    raise
        cookie = self._sessions[target] = await self._log_in(target)
        return await self._get(target, {"Cookie": f"{CONSOLE_COOKIE}={cookie}"})

    async def _log_in(self, target: str) -> str:
        assert self._http is not None and self.credentials is not None
        form = {"access_key": self.credentials.access_key,
                "secret": self.credentials.secret_key, "next": "/console"}
        async with self._http.post(f"http://{target}{CONSOLE_LOGIN_PATH}", data=form,
                                   allow_redirects=False) as resp:
            morsel = resp.cookies.get(CONSOLE_COOKIE)
            if resp.status != 303 or morsel is None or not morsel.value:
                raise UpstreamError(f"{target} refused the login of "
                                    f"{self.credentials.access_key} ({resp.status})")
            return morsel.value


PROXY = web.AppKey("proxy", MetricsProxy)


async def get_metrics(request: web.Request) -> web.Response:
    proxy = request.app[PROXY]
    target = request.query.get(TARGET_PARAM, "")
    if target not in proxy.allowed:
        return web.Response(status=400, text=f"target {target[:100]!r} is not one this proxy "
                            f"scrapes: {', '.join(sorted(proxy.allowed))}\n")
    try:
        content_type, body = await proxy.scrape(target)
    except UpstreamError as exc:
        return web.Response(status=502, text=f"{exc}\n")
    return web.Response(body=body, headers={"Content-Type": content_type})


async def get_healthz(request: web.Request) -> web.Response:
    return web.Response(text="ok\n")


def build_app(proxy: MetricsProxy) -> web.Application:
    app = web.Application()
    app[PROXY] = proxy
    app.router.add_get("/metrics", get_metrics)
    app.router.add_get("/healthz", get_healthz)

    async def lifecycle(app: web.Application):  # type: ignore[no-untyped-def]
        await proxy.start()
        yield
        await proxy.stop()

    app.cleanup_ctx.append(lifecycle)
    return app


def _host_ports(text: str) -> frozenset[str]:
    return frozenset(t.strip() for t in text.split(",") if t.strip())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--listen", default="0.0.0.0:9100", help="host:port to serve on")
    p.add_argument("--targets", default="", help="host:port,... of the services to scrape")
    p.add_argument("--console", default="", help="host:port,... of consoles (read after a login)")
    args = p.parse_args(argv)
    host, _, port = args.listen.rpartition(":")
    proxy = MetricsProxy(Credentials.from_env(), _host_ports(args.targets),
                         _host_ports(args.console))
    if not proxy.allowed:
        p.error("no targets: give --targets and/or --console")
    web.run_app(build_app(proxy), host=host or "0.0.0.0", port=int(port), print=None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
