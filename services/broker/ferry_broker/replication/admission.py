"""Which slave a master links with: the checks on a replication HELLO (and AUTH), and how
a failed connection on the port is named in the log (`describe_failure`, `peer_of`).

A slave is refused (REFUSE, then the master closes) when it speaks another
protocol version, belongs to another broker group, claims the master's own
id, is not a live registered broker of the group, follows a newer epoch than
the master's, or, with auth on, sends no valid AUTH frame right after HELLO.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from ferry.errors import FerryError

from . import protocol as p

log = logging.getLogger(__name__)

#: Judges a slave's AUTH frame: (HELLO payload, AUTH payload); raises FerryError to refuse.
Authenticate = Callable[[bytes, bytes], None]

#: A connection's TLS handshake, then the rest of its handshake (HELLO and, with auth
#: on, AUTH, up to the master's WELCOME or REFUSE), must each end within this: a
#: silent or trickling peer holds one of the port's few slots.
HELLO_TIMEOUT_MS = 5_000


class SlaveAdmission:
    """The master's judge of a slave's HELLO: the reason it is refused, or None."""

    def __init__(self, *, cluster: str, name: str, broker_id: int,
                 is_peer: Callable[[int], bool], authenticate: Authenticate | None) -> None:
        self.cluster, self.name, self.broker_id = cluster, name, broker_id
        self._is_peer = is_peer
        #: With auth on: checks a slave's AUTH frame against its HELLO (raises FerryError).
        self._authenticate = authenticate

    async def auth_refusal(self, reader: asyncio.StreamReader, hello: bytes) -> str | None:
        """With auth on: why the slave's AUTH frame (next after HELLO) is refused, or None."""
        if self._authenticate is None:
            return None
        ftype, payload = await p.read_frame(reader)  # within the handshake's deadline
        if ftype is not p.FrameType.AUTH:
            return f"authentication required: auth is on and the slave sent {ftype.name}, not AUTH"
        try:
            self._authenticate(hello, payload)
        except FerryError as exc:
            return str(exc)
        return None

    def refusal(self, hello: p.Hello, epoch: int) -> str | None:
        """Why this HELLO is refused by a master of `epoch`, or None to accept it."""
        if hello.version != p.VERSION:
            return f"unsupported replication protocol version {hello.version}"
        if (hello.cluster, hello.name) != (self.cluster, self.name):
            return (f"this is broker group {self.cluster}/{self.name}, "
                    f"not {hello.cluster}/{hello.name}")
        if hello.broker_id == self.broker_id:
            return f"broker id {hello.broker_id} is this master's own"
        try:
            peer_ok = self._is_peer(hello.broker_id)
        except Exception:
            log.exception("replication: the peer check failed")
            peer_ok = False
        if not peer_ok:
            return f"broker {hello.broker_id} is not a live broker of the group"
        if hello.epoch > epoch:
            return f"this master's epoch {epoch} is older than the slave's {hello.epoch}"
        return None


def describe_failure(exc: BaseException) -> str:
    """Why a connection on the replication port ended, for its log line."""
    if isinstance(exc, asyncio.IncompleteReadError):
        return (f"the peer closed mid-frame ({len(exc.partial)} of {exc.expected} bytes)"
                if exc.partial else "the peer closed the connection")
    if isinstance(exc, TimeoutError):
        return "timed out waiting for the peer"
    return str(exc)


def peer_of(writer: asyncio.StreamWriter) -> str:
    """The peer's "host:port" ("?" when unknown)."""
    peer = writer.get_extra_info("peername")
    return f"{peer[0]}:{peer[1]}" if peer else "?"
