"""What the auth-on HTTP fuzz puts in a request's signing headers (or the console's cookie).

For the signed APIs each generated request gets one kind: `signed_wide` (an
identity with every right: the hostile parameters and bodies reach the
handlers), `signed_few` (a valid signature of an identity with few or no
rights), `unsigned`, `wrong_secret`, `stale` and `future` (a valid signature
outside the window), `forged` (headers of the wrong shape: a made-up key,
non-hex nonce, a huge or negative timestamp), `replayed` (a request sent
before, headers and all) and, once signatures name their target (issue 24),
`wrong_target` (a valid signature for another service instance). A request of a refused kind must never be served
(no 2xx) on a guarded route, nor the replay of a request that was, and the
few-rights identities (whose rules name no name the generator uses) are
served only on the routes any identity may call.

The console signs nothing (it has sessions): its requests carry a logged-in
session's cookie, a forged cookie, or none.

Signing goes through `ferry.auth.http.signed_url_headers`, as every blocking
client does.
"""
from __future__ import annotations

import inspect
import random
import re
from collections import Counter, deque
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

from ferry.auth.credentials import Credentials
from ferry.auth.http import AUTH_HEADERS, signed_url_headers
from ferry.auth.signing import now_ms
from ferry.service.auth import OPEN_PATHS

#: Whether a signature names its target (issue 24: `signed_url_headers(..., target=)`);
#: the fuzz runs before and after that change. Drop once it is merged.
TARGETED = "target" in inspect.signature(signed_url_headers).parameters
#: The kinds of the signed APIs and their shares of the generated requests.
HTTP_AUTH_KINDS = {"signed_wide": 0.35, "signed_few": 0.2, "unsigned": 0.08, "forged": 0.08,
                   "wrong_secret": 0.08, "stale": 0.06, "future": 0.06, "replayed": 0.09,
                   **({"wrong_target": 0.05} if TARGETED else {})}
REFUSED_KINDS = frozenset({"unsigned", "forged", "wrong_secret", "stale", "future",
                           "wrong_target"})
#: The console's kinds: a logged-in session, a forged cookie, none.
COOKIE_KINDS = {"session": 0.5, "forged_cookie": 0.2, "no_cookie": 0.3}
SKEW_MS = 120_000
_REPLAYABLE = 32


@dataclass(frozen=True, slots=True)
class Request:
    """One request as sent: what a replay sends again."""

    method: str
    url: str
    headers: dict[str, str]
    body: bytes | None


class HttpAuthMix:
    """Chooses each request's credentials; checks answers against what it chose."""

    def __init__(self, rng: random.Random, *, wide: Credentials, few: list[Credentials],
                 cookie: str | None = None, anyone: Iterable[tuple[str, str]] = ()) -> None:
        self.rng, self.wide, self.few = rng, wide, few
        # The routes any identity may call, as (method, path pattern): all a few-rights
        # identity may be served on (its rules name no name the generator uses).
        self._anyone = [(m, re.compile(re.sub(r"\\{\w+\\}", "[^/]+", re.escape(path))))
                        for m, path in anyone]
        self.cookie = cookie   # the console: the session cookie (name=value) of a login
        kinds = COOKIE_KINDS if cookie is not None else HTTP_AUTH_KINDS
        self._kinds, self._weights = list(kinds), list(kinds.values())
        self.counts: Counter[str] = Counter()
        self._recent: deque[tuple[Request, int]] = deque(maxlen=_REPLAYABLE)

    def prepare(self, method: str, url: str, headers: dict[str, str],
                body: bytes | None) -> tuple[str, Request]:
        """(kind, the request to send) for a generated request."""
        kind = self.rng.choices(self._kinds, self._weights)[0]
        if kind == "replayed":
            if self._recent:
                self.counts[kind] += 1
                return kind, self.rng.choice(self._recent)[0]
            kind = "signed_wide"
        self.counts[kind] += 1
        return kind, Request(method, url, {**headers, **self._headers(kind, method, url, body)},
                             body)

    def _headers(self, kind: str, method: str, url: str, body: bytes | None) -> dict[str, str]:
        rng = self.rng
        raw = body or b""
        if kind == "session":
            return {"Cookie": self.cookie or ""}
        if kind == "forged_cookie":
            return {"Cookie": "ferry_console_session=" + rng.choice(
                ["", "x", "a.b.c", f"{rng.randbytes(16).hex()}.{now_ms() + 10**6}.{'0' * 64}",
                 "%00" * 20, "A" * 4000])}
        if kind in ("no_cookie", "unsigned"):
            return {}
        if kind == "signed_wide":
            return signed_url_headers(self.wide, method, url, raw)
        if kind == "signed_few":
            return signed_url_headers(rng.choice(self.few), method, url, raw)
        if kind == "wrong_secret":
            who = rng.choice([self.wide, *self.few])
            return signed_url_headers(Credentials(who.access_key, "not-the-secret-0123456789"),
                                      method, url, raw)
        if kind == "wrong_target":   # signed for another instance (or another service)
            other = rng.choice(["namesrv/127.0.0.1:1", "dedup/10.0.0.1:10923", "", "x"])
            return signed_url_headers(self.wide, method, url, raw,
                                      target=other)  # type: ignore[call-arg]
        if kind in ("stale", "future"):
            skew = SKEW_MS + rng.randrange(0, 10**6)
            return signed_url_headers(self.wide, method, url, raw,
                                      ts_ms=now_ms() - skew if kind == "stale" else now_ms() + skew)
        good = signed_url_headers(self.wide, method, url, raw)
        name = rng.choice(AUTH_HEADERS)
        value = rng.choice(["", "nobody", "-1", "9" * 40, "zz" * 16, "é", good[name][:-1],
                            good[name] + "0", "0" * 64])
        good[name] = value if value != good[name] else value + "0"   # never the signed one
        return good

    def check(self, kind: str, request: Request, status: int) -> str:
        """What is wrong with answer `status`, or ""; remembers served signed requests."""
        served = 200 <= status < 300
        path = urlsplit(request.url).path
        if kind in ("signed_wide", "signed_few"):
            self._recent.append((request, status))
            if kind == "signed_few" and served and path not in OPEN_PATHS \
                    and not self._for_anyone(request.method, path):
                return f"a few-rights identity was served {request.method} {path} ({status})"
            return ""
        if self.cookie is not None or not served or path in OPEN_PATHS:
            return ""
        if kind in REFUSED_KINDS:
            return f"{kind} {request.method} {path} was served ({status})"
        if kind == "replayed" and any(r is request and 200 <= s < 300 for r, s in self._recent):
            return f"a replay of {request.method} {path} was served twice ({status})"
        return ""

    def _for_anyone(self, method: str, path: str) -> bool:
        method = "GET" if method == "HEAD" else method
        return any(m == method and pattern.fullmatch(path) for m, pattern in self._anyone)
