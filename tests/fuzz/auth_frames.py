"""What the auth-on wire fuzz puts in a frame's `a`: valid signatures and every wrong one.

Each answered frame gets one kind, at random:

- `signed_few`: a valid signature of an identity with few rights (some
  requests allowed, most refused with AccessDeniedError);
- `signed_wide`: a valid signature of an identity with every right, so the
  hostile fields and bodies reach the handlers as they do with auth off;
- `unsigned`, `forged` (a well- or ill-shaped `a` with a made-up key or
  random signature), `wrong_secret` (a real key signed with another secret),
  `stale` and `future` (a valid signature `SKEW_MS` outside the window):
  each must be refused with AuthenticationError, whatever the request;
- `replayed`: a signed frame sent before, again, byte for byte but for its
  request id (which the signature does not cover): a replay of a request the
  broker served must be refused;
- `wrong_target` (once signatures name their target, issue 24): a valid
  signature for another broker, which must be refused too.

`Sent` records what each answered frame was, so the reader of the answers can
check each one (`check_answer`). Signing goes through `sign_frame`, the one
place that calls `ferry.auth.signing.sign_wire`, as the client does; the codes
a broker answers unsigned (`ferry_broker.permissions.OPEN_CODES`: IDENTIFY,
which tells a client the target to sign for) are exempt from the refusals.
"""
from __future__ import annotations

import inspect
import random
import time
from collections import Counter, deque
from dataclasses import dataclass
from typing import Any

from ferry.auth.acl import Acl, Rule
from ferry.auth.credentials import Credentials
from ferry.auth.signing import sign_wire
from ferry.errors import AccessDeniedError, AuthenticationError, FerryError
from ferry.wire import request
from ferry_broker import permissions as broker_permissions
from ferry_broker.permissions import check_permission

#: Whether a wire signature names its target (issue 24: `sign_wire(credentials, target,
#: code, ...)`); the fuzz runs before and after that change. Drop once it is merged.
TARGETED = "target" in inspect.signature(sign_wire).parameters
#: Request codes a broker answers without a signature (none before targets existed).
OPEN_CODES = frozenset(getattr(broker_permissions, "OPEN_CODES", ()))
#: How far outside the replay window `stale` and `future` frames are (2 x the default).
SKEW_MS = 120_000
#: The kinds and their shares of the answered frames.
AUTH_KINDS = {"signed_few": 0.25, "signed_wide": 0.30, "unsigned": 0.08, "forged": 0.08,
              "wrong_secret": 0.08, "stale": 0.06, "future": 0.06, "replayed": 0.09,
              **({"wrong_target": 0.05} if TARGETED else {})}
#: Kinds the broker must answer with AuthenticationError, whatever the request.
REFUSED_KINDS = frozenset({"unsigned", "forged", "wrong_secret", "stale", "future",
                           "wrong_target"})
_REPLAYABLE = 64  # recently signed frames a replay is taken from


def sign_frame(credentials: Credentials, target: str, code: int, fields: dict[str, Any],
               body: bytes, *, ts_ms: int | None = None) -> dict[str, Any]:
    """The `a` map a client with `credentials` sends to the broker `target` (a fresh nonce;
    now unless `ts_ms`)."""
    if TARGETED:
        return sign_wire(credentials, target, code, fields, body,  # type: ignore[call-arg]
                         ts_ms=ts_ms)
    return sign_wire(credentials, code, fields, body, ts_ms=ts_ms)  # type: ignore[arg-type]


@dataclass(slots=True)
class Sent:
    """What one answered frame was: its auth kind, its request and whom it replays."""

    kind: str
    code: int
    fields: dict[str, Any]
    replay_of: int | None = None


