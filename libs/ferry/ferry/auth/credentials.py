"""An identity's access key and secret, and the signing key derived from them.

A client holds `Credentials(access_key, secret_key)`; it never sends the secret.
It signs with `signing_key`, a one-way derivation of the secret
(HMAC-SHA256(secret, "ferry-signing-key/1\\n" + access_key)); servers keep only
that derived key (in etcd), so a copy of etcd does not reveal any secret. See
docs/security.md, "Identities and keys".
"""
from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field

from ferry.errors import MalformedRequestError

#: What an access key may look like: short, printable, safe in a URL and an etcd key.
ACCESS_KEY_PATTERN = re.compile(r"[A-Za-z0-9_-]{3,64}")
#: A secret shorter than this is refused: the derived key is only as strong as the secret.
MIN_SECRET_LENGTH = 16
#: A secret longer than this is refused (it would only cost hashing time).
MAX_SECRET_LENGTH = 256
#: Bytes of randomness in a generated secret (encoded URL-safe base64: 43 characters).
GENERATED_SECRET_BYTES = 32
#: Bytes of a derived signing key (an HMAC-SHA256 output).
SIGNING_KEY_BYTES = 32
#: The derivation's domain prefix: a new scheme would change the version digit.
_KEY_DERIVATION_PREFIX = b"ferry-signing-key/1\n"

ENV_ACCESS_KEY = "FERRY_ACCESS_KEY"
ENV_SECRET_KEY = "FERRY_SECRET_KEY"


def validate_access_key(access_key: object) -> str:
    """Return `access_key` if it matches [A-Za-z0-9_-]{3,64}, else raise MalformedRequestError."""
    if isinstance(access_key, str) and ACCESS_KEY_PATTERN.fullmatch(access_key):
        return access_key
    raise MalformedRequestError(
        f"invalid access key {access_key!r}: access keys match [A-Za-z0-9_-]{{3,64}}")


def validate_secret(secret: object) -> str:
    """Return `secret` if it is a printable string of an allowed length, else raise."""
    if not isinstance(secret, str) or not secret.isprintable():
        raise MalformedRequestError("a secret key must be a printable string")
    if not MIN_SECRET_LENGTH <= len(secret) <= MAX_SECRET_LENGTH:
        raise MalformedRequestError(
            f"a secret key must have {MIN_SECRET_LENGTH} to {MAX_SECRET_LENGTH} characters")
    return secret


def derive_signing_key(access_key: str, secret_key: str) -> bytes:
    """The 32-byte key requests are signed with, derived one way from the secret."""
    return hmac.new(secret_key.encode("utf-8"),
                    _KEY_DERIVATION_PREFIX + access_key.encode("ascii"),
                    hashlib.sha256).digest()


def generate_secret() -> str:
    """A fresh random secret key (URL-safe text, 256 bits of randomness)."""
    return secrets.token_urlsafe(GENERATED_SECRET_BYTES)


@dataclass(frozen=True, slots=True)
class Credentials:
    """One identity as a client holds it: the access key and its secret.

    The secret never appears in `repr` (nor, therefore, in logs or tracebacks).
    """

    access_key: str
    secret_key: str = field(repr=False)
    signing_key: bytes = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        validate_access_key(self.access_key)
        validate_secret(self.secret_key)
        object.__setattr__(self, "signing_key",
                           derive_signing_key(self.access_key, self.secret_key))

    @classmethod
    def from_env(cls, prefix: str = "FERRY",
                 env: Mapping[str, str] | None = None) -> Credentials | None:
        """The credentials in `<prefix>_ACCESS_KEY` / `<prefix>_SECRET_KEY`, else None.

        With a service prefix (`FERRY_DELAY_SCHEDULER`) the service's own pair is
        used when set, else the generic FERRY_ACCESS_KEY / FERRY_SECRET_KEY. Only
        one of a pair set is a configuration mistake and raises.
        """
        env = os.environ if env is None else env
        prefixes = [prefix] if prefix == "FERRY" else [prefix, "FERRY"]
        for p in prefixes:
            access_key = env.get(f"{p}_ACCESS_KEY", "")
            secret_key = env.get(f"{p}_SECRET_KEY", "")
            if access_key and secret_key:
                return cls(access_key, secret_key)
            if access_key or secret_key:
                raise MalformedRequestError(
                    f"{p}_ACCESS_KEY and {p}_SECRET_KEY must be set together")
        return None


#: The one switch every service reads: on = every request must be signed and permitted.
ENV_AUTH = "FERRY_AUTH"
_TRUE_WORDS = ("1", "true", "yes", "on")
_FALSE_WORDS = ("", "0", "false", "no", "off")


def auth_enabled(env: Mapping[str, str] | None = None) -> bool:
    """Whether FERRY_AUTH turns authentication on (default off); a bad value raises."""
    raw = (os.environ if env is None else env).get(ENV_AUTH, "").strip().lower()
    if raw in _TRUE_WORDS:
        return True
    if raw in _FALSE_WORDS:
        return False
    raise ValueError(f"{ENV_AUTH} must be on or off, not {raw!r}")


def service_credentials(service: str, env: Mapping[str, str] | None = None) -> Credentials | None:
    """A service's own identity: FERRY_<SERVICE>_ACCESS_KEY/_SECRET_KEY, else FERRY_ACCESS_KEY/
    FERRY_SECRET_KEY, else None. `service` is its name (`delay-scheduler`, `txn-checker`)."""
    prefix = "FERRY_" + service.upper().replace("-", "_")
    return Credentials.from_env(prefix, env)
