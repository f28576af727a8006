"""Identities for auth tests: seeded straight into etcd, and signed raw frames."""
from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from ferry.auth.acl import Rule, admin_rules
from ferry.auth.credentials import Credentials
from ferry.auth.signing import sign_wire
from ferry.routing import EtcdRegistry
from ferry.service.auth_registry import AuthRegistry
from ferry.wire import Frame, encode_frame_parts, request

from tests.broker.wire_client import WireClient

if TYPE_CHECKING:
    from tests.client.conftest import Mesh

_ids = itertools.count(1_000_000)


def creds(access_key: str) -> Credentials:
    """A test identity's credentials (the secret is derived from the name)."""
    return Credentials(access_key, f"{access_key}-secret-0123456789")


def rules(*specs: tuple[str, str, str]) -> tuple[Rule, ...]:
    """Rules from (effect, resource, "action,action") triples."""
    return tuple(Rule.parse({"effect": e, "resource": r, "actions": a}) for e, r, a in specs)


async def seed_async(endpoint: str, prefix: str,
                     identities: dict[str, tuple[Rule, ...]]) -> None:
    etcd = EtcdRegistry(endpoint, prefix=prefix)
    await etcd.start()
    try:
        reg = AuthRegistry(etcd)
        for access_key, its_rules in identities.items():
            await reg.add_user(access_key, creds(access_key).signing_key, rules=its_rules)
    finally:
        await etcd.stop()


def seed(endpoint: str, prefix: str, identities: dict[str, tuple[Rule, ...]]) -> None:
    """Write identities and their rules to etcd (from a sync fixture)."""
    asyncio.run(seed_async(endpoint, prefix, identities))


ADMIN_RULES = admin_rules()


async def send_frame(client: WireClient, frame: Frame, timeout_s: float = 10.0) -> Frame:
    """Write `frame` as it is (its `a` included) and return the response."""
    fut: asyncio.Future[Frame] = asyncio.get_running_loop().create_future()
    client.pending[frame.request_id] = fut
    client.writer.writelines(encode_frame_parts(frame))
    return await asyncio.wait_for(fut, timeout_s)


#: The target a broker started with the default cluster, name and id signs for.
DEFAULT_TARGET = "DefaultCluster/broker-a/0"


def signed(code: int, fields: dict[str, Any], body: bytes = b"", *,
           credentials: Credentials | None = None, target: str = DEFAULT_TARGET,
           **sign: Any) -> Frame:
    """A request frame signed with `credentials` for `target` (unsigned when None)."""
    frame = request(code, next(_ids), fields, body)
    if credentials is not None:
        frame.auth = sign_wire(credentials, target, code, fields, body, **sign)
    return frame


@contextmanager
def seeded_mesh(mesh: Mesh, identities: dict[str, tuple[Rule, ...]]) -> Iterator[Mesh]:
    """`mesh` with `identities` in its etcd prefix, its namesrv and one broker (broker-a)."""
    seed(mesh.etcd.endpoint, mesh.prefix, identities)
    try:
        mesh.start_namesrv()
        mesh.start_broker("broker-a")
        yield mesh
    finally:
        mesh.stop()
