"""HTTP client for namesrv, and the per-topic route cache producers and consumers share.

Several namesrv addresses may be given ("h:p,h:p"); a request that fails to
reach one (connection error, 5xx) is tried on the next. Error bodies
(`{"error": {"code", "type", "message"}}`) become `ferry.errors` classes.
Routes are cached per topic for `refresh_interval_ms` (30 s) and fetched
again early when a caller reports an error with `invalidate()`, at most once
per `MIN_REFRESH_INTERVAL_MS`: during a failover every failed send and pull
invalidates, and namesrv must not get one request per failure.

A broker group's entry names its `master` (None while the group fails over:
the old master's lease ended and no slave has won the election yet) and its
`slaves`; consumers read from a slave then (see `replicas`).
"""
from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Self
from urllib.parse import quote

import aiohttp

from ferry.auth.credentials import Credentials
from ferry.auth.http import client_session
from ferry.auth.tls import ENV_TLS_CA
from ferry.errors import (
    ConnectionLostError,
    FerryError,
    RequestTimeoutError,
    TopicNotFoundError,
    error_for_code,
)
from ferry.names import Perm

DEFAULT_NAMESRV = "127.0.0.1:9876"
ROUTE_REFRESH_INTERVAL_MS = 30_000
#: An invalidated route is fetched again no sooner than this after its last fetch.
MIN_REFRESH_INTERVAL_MS = 200
#: Message priorities 0..PRIORITIES-1 (3 highest), mapped onto a topic's priority levels.
PRIORITIES = 4


@dataclass(frozen=True, slots=True)
class BrokerRoute(Perm):
    """One broker's share of a topic: its name, master wire address and queue count."""

    name: str
    cluster: str
    master: str | None
    queues: int
    perm: str = "rw"
    slaves: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class TopicRoute:
    """Where a topic lives: the brokers serving it and their queues.

    `priority_levels` > 1 splits each broker's queues into levels (see `queue_level`).
    """

    topic: str
    type: str
    perm: str
    brokers: tuple[BrokerRoute, ...]
    priority_levels: int = 1

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TopicRoute:
        brokers = []
        for b in data.get("brokers") or ():
            master = b.get("master")
            if isinstance(master, dict):  # tolerate {"addr": ...} shaped masters
                master = master.get("addr")
            slaves = tuple(s.get("addr", "") if isinstance(s, dict) else str(s)
                           for s in b.get("slaves") or ())
            brokers.append(BrokerRoute(
                name=str(b["name"]), cluster=str(b.get("cluster", "")), master=master or None,
                queues=int(b.get("queues", 0)), perm=str(b.get("perm", "rw")), slaves=slaves))
        brokers.sort(key=lambda br: br.name)
        levels = data.get("priority_levels")
        return cls(topic=str(data.get("topic", "")), type=str(data.get("type", "normal")),
                   perm=str(data.get("perm", "rw")), brokers=tuple(brokers),
                   priority_levels=levels if isinstance(levels, int) and levels >= 1 else 1)

    def queue_level(self, broker: str, queue_id: int) -> int:
        """The priority level queue `queue_id` of `broker` serves: `queue_id * levels // queues`."""
        if self.priority_levels <= 1:
            return 0
        for b in self.brokers:
            if b.name == broker:
                return queue_id * self.priority_levels // b.queues if b.queues > 0 else 0
        return 0

    def level_of_priority(self, priority: int) -> int:
        """The level a message of `priority` (0..3, 3 highest) goes to: `priority * levels // 4`."""
        return priority * self.priority_levels // PRIORITIES

    def broker_addr(self, name: str) -> str | None:
        """The master's wire address of broker group `name` (None: no master now)."""
        for b in self.brokers:
            if b.name == name:
                return b.master
        return None

    def broker(self, name: str) -> BrokerRoute | None:
        """Broker group `name`'s entry, or None when it does not serve this topic."""
        for b in self.brokers:
            if b.name == name:
                return b
        return None

    def writable_queues(self) -> list[tuple[str, int]]:
        """(broker name, queue id) of every queue a producer may send to, sorted."""
        if "w" not in self.perm:
            return []
        return [(b.name, q) for b in self.brokers if b.writable and b.master
                for q in range(b.queues)]

    def key_queues(self) -> list[tuple[str, int]]:
        """Every queue of the topic's writable brokers, sorted, whether their master is up or not.

        Ordered sends hash a key over this list, so the key keeps its queue while
        a broker is down (its sends fail) and moves only when the route itself
        changes (a broker group leaves the route, a queue count changes).
        """
        if "w" not in self.perm:
            return []
        return [(b.name, q) for b in self.brokers if b.writable for q in range(b.queues)]

    def readable_queues(self) -> list[tuple[str, int]]:
        """(broker name, queue id) of every queue a consumer may pull from, sorted.

        A group with no master but a slave stays readable (its slave serves pulls),
        so a failover does not move queues between the members of a group.
        """
        if "r" not in self.perm:
            return []
        return [(b.name, q) for b in self.brokers if b.readable and (b.master or b.slaves)
                for q in range(b.queues)]


