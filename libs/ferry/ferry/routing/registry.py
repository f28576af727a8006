"""The etcd registry: broker leases with keep-alive, and topic/group config.

One `EtcdRegistry` per process. A broker registers itself under
`{prefix}brokers/{cluster}/{name}/{id}` with a lease that a task keeps alive;
when the process dies the lease expires and etcd deletes the key, which is how
every namesrv learns that the broker is gone. Topic and group configs live
under `{prefix}topics/` and `{prefix}groups/` without a lease.

Writes return the etcd revision they were applied at, so that a caller can
wait until its own `RegistryCache` has seen the write (read-your-writes).
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Awaitable, Callable
from typing import TypeVar

import aetcd
import aetcd.exceptions

from ferry.errors import AlreadyExistsError
from ferry.names import validate_group, validate_topic
from ferry.routing.models import BrokerInfo, GroupConfig, TopicConfig
from ferry.tasks import cancel_and_wait

log = logging.getLogger("ferry.routing.registry")

DEFAULT_PREFIX = "/ferry/"
DEFAULT_TTL_S = 30
DEFAULT_KEEPALIVE_S = 10.0
# A keep-alive that fails (etcd down) is retried this often until the lease
# either answers again or is known to be gone.
_RETRY_S = 1.0

T = TypeVar("T")

# gRPC backs off reconnects up to two minutes by default and shares that
# back-off between channels to the same address; an etcd that comes back must
# be found again within a second or two. (Not min_reconnect_backoff_ms: gRPC
# uses it as the connect timeout, and a starting etcd accepts TCP before it
# speaks HTTP/2.)
_GRPC_OPTIONS = {
    "grpc.initial_reconnect_backoff_ms": 200,
    "grpc.max_reconnect_backoff_ms": 1000,
    "grpc.use_local_subchannel_pool": 1,
    # HTTP/2 pings find a dead connection (a watch on a partitioned etcd would
    # otherwise wait forever). etcd refuses pings more often than every 5 s.
    "grpc.keepalive_time_ms": 10_000,
    "grpc.keepalive_timeout_ms": 5_000,
    "grpc.keepalive_permit_without_calls": 1,
    "grpc.http2.max_pings_without_data": 0,
}

# Errors that mean "etcd did not answer", as opposed to a bug in the request.
EtcdUnavailable = (aetcd.exceptions.ClientError, OSError, asyncio.TimeoutError)


def parse_endpoints(endpoints: str) -> list[tuple[str, int]]:
    """Parse "host:port[,host:port...]" (an optional http:// is dropped) into pairs."""
    out: list[tuple[str, int]] = []
    for part in endpoints.split(","):
        part = part.strip()
        for scheme in ("http://", "https://"):
            part = part.removeprefix(scheme)
        if not part:
            continue
        host, sep, port = part.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"invalid etcd endpoint {part!r}: expected host:port")
        out.append((host, int(port)))
    if not out:
        raise ValueError(f"no etcd endpoint in {endpoints!r}")
    return out


