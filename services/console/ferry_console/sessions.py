"""Console sessions: who is logged in, for how long, and the clients that act as them.

With auth on, a user logs in with an access key and secret (`login.py`); the
console checks them by a signed `GET /v1/whoami` at namesrv and keeps, in
memory, a session: the user's credentials and their own clients (Admin,
namesrv, HTTP), so every page and action is signed as that user and namesrv,
the brokers and the services allow exactly what the user may do.

The browser holds only a cookie `<session id>.<expiry ms>.<mac>`: a random
id, its expiry, and an HMAC-SHA256 over both under a key this process drew at
start. A cookie that is forged, tampered with or past its expiry is refused
without a lookup; a restart of the console ends every session (the key and
the sessions live in memory only: nothing secret is ever written to disk).

Sessions are bounded per identity and in all: a new login ends the oldest
session of *its own* identity once that identity holds `max_per_identity`;
when the console holds `max_sessions`, a login of an identity with no session
to give up is refused (`BusyError`), never paid for with another identity's
session. So no identity, however often it logs in, logs anyone else out.
"""
from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from ferry.auth.credentials import Credentials
from ferry.errors import AuthenticationError, BusyError

from ferry_console.sources import Sources

T = TypeVar("T")

log = logging.getLogger("ferry_console")

#: Bytes of randomness in a session id and in the cookie-signing key.
SESSION_ID_BYTES = 32
COOKIE_KEY_BYTES = 32


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass
class Session:
    """One logged-in user: their access key, when the session ends, and their clients."""

    sid: str
    access_key: str
    expires_ms: int
    sources: Sources
    #: Requests of this session being served; its clients stop only once none is.
    in_flight: int = 0
    ended: bool = False

    async def serve(self, call: Callable[[], Awaitable[T]]) -> T:
        """Run one request of this session; a logout meanwhile stops its clients after it
        (not under it: a page in flight would fail with a closed client)."""
        self.in_flight += 1
        try:
            return await call()
        finally:
            self.in_flight -= 1
            if self.ended and not self.in_flight:
                await self.sources.stop()

    async def end(self) -> None:
        """End the session: its clients stop now, or after its last request in flight."""
        self.ended = True
        if not self.in_flight:
            await self.sources.stop()


class SessionStore:
    """The console's sessions: at most `max_per_identity` per identity (its own oldest ends
    past that) and `max_sessions` in all (a login is refused past that)."""

    def __init__(self, make_sources: Callable[[Credentials], Sources], ttl_ms: int,
                 max_sessions: int, max_per_identity: int,
                 clock: Callable[[], int] = _wall_ms) -> None:
        self._make_sources = make_sources
        self.ttl_ms = ttl_ms
        self.max_sessions = max_sessions
        self.max_per_identity = max_per_identity
        self._clock = clock
        self._key = secrets.token_bytes(COOKIE_KEY_BYTES)
        self._sessions: dict[str, Session] = {}   # insertion order = age
        self._by_identity: dict[str, dict[str, None]] = {}   # access key -> its sids, oldest first
        self.logins = 0
        self.failed_logins = 0
        self.refused_full = 0

    def __len__(self) -> int:
        return len(self._sessions)

    async def login(self, credentials: Credentials) -> Session:
        """Check `credentials` at namesrv and open a session; AuthenticationError otherwise."""
        sources = self._make_sources(credentials)
        try:
            await sources.start()
            who = await sources.namesrv.call("GET", "/v1/whoami")
        except AuthenticationError:
            await sources.stop()
            self.failed_logins += 1
            raise AuthenticationError("wrong access key or secret") from None
        except BaseException:
            await sources.stop()
            raise
        if not isinstance(who, dict) or who.get("access_key") != credentials.access_key:
            await sources.stop()
            raise AuthenticationError("namesrv does not check signatures (is FERRY_AUTH on "
                                      "there?): the console cannot log anyone in")
        try:
            await self._make_room(credentials.access_key)
        except BusyError:
            await sources.stop()
            raise
        session = Session(secrets.token_urlsafe(SESSION_ID_BYTES), credentials.access_key,
                          self._clock() + self.ttl_ms, sources)
        self._sessions[session.sid] = session
        self._by_identity.setdefault(session.access_key, {})[session.sid] = None
        self.logins += 1
        log.info("login", extra={"access_key": credentials.access_key})
        return session

    def cookie_value(self, session: Session) -> str:
        """What the browser keeps: the session id, its expiry and their MAC."""
        return f"{session.sid}.{session.expires_ms}.{self._mac(session.sid, session.expires_ms)}"

    def lookup(self, cookie: str | None) -> Session | None:
        """The live session a cookie names; None when absent, forged, tampered or expired."""
        if not cookie or cookie.count(".") != 2:
            return None
        sid, expires, mac = cookie.split(".")
        if not expires.isdigit() or len(expires) > 15:
            return None
        if not hmac.compare_digest(self._mac(sid, int(expires)), mac):
            return None
        session = self._sessions.get(sid)
        if session is None or session.expires_ms != int(expires):
            return None
        if self._clock() >= session.expires_ms:
            return None   # ended; its clients close on the next login or logout
        return session

    async def _make_room(self, access_key: str) -> None:
        """Room for one more session of `access_key`: end expired sessions, then its own
        oldest while it is at its cap or the console is full; BusyError when the console is
        full and `access_key` holds nothing to give up."""
        await self._drop_expired()
        own = self._by_identity.get(access_key, {})
        while own and (len(own) >= self.max_per_identity
                       or len(self._sessions) >= self.max_sessions):
            await self.logout(next(iter(own)))
        if len(self._sessions) >= self.max_sessions:
            self.refused_full += 1
            raise BusyError(f"the console holds its maximum of {self.max_sessions} sessions: "
                            "try again once some have ended (or an operator raises "
                            "FERRY_CONSOLE_MAX_SESSIONS)")

    async def logout(self, sid: str) -> None:
        session = self._sessions.pop(sid, None)
        if session is not None:
            own = self._by_identity.get(session.access_key)
            if own is not None:
                own.pop(sid, None)
                if not own:
                    del self._by_identity[session.access_key]
            await session.end()
            log.info("logout", extra={"access_key": session.access_key})

    async def close(self) -> None:
        """End every session (the console stops)."""
        for sid in list(self._sessions):
            await self.logout(sid)

    async def _drop_expired(self) -> None:
        now = self._clock()
        for sid in [s.sid for s in self._sessions.values() if s.expires_ms <= now]:
            await self.logout(sid)

    def _mac(self, sid: str, expires_ms: int) -> str:
        data = f"ferry-console-session/1\n{sid}\n{expires_ms}".encode()
        return hmac.new(self._key, data, hashlib.sha256).hexdigest()
