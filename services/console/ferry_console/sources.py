"""Where the console's pages read from: namesrv, the brokers and the services, over the network.

The console holds no state of its own beyond the topic-rate samples: every
page asks namesrv (`/v1/brokers`, `/v1/topics`, `/v1/groups`), each broker's
`/v1/stats` (at the `http_addr` it registered), the brokers' wire protocol
through `ferry.Admin` (message queries, DLQ), and the services' `/v1/stats`.
A source that does not answer is shown as such; it never fails a page.
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

import aiohttp
from ferry import Admin
from ferry.auth.credentials import Credentials, service_credentials
from ferry.auth.http import client_session
from ferry.client.core.namesrv import NamesrvClient, parse_namesrv

from ferry_console.config import ConsoleConfig

log = logging.getLogger("ferry_console")


@dataclass
class BrokerView:
    """One registered broker member and its `/v1/stats` (None: it did not answer)."""

    info: dict[str, Any]
    stats: dict[str, Any] | None

    @property
    def name(self) -> str:
        return str(self.info.get("name", ""))

    @property
    def role(self) -> str:
        repl = (self.stats or {}).get("replication") or {}
        return str(repl.get("role") or self.info.get("role") or "master")


class Sources:
    """The clients a page uses: Admin (wire), namesrv (HTTP) and one HTTP session.

    Every request is signed with `credentials`: a logged-in user's for their
    sources (sessions.py); by default the console's own identity
    (FERRY_CONSOLE_ACCESS_KEY / _SECRET_KEY, else FERRY_ACCESS_KEY / ...; none:
    unsigned), which the shared sources use (auth off, and the rate sampler).
    """

    def __init__(self, config: ConsoleConfig, credentials: Credentials | None = None) -> None:
        self.config = config
        self.credentials = credentials if credentials is not None else service_credentials(
            "console")
        self.admin = Admin(namesrv=config.namesrv, request_timeout_ms=config.request_timeout_ms,
                           credentials=self.credentials)
        self.namesrv = NamesrvClient(config.namesrv, credentials=self.credentials)
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        await self.admin.start()
        await self.namesrv.start()
        timeout = aiohttp.ClientTimeout(total=self.config.request_timeout_ms / 1000)
        self._session = client_session(self.credentials, timeout=timeout)

    async def stop(self) -> None:
        if self._session is not None:
            await self._session.close()
        await self.namesrv.close()
        await self.admin.stop()

    async def get_json(self, addrs: str, path: str) -> dict[str, Any] | None:
        """GET `path` on the first of `addrs` (h:p[,h:p]) that answers 200 with a JSON object."""
        return (await self.read_json(addrs, path))[0]

    async def read_json(self, addrs: str, path: str) -> tuple[dict[str, Any] | None, str]:
        """`get_json` and, when nothing answered, why: "unreachable", or "not permitted"
        when a service refused this user (401/403 with auth on)."""
        if not addrs or self._session is None:
            return None, "unreachable"
        why = "unreachable"
        for base in parse_namesrv(addrs):
            try:
                async with self._session.get(base + path) as resp:
                    if resp.status != 200:
                        log.debug("GET %s%s answered %s", base, path, resp.status)
                        if resp.status in (401, 403):
                            why = f"not permitted (HTTP {resp.status})"
                        continue
                    doc = await resp.json(content_type=None)
                    if isinstance(doc, dict):
                        return doc, ""
            except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                log.debug("GET %s%s failed: %s", base, path, exc)
        return None, why

    async def brokers(self) -> list[BrokerView]:
        """Every registered broker member with its stats, by group name then id."""
        listed = await self.namesrv.call("GET", "/v1/brokers")
        infos = [b for b in listed.get("brokers", []) if isinstance(b, dict)]
        infos.sort(key=lambda b: (str(b.get("name")), int(b.get("id", 0))))
        stats = await asyncio.gather(*(self.get_json(str(b.get("http_addr") or ""), "/v1/stats")
                                       for b in infos))
        return [BrokerView(info, st) for info, st in zip(infos, stats, strict=True)]

    async def topics(self) -> list[dict[str, Any]]:
        return await self.admin.list_topics()

    async def groups(self) -> list[dict[str, Any]]:
        return await self.admin.list_groups()

    async def group_config(self, name: str) -> dict[str, Any] | None:
        for group in await self.groups():
            if group.get("name") == name:
                return group
        return None