def default_namesrv() -> str:
    """The namesrv address(es) a client uses when given none: FERRY_NAMESRV, else the default."""
    return os.environ.get("FERRY_NAMESRV", DEFAULT_NAMESRV)


def parse_namesrv(addrs: str | Sequence[str]) -> list[str]:
    """'h:p,h:p' (or a list) -> base URLs; 'http://' is added where missing, 'https://'
    when FERRY_TLS_CA is set (the mesh's HTTP APIs serve TLS then; docs/security.md)."""
    items = addrs.split(",") if isinstance(addrs, str) else list(addrs)
    scheme = "https" if os.environ.get(ENV_TLS_CA, "").strip() else "http"
    urls = []
    for item in (i.strip() for i in items):
        if not item:
            continue
        urls.append(item.rstrip("/") if "://" in item else f"{scheme}://{item}")
    if not urls:
        raise ValueError(f"no namesrv address in {addrs!r}")
    return urls


class HttpApi:
    """A Ferry HTTP API at one or more addresses ("h:p,h:p"): namesrv's, the delay
    scheduler's, the txn-checker's, the dedup service's.

    Requests are signed with `credentials` (default: FERRY_ACCESS_KEY /
    FERRY_SECRET_KEY; unsigned when those are unset); answers are JSON; an error
    body (`{"error": {"code", "type", "message"}}`) becomes its `ferry.errors`
    class, else `by_status` names the class by HTTP status (`http_error`). The
    session opens at the first call.
    """

    def __init__(self, addrs: str | Sequence[str], *, name: str, timeout_ms: int,
                 credentials: Credentials | None = None,
                 by_status: Mapping[int, type[FerryError]] | None = None) -> None:
        self.name = name
        self.urls = parse_namesrv(addrs)
        self.timeout_ms = timeout_ms
        self.credentials = credentials if credentials is not None else Credentials.from_env()
        self.by_status = by_status
        self._session: aiohttp.ClientSession | None = None
        self._preferred = 0

    async def start(self) -> None:
        if self._session is None:
            timeout = aiohttp.ClientTimeout(total=self.timeout_ms / 1000)
            self._session = client_session(self.credentials, timeout=timeout)

    async def close(self) -> None:
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def attempt(self, method: str, url: str, *, json: Any = None,
                      params: dict[str, str] | None = None) -> tuple[int, Any]:
        """One request to `url`: its HTTP status and JSON body (None when not JSON).

        RequestTimeoutError when it does not answer in `timeout_ms`,
        ConnectionLostError when it cannot be reached."""
        await self.start()
        assert self._session is not None
        try:
            async with self._session.request(method, url, json=json, params=params) as resp:
                return resp.status, await read_json(resp)
        except TimeoutError:
            raise RequestTimeoutError(f"{self.name} {url} did not answer in "
                                      f"{self.timeout_ms} ms") from None
        except aiohttp.ClientError as exc:
            raise ConnectionLostError(f"{self.name} {url} unreachable: {exc}") from None

    async def call(self, method: str, path: str, *, json: Any = None,
                   params: dict[str, str] | None = None) -> Any:
        """One API call, tried on each address in turn (from the last that answered)
        until one answers below 500; its JSON body, or its error raised."""
        last: FerryError | None = None
        n = len(self.urls)
        for i in range(n):
            idx = (self._preferred + i) % n
            url = self.urls[idx] + path
            try:
                status, data = await self.attempt(method, url, json=json, params=params)
            except (RequestTimeoutError, ConnectionLostError) as exc:
                last = exc
                continue
            if status >= 500:
                last = http_error(status, data, url, self.by_status)
                continue
            self._preferred = idx
            if status >= 400:
                raise http_error(status, data, url, self.by_status)
            return data
        assert last is not None
        raise last


