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
"""
from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

from ferry.auth.credentials import Credentials
from ferry.errors import AuthenticationError

from ferry_console.sources import Sources

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


class SessionStore:
    """The console's sessions, at most `max_sessions` (the oldest is ended past that)."""

    def __init__(self, make_sources: Callable[[Credentials], Sources], ttl_ms: int,
                 max_sessions: int, clock: Callable[[], int] = _wall_ms) -> None:
        self._make_sources = make_sources
        self.ttl_ms = ttl_ms
        self.max_sessions = max_sessions
        self._clock = clock
        self._key = secrets.token_bytes(COOKIE_KEY_BYTES)
        self._sessions: dict[str, Session] = {}   # insertion order = age
        self.logins = 0
        self.failed_logins = 0

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
        await self._drop_expired()
        while len(self._sessions) >= self.max_sessions:
            oldest = next(iter(self._sessions))
            await self.logout(oldest)
        session = Session(secrets.token_urlsafe(SESSION_ID_BYTES), credentials.access_key,
                          self._clock() + self.ttl_ms, sources)
        self._sessions[session.sid] = session
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

    async def logout(self, sid: str) -> None:
        session = self._sessions.pop(sid, None)
        if session is not None:
            await session.sources.stop()
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
