"""Authentication and permissions, what clients and servers share: identities, request
signatures (wire and HTTP), the replay guard, ACLs, TLS contexts.

Leaf-like: depends only on the stdlib, msgpack, aiohttp (the client session
that signs) and `ferry.errors`. The server side (checking HTTP requests, the
identities in etcd) is the service kit's: `ferry.service.auth`,
`ferry.service.auth_registry`. docs/security.md describes the scheme.
"""
from __future__ import annotations

from ferry.auth.acl import Acl, Rule
from ferry.auth.credentials import Credentials, derive_signing_key, generate_secret
from ferry.auth.nonces import ReplayGuard
from ferry.auth.signing import check_wire, sign_wire

__all__ = [
    # identities
    "Credentials", "derive_signing_key", "generate_secret",
    # signatures
    "sign_wire", "check_wire", "ReplayGuard",
    # permissions
    "Acl", "Rule",
]