class NamesrvClient(HttpApi):
    """The namesrv HTTP API (routes, topics, groups, brokers), as namesrv requires signed
    with FERRY_AUTH=on."""

    def __init__(self, addrs: str | Sequence[str] = DEFAULT_NAMESRV, *,
                 timeout_ms: int = 5_000, credentials: Credentials | None = None) -> None:
        super().__init__(addrs, name="namesrv", timeout_ms=timeout_ms, credentials=credentials)

    async def get_route(self, topic: str, *, create: bool = False) -> TopicRoute:
        params = {"create": "1"} if create else None
        # Internal names hold '%': quoted, or the URL would carry broken escapes.
        data = await self.call("GET", "/v1/routes/" + quote(topic, safe=""), params=params)
        return TopicRoute.from_json(data)


async def read_json(resp: aiohttp.ClientResponse) -> Any:
    """The JSON body of an HTTP answer, or None when it is not JSON."""
    try:
        return await resp.json(content_type=None)
    except ValueError:
        return None


def http_error(status: int, data: Any, url: str,
               by_status: Mapping[int, type[FerryError]] | None = None) -> FerryError:
    """The Ferry error of a failed HTTP answer shaped `{"error": {"code", "type", "message"}}`.

    Without a code in the body, `by_status` (404: TopicNotFoundError unless
    given) names the class; else a plain FerryError.
    """
    err = data.get("error") if isinstance(data, dict) else None
    if isinstance(err, dict) and isinstance(err.get("code"), int):
        return error_for_code(err["code"], str(err.get("message", "")))
    cls = (by_status or _NAMESRV_BY_STATUS).get(status)
    if cls is not None:
        return cls(f"{url}: HTTP {status}: {data!r}")
    return FerryError(f"{url}: HTTP {status}: {data!r}")


_NAMESRV_BY_STATUS: Mapping[int, type[FerryError]] = {404: TopicNotFoundError}
_monotonic = time.monotonic
#: A RouteCache entry: (monotonic time its freshness counts from, the route).
RouteEntry = tuple[float, TopicRoute]


class RouteCache:
    """Topic routes by name, each kept `refresh_interval_ms` and refreshed on demand."""

    def __init__(self, client: NamesrvClient, *, create_topics: bool = False,
                 refresh_interval_ms: int = ROUTE_REFRESH_INTERVAL_MS) -> None:
        self.client = client
        self.create_topics = create_topics
        self.refresh_interval_ms = refresh_interval_ms
        self._routes: dict[str, RouteEntry] = {}
        #: topic -> (time its freshness counts from, route), for reading only: an entry is
        #: replaced whenever its route is fetched again or invalidated, so a caller may
        #: keep one and test it by identity (the producer's lanes do).
        self.entries: Mapping[str, RouteEntry] = self._routes
        self._fetched: dict[str, float] = {}   # topic -> monotonic time of its last fetch
        self._locks: dict[str, asyncio.Lock] = {}

    def cached(self, topic: str) -> TopicRoute | None:
        entry = self._routes.get(topic)
        return entry[1] if entry else None

    def fresh(self, topic: str) -> TopicRoute | None:
        """The cached route while `route(topic)` would return it without asking namesrv,
        else None: a sender's hot path looks it up without a coroutine."""
        entry = self._routes.get(topic)
        if entry is not None and _monotonic() - entry[0] < self.refresh_interval_ms / 1000:
            return entry[1]
        return None

    def invalidate(self, topic: str) -> None:
        """Make `route(topic)` ask namesrv again (after an error), rate-limited.

        The route goes stale `MIN_REFRESH_INTERVAL_MS` after its last fetch (at
        once if that is past): many failures in a row cost one namesrv request.
        """
        entry = self._routes.get(topic)
        if entry:
            fetched = self._fetched.get(topic, 0.0)
            stale_from = fetched + (MIN_REFRESH_INTERVAL_MS - self.refresh_interval_ms) / 1000
            self._routes[topic] = (min(entry[0], stale_from), entry[1])

    async def route(self, topic: str) -> TopicRoute:
        entry = self._routes.get(topic)
        if entry and time.monotonic() - entry[0] < self.refresh_interval_ms / 1000:
            return entry[1]
        async with self._locks.setdefault(topic, asyncio.Lock()):
            entry = self._routes.get(topic)
            if entry and time.monotonic() - entry[0] < self.refresh_interval_ms / 1000:
                return entry[1]
            try:
                route = await self.client.get_route(topic, create=self.create_topics)
            except TopicNotFoundError:
                self._routes.pop(topic, None)
                raise
            except FerryError:
                if entry is None:
                    raise
                # namesrv is unreachable: serve the last known route, ask again soon.
                retry_at = time.monotonic() - self.refresh_interval_ms / 1000 + 1.0
                self._routes[topic] = (retry_at, entry[1])
                return entry[1]
            now = time.monotonic()
            self._routes[topic] = (now, route)
            self._fetched[topic] = now
            return route