class AuthMix:
    """Chooses and builds the `a` of each frame; remembers what it sent (`sent`, by id)."""

    def __init__(self, rng: random.Random, few: Credentials, few_rules: tuple[Rule, ...],
                 wide: Credentials, target: str = "") -> None:
        self.rng, self.few, self.wide = rng, few, wide
        self.target = target   # the broker's (its IDENTIFY answer; "" before targets)
        self.acl = Acl({few.access_key: few_rules})
        self._kinds, self._weights = list(AUTH_KINDS), list(AUTH_KINDS.values())
        self._recent: deque[tuple[int, int, dict[str, Any], bytes, dict[str, Any]]] = \
            deque(maxlen=_REPLAYABLE)
        self.counts: Counter[str] = Counter()
        self.signed_codes: set[int] = set()  # request codes sent with a valid signature
        self.sent: dict[int, Sent] = {}      # answered frames not yet checked, by request id
        self.outcomes: dict[int, int] = {}   # error codes of replayable frames, by request id
        self._wanted: Counter[int] = Counter()  # originals of replays not yet checked

    def replay(self) -> tuple[int, dict[str, Any], bytes, dict[str, Any], int] | None:
        """A recently signed (code, fields, body, a, its request id) to send again, or None."""
        if not self._recent or self.rng.random() >= AUTH_KINDS["replayed"]:
            return None
        request_id, code, fields, body, auth = self.rng.choice(self._recent)
        return code, fields, body, auth, request_id

    def sign(self, request_id: int, code: int, fields: dict[str, Any], body: bytes,
             answered: bool) -> dict[str, Any] | None:
        """The `a` for a new frame (None: unsigned); records it when it is `answered`."""
        kind = self.rng.choices(self._kinds, self._weights)[0]
        if kind == "replayed":  # replay() declined: sign it validly instead
            kind = "signed_wide"
        auth = self._auth(kind, code, fields, body)
        if answered:
            self.counts[kind] += 1
            if kind in REFUSED_KINDS and code not in OPEN_CODES:
                self.counts["refusals_due"] += 1
            self.sent[request_id] = Sent(kind, code, fields)
            if kind in ("signed_few", "signed_wide"):
                self.signed_codes.add(code)
                self._recent.append((request_id, code, fields, body, auth or {}))
        return auth

    def remember_outcome(self, request_id: int, error: int) -> None:
        """Keep the answer of a frame a replay names or may still name; forget the rest."""
        self.outcomes[request_id] = error
        if len(self.outcomes) > 4 * _REPLAYABLE + len(self._wanted):
            keep = {r[0] for r in self._recent} | self._wanted.keys()
            self.outcomes = {i: e for i, e in self.outcomes.items() if i in keep}

    def replay_checked(self, original: int) -> None:
        self._wanted[original] -= 1
        if self._wanted[original] <= 0:
            del self._wanted[original]

    def replayed(self, request_id: int, code: int, fields: dict[str, Any],
                 original: int) -> None:
        self.counts["replayed"] += 1
        self.sent[request_id] = Sent("replayed", code, fields, original)
        self._wanted[original] += 1

    def _auth(self, kind: str, code: int, fields: dict[str, Any],
              body: bytes) -> dict[str, Any] | None:
        rng = self.rng
        now = int(time.time() * 1000)
        if kind == "signed_few":
            return sign_frame(self.few, self.target, code, fields, body)
        if kind == "signed_wide":
            return sign_frame(self.wide, self.target, code, fields, body)
        if kind == "unsigned":
            return None
        if kind == "wrong_secret":
            who = rng.choice([self.few, self.wide])
            return sign_frame(Credentials(who.access_key, "not-the-secret-0123456789"),
                              self.target, code, fields, body)
        if kind == "wrong_target":
            other = rng.choice(["DefaultCluster/broker-b/0", self.target + "0", "", "x"])
            return sign_frame(self.wide, other, code, fields, body)
        if kind in ("stale", "future"):
            skew = SKEW_MS + rng.randrange(0, 10**6)
            return sign_frame(rng.choice([self.few, self.wide]), self.target, code, fields,
                              body, ts_ms=now - skew if kind == "stale" else now + skew)
        auth: dict[str, Any] = {
            "k": rng.choice([self.few.access_key, "root", "nobody", "", "x" * 100]),
            "t": rng.choice([now, 0, -1, 2**63 - 1]),
            "n": rng.randbytes(rng.choice([16, 16, 0, 64])),
            "s": rng.randbytes(rng.choice([32, 32, 0, 31]))}
        if rng.random() < 0.2:
            auth[rng.choice(list(auth))] = rng.choice([None, 1.5, [], {}, "x", -(2**63)])
        return auth


def check_answer(mix: AuthMix, request_id: int, error: int) -> str:
    """What is wrong with the answer `error` to frame `request_id`, or "" when it is right."""
    sent = mix.sent.pop(request_id, None)
    if sent is None:
        return ""
    if sent.code in OPEN_CODES:
        return ""   # answered whoever asks
    if sent.kind in REFUSED_KINDS and error != AuthenticationError.code:
        return f"a {sent.kind} frame (code {sent.code}) was answered with error {error}"
    if sent.kind in ("signed_few", "signed_wide"):
        mix.remember_outcome(request_id, error)
    if sent.kind == "signed_few" and error == 0:
        try:
            check_permission(mix.acl, mix.few.access_key, request(sent.code, 0, sent.fields))
        except AccessDeniedError as exc:
            return f"served a request the few-rights identity may not make: {exc}"
        except FerryError:
            pass  # a malformed field the handler let through: not a rights question
    if sent.kind == "replayed" and sent.replay_of is not None:
        first = mix.outcomes.get(sent.replay_of)
        mix.replay_checked(sent.replay_of)
        if error == 0 and first == 0:
            return f"a replay of request {sent.replay_of} (code {sent.code}) was served twice"
        if first is not None:
            mix.counts["replays_checked"] += 1
    return ""