class EtcdRegistry:
    """Reads and writes Ferry's routing keys in etcd; keeps one broker's lease alive."""

    def __init__(self, endpoints: str = "127.0.0.1:2379", prefix: str = DEFAULT_PREFIX,
                 timeout_s: float = 5.0) -> None:
        self.endpoints = parse_endpoints(endpoints)
        self.prefix = prefix if prefix.endswith("/") else prefix + "/"
        self.timeout_s = timeout_s
        self._endpoint_index = 0
        self._client: aetcd.Client | None = None
        self._broker: BrokerInfo | None = None
        self._ttl_s = DEFAULT_TTL_S
        self._keepalive_s = DEFAULT_KEEPALIVE_S
        self._lease_id: int | None = None
        self._keepalive_task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        #: How many times the broker registered again after losing its lease.
        self.reregistrations = 0

    # -- connection ---------------------------------------------------------

    async def start(self) -> None:
        """Connect to the first endpoint that answers; raises if none does."""
        last: BaseException | None = None
        for _ in self.endpoints:
            client = self._new_client()
            try:
                await client.connect()
                await asyncio.wait_for(client.status(), self.timeout_s)
                self._client = client
                return
            except EtcdUnavailable as exc:
                last = exc
                with contextlib.suppress(Exception):
                    await client.close()
                self._endpoint_index = (self._endpoint_index + 1) % len(self.endpoints)
        raise ConnectionError(f"no etcd endpoint answers ({self.endpoints}): {last}")

    def _new_client(self) -> aetcd.Client:
        host, port = self.endpoints[self._endpoint_index]
        return aetcd.Client(host=host, port=port, timeout=max(1, round(self.timeout_s)),
                            options=_GRPC_OPTIONS)

    async def failover(self, failed: aetcd.Client | None = None) -> None:
        """Drop the current connection and use the next endpoint (the same one if alone).

        `failed` is the client that failed: when another task already moved
        on from it, nothing is done, so two failing tasks skip one endpoint, not two.
        Watches on the old connection end; their owners (RegistryCache) reload.
        """
        if failed is not None and failed is not self._client:
            return
        old, self._client = self._client, None
        if old is not None:
            with contextlib.suppress(Exception):
                await old.close()
        self._endpoint_index = (self._endpoint_index + 1) % len(self.endpoints)
        self._client = self._new_client()

    @property
    def client(self) -> aetcd.Client:
        """The aetcd client (for RegistryCache's watch); only valid between start() and stop()."""
        if self._client is None:
            raise RuntimeError("EtcdRegistry is not started")
        return self._client

    async def stop(self) -> None:
        """Stop the keep-alive and close the connection.

        This does not unregister: the broker's key stays until its lease
        expires. A clean shutdown calls `unregister_broker()` first.
        """
        await self._stop_keepalive()
        if self._client is not None:
            with contextlib.suppress(Exception):
                # Bounded: a close stuck on a dead channel must not hang a shutdown.
                await asyncio.wait_for(self._client.close(), 5.0)
            self._client = None

    async def __aenter__(self) -> EtcdRegistry:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- keys ---------------------------------------------------------------

    def broker_key(self, info: BrokerInfo) -> bytes:
        return f"{self.prefix}brokers/{info.cluster}/{info.name}/{info.broker_id}".encode()

    def topic_key(self, name: str) -> bytes:
        return f"{self.prefix}topics/{name}".encode()

    def group_key(self, name: str) -> bytes:
        return f"{self.prefix}groups/{name}".encode()

    # -- brokers ------------------------------------------------------------

    async def register_broker(self, info: BrokerInfo, ttl_s: int = DEFAULT_TTL_S,
                              keepalive_s: float = DEFAULT_KEEPALIVE_S) -> None:
        """Register `info` under a fresh lease and keep the lease alive in a task.

        If the lease is ever lost (etcd lost it, or this process paused past
        the TTL) the task grants a new one and registers again. The put is
        unconditional: a broker restarted after a crash takes over the key its
        previous life left behind.
        """
        if ttl_s < 1 or keepalive_s <= 0 or keepalive_s >= ttl_s:
            raise ValueError(f"need 0 < keepalive_s < ttl_s, got {keepalive_s=} {ttl_s=}")
        ttl_s = math.ceil(ttl_s)  # etcd grants whole seconds
        await self._stop_keepalive()
        self._broker, self._ttl_s, self._keepalive_s = info, ttl_s, keepalive_s
        await self._register()
        self._keepalive_task = asyncio.create_task(self._keepalive_loop(),
                                                   name=f"etcd-keepalive-{info.name}")

    async def update_broker(self, info: BrokerInfo) -> None:
        """Replace the registered value (e.g. the topics it serves) under the same lease."""
        if self._broker is None or self._lease_id is None:
            raise RuntimeError("update_broker() before register_broker()")
        if info.key != self._broker.key:
            raise ValueError(f"update_broker() cannot change identity {self._broker.key}")
        async with self._lock:
            self._broker = info
            try:
                await self.client.put(self.broker_key(info), info.to_json(),
                                      lease=self._lease_id)
                return
            except aetcd.exceptions.ClientError as exc:
                if "lease not found" not in str(exc):
                    raise
        # The lease expired before the keep-alive noticed: register afresh.
        await self._register()
        self.reregistrations += 1

    async def unregister_broker(self) -> None:
        """Stop keeping the lease alive and revoke it, which deletes the broker's key now."""
        await self._stop_keepalive()
        lease_id, self._lease_id, self._broker = self._lease_id, None, None
        if lease_id is not None:
            await self.client.revoke_lease(lease_id)

    @property
    def lease_id(self) -> int | None:
        return self._lease_id

    async def _register(self) -> None:
        assert self._broker is not None
        async with self._lock:
            lease = await self.client.lease(self._ttl_s)
            await self.client.put(self.broker_key(self._broker), self._broker.to_json(),
                                  lease=lease.id)
            self._lease_id = lease.id
        log.info("registered broker %s at %s (lease %x, ttl %ss)", self._broker.key,
                 self._broker.addr, lease.id, self._ttl_s)

    async def _keepalive_loop(self) -> None:
        delay_s = self._keepalive_s
        while True:
            await asyncio.sleep(delay_s)
            client = self._client
            try:
                alive = await self._refresh()
                if not alive:
                    log.warning("lease of broker %s is gone; registering again",
                                self._broker.key if self._broker else None)
                    await self._register()
                    self.reregistrations += 1
                delay_s = self._keepalive_s
            except EtcdUnavailable as exc:
                # Keep trying: the lease may still be alive when etcd returns,
                # and if not, the next refresh says so and we register again.
                log.warning("etcd keep-alive failed (%s); retrying in %ss", exc, _RETRY_S)
                delay_s = min(_RETRY_S, self._keepalive_s)
                if len(self.endpoints) > 1:
                    await self.failover(client)

    async def _refresh(self) -> bool:
        """Send one keep-alive; False when etcd no longer knows the lease."""
        if self._lease_id is None:
            return False
        reply = await asyncio.wait_for(self.client.refresh_lease(self._lease_id),
                                       self.timeout_s)
        return reply is not None and reply.TTL > 0

    async def _stop_keepalive(self) -> None:
        task, self._keepalive_task = self._keepalive_task, None
        await cancel_and_wait(task)

    async def list_brokers(self) -> list[BrokerInfo]:
        """Every registered broker, read from etcd now (the cache is the usual way)."""
        return await self._list(f"{self.prefix}brokers/", BrokerInfo.from_json)

    # -- topics and groups -------------------------------------------------

    async def put_topic(self, cfg: TopicConfig, create_only: bool = False) -> int:
        """Store a topic config; with `create_only`, raise AlreadyExistsError if it exists.

        Returns the etcd revision of the write.
        """
        return await self._put(self.topic_key(cfg.name), cfg.to_json(), create_only,
                               f"topic {cfg.name!r}")

    async def get_topic(self, name: str) -> TopicConfig | None:
        validate_topic(name, allow_internal=True)
        got = await self.client.get(self.topic_key(name))
        return None if got is None else TopicConfig.from_json(got.value)

    async def delete_topic(self, name: str) -> int:
        """Delete a topic config; returns the revision of the delete, 0 if there was none."""
        validate_topic(name, allow_internal=True)
        return await self._delete(self.topic_key(name))

    async def list_topics(self) -> list[TopicConfig]:
        return await self._list(f"{self.prefix}topics/", TopicConfig.from_json)

    async def put_group(self, cfg: GroupConfig, create_only: bool = False) -> int:
        """Store a group config; with `create_only`, raise AlreadyExistsError if it exists."""
        return await self._put(self.group_key(cfg.name), cfg.to_json(), create_only,
                               f"group {cfg.name!r}")

    async def get_group(self, name: str) -> GroupConfig | None:
        validate_group(name)
        got = await self.client.get(self.group_key(name))
        return None if got is None else GroupConfig.from_json(got.value)

    async def delete_group(self, name: str) -> int:
        """Delete a group config; returns the revision of the delete, 0 if there was none."""
        validate_group(name)
        return await self._delete(self.group_key(name))

    async def list_groups(self) -> list[GroupConfig]:
        return await self._list(f"{self.prefix}groups/", GroupConfig.from_json)

    async def _put(self, key: bytes, value: bytes, create_only: bool, what: str) -> int:
        if not create_only:
            return int((await self.client.put(key, value)).header.revision)
        # Compare-and-put in one transaction: of concurrent creators exactly
        # one succeeds and the others learn that the key exists.
        tx = self.client.transactions
        ok, responses = await self.client.transaction(
            compare=[tx.create(key) == 0], success=[tx.put(key, value)], failure=[])
        if not ok:
            raise AlreadyExistsError(f"{what} already exists")
        return int(responses[0].response_put.header.revision)

    async def _delete(self, key: bytes) -> int:
        got = await self.client.delete(key)
        return 0 if got is None or not got.deleted else int(got.header.revision)

    async def _list(self, prefix: str, parse: Callable[[bytes], T]) -> list[T]:
        out: list[T] = []
        for kv in await self.client.get_prefix(prefix.encode()):
            try:
                out.append(parse(kv.value))
            except ValueError as exc:
                log.warning("skipping invalid value at %s: %s", kv.key.decode(errors="replace"),
                            exc)
        return out


async def retry_etcd(op: Callable[[], Awaitable[T]], attempts: int = 3,
                     delay_s: float = 0.2) -> T:
    """Run `op`, retrying when etcd does not answer; re-raises the last failure."""
    for attempt in range(attempts):
        try:
            return await op()
        except EtcdUnavailable:
            if attempt == attempts - 1:
                raise
            await asyncio.sleep(delay_s * (attempt + 1))
    raise AssertionError("unreachable")
