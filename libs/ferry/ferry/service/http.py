"""The HTTP side of every Ferry service: one aiohttp app with the kit's routes, and its server.

`service_app` makes the application: the request limits (`HttpGuard`), the
JSON error middleware, the auth middleware when auth is on, and the routes
every service answers the same way:

- `GET /healthz`: 200 while the process serves HTTP;
- `GET /readyz`: 200 `{"status": "ready", ...}` once the service says so,
  else 503 with the JSON error body (BusyError);
- `GET /openapi.json`: the service's document (with the signature scheme
  and 401/403 when auth is on);
- `GET /v1/stats` (when the service has statistics): its document plus the
  HTTP limits and their refusal counts;
- `GET /metrics`: the Prometheus text of the app's `Metrics` (`app[METRICS]`,
  where the service registers its instruments; the kit's own count the HTTP
  limits' and the auth's refusals). With auth on it is a route like the others:
  the service's route table says who may read it.

The service then adds its own routes. `HttpServer` runs the app on its port
(TLS from FERRY_<SERVICE>_TLS_* / FERRY_TLS_*), with the limits read from
FERRY_<SERVICE>_HTTP_*.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Middleware

from ferry.errors import BusyError
from ferry.service.auth import HttpAuth, server_ssl
from ferry.service.errors import json_response
from ferry.service.limits import MAX_HTTP_BODY_BYTES, HttpGuard, HttpLimits
from ferry.service.metrics import CONTENT_TYPE, Metrics, Reading
from ferry.service.openapi import document_auth

Json = Mapping[str, Any]
#: The app's Metrics: services add their instruments to it.
METRICS = web.AppKey("metrics", Metrics)


def service_app(guard: HttpGuard | None, errors: Middleware, document: dict[str, Any], *,
                ready: Callable[[], bool], not_ready: str, max_body_bytes: int = MAX_HTTP_BODY_BYTES,
                ready_fields: Callable[[], Json] | None = None,
                stats: Callable[[], Json] | None = None, limits_key: str = "limits",
                auth: HttpAuth | None = None,
                middlewares: Sequence[Middleware] = ()) -> web.Application:
    """An app with the kit's middlewares and routes (module docstring); `middlewares` run
    after the error and auth ones. Without `guard` (a test's app), the default limits
    with `max_body_bytes`. The metrics' service name is the document's title less "ferry-"."""
    guard = guard or HttpGuard(HttpLimits(max_body_bytes=max_body_bytes))
    chain = [errors, *([auth.middleware] if auth is not None else []), *middlewares]
    app = guard.application(chain)
    served = document_auth(document) if auth is not None else document

    async def healthz(_: web.Request) -> web.Response:
        return json_response({"status": "ok"})

    async def readyz(_: web.Request) -> web.Response:
        if not ready():
            raise BusyError(not_ready)
        return json_response({"status": "ready", **(ready_fields() if ready_fields else {})})

    async def openapi(_: web.Request) -> web.Response:
        return json_response(served)

    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/openapi.json", openapi)
    app[METRICS] = kit_metrics(str(document["info"]["title"]).removeprefix("ferry-"), guard, auth)

    async def get_metrics(request: web.Request) -> web.Response:
        return web.Response(body=request.app[METRICS].render(), headers={"Content-Type": CONTENT_TYPE})

    async def stop_metrics(app: web.Application) -> None:
        app[METRICS].shutdown()

    app.router.add_get("/metrics", get_metrics)
    app.on_cleanup.append(stop_metrics)
    if stats is not None:
        async def get_stats(_: web.Request) -> web.Response:
            return json_response({**stats(), limits_key: guard.as_json()})

        app.router.add_get("/v1/stats", get_stats)
    return app


def kit_metrics(service: str, guard: HttpGuard, auth: HttpAuth | None) -> Metrics:
    """A service's Metrics with the kit's instruments: HTTP requests refused by the limits
    (per reason) and by the auth (per reason, `ferry.auth.refused`)."""
    metrics = Metrics(service)
    metrics.observe("ferry.http.refused", "counter", "{request}",
                    "HTTP requests and connections refused by the limits, per reason",
                    lambda: [(n, {"reason": reason}) for reason, n in guard.counts.items()])
    if auth is not None:
        metrics.observe("ferry.auth.refused", "counter", "{request}",
                        "Requests refused by the auth, per transport and reason",
                        lambda: auth_refusals(auth.stats(), "http"))
    return metrics


def auth_refusals(stats: Mapping[str, Any], transport: str) -> Reading:
    """The auth refusal counters of an auth's stats, per reason, for `ferry.auth.refused`."""
    return [(stats.get(f"refused_{reason}", 0), {"transport": transport, "reason": reason})
            for reason in ("unauthenticated", "denied")]


class HttpServer:
    """Runs one service's app: `guard` for its limits, `start(app, host, port)`, `stop()`."""

    def __init__(self, service: str, env_prefix: str, max_body_bytes: int = MAX_HTTP_BODY_BYTES,
                 *, tls: bool = True) -> None:
        self.service = service
        self.guard = HttpGuard(HttpLimits.from_env(env_prefix, max_body_bytes))
        self.tls = tls
        self.port = 0
        self._runner: web.AppRunner | None = None

    async def start(self, app: web.Application, host: str, port: int,
                    **runner_kwargs: Any) -> int:
        """Serve `app` on host:port (0: a free port); the port listened on."""
        self._runner = self.guard.runner(app, access_log=None, **runner_kwargs)
        await self._runner.setup()
        # FERRY_TLS_CERT / FERRY_TLS_KEY (or FERRY_<SERVICE>_TLS_*): HTTPS only.
        site = await self.guard.start_site(
            self._runner, host, port, ssl_context=server_ssl(self.service) if self.tls else None)
        self.port = site.port
        return self.port

    async def stop(self) -> None:
        """Stop accepting, let the requests in flight finish, close (nothing if not started)."""
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()
