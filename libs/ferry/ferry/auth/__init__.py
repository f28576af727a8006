"""Authentication and permissions: identities, request signatures, replay guard, ACLs.

Leaf-like: everything here but `registry` (etcd) depends only on the stdlib,
msgpack and `ferry.errors`. docs/security.md describes the scheme.
"""
from __future__ import annotations

from ferry.auth.acl import Acl, Rule
from ferry.auth.credentials import Credentials, derive_signing_key, generate_secret
from ferry.auth.nonces import ReplayGuard
from ferry.auth.signing import sign_wire, verify_wire

__all__ = [
    # identities
    "Credentials", "derive_signing_key", "generate_secret",
    # signatures
    "sign_wire", "verify_wire", "ReplayGuard",
    # permissions
    "Acl", "Rule",
]
