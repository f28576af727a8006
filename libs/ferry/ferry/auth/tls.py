"""Optional TLS for the wire protocol (and the replication link): contexts from config.

Servers (brokers) present a certificate and key (`FERRY_TLS_CERT`,
`FERRY_TLS_KEY`); clients verify it against a CA bundle (`FERRY_TLS_CA`),
hostname included, so the address a client dials must be in the certificate
(an IP address as an IP SAN). Unset: plain TCP, as before. TLS protects what
signing does not: the content of requests and responses from observers.
"""
from __future__ import annotations

import os
import ssl
from collections.abc import Mapping

from ferry.errors import MalformedRequestError

ENV_TLS_CERT = "FERRY_TLS_CERT"
ENV_TLS_KEY = "FERRY_TLS_KEY"
ENV_TLS_CA = "FERRY_TLS_CA"
#: Older protocol versions are refused by both sides.
MIN_TLS_VERSION = ssl.TLSVersion.TLSv1_2


def server_context(cert_file: str, key_file: str) -> ssl.SSLContext | None:
    """A server context presenting `cert_file` (with `key_file`); None when no cert is set."""
    if not cert_file:
        return None
    if not key_file:
        raise MalformedRequestError(f"TLS needs a key with the certificate ({ENV_TLS_KEY})")
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = MIN_TLS_VERSION
    try:
        ctx.load_cert_chain(cert_file, key_file)
    except (OSError, ssl.SSLError) as exc:
        raise MalformedRequestError(f"cannot load the TLS certificate {cert_file}: {exc}") from None
    return ctx


def client_context(ca_file: str) -> ssl.SSLContext | None:
    """A client context trusting `ca_file` and checking hostnames; None when no CA is set."""
    if not ca_file:
        return None
    try:
        ctx = ssl.create_default_context(cafile=ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise MalformedRequestError(f"cannot load the TLS CA bundle {ca_file}: {exc}") from None
    ctx.minimum_version = MIN_TLS_VERSION
    return ctx


def client_context_from_env(env: Mapping[str, str] | None = None) -> ssl.SSLContext | None:
    """The client context `FERRY_TLS_CA` asks for (None: plain TCP)."""
    return client_context((os.environ if env is None else env).get(ENV_TLS_CA, "").strip())
