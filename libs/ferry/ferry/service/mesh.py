"""What a service that reaches the brokers holds: its identity, a broker connection pool,
a namesrv client, and (auth on) the checks of its own HTTP routes.

The delay scheduler, the txn-checker and dedup build these the same way; `MeshClients`
is that one way.
"""
from __future__ import annotations

from dataclasses import dataclass

from ferry.auth.credentials import Credentials, service_credentials
from ferry.client.core.connection import ConnectionPool
from ferry.client.core.namesrv import NamesrvClient
from ferry.service.auth import RouteTable, ServiceAuth
from ferry.service.config import MeshServiceConfig


@dataclass
class MeshClients:
    """A service's identity (FERRY_<SERVICE>_ACCESS_KEY / _SECRET_KEY, else FERRY_ACCESS_KEY /
    FERRY_SECRET_KEY; None: unsigned) and the clients signed with it; `auth` is set when
    FERRY_AUTH=on (identities from etcd, checked on every route of `routes`)."""

    credentials: Credentials | None
    pool: ConnectionPool
    namesrv: NamesrvClient
    auth: ServiceAuth | None

    @classmethod
    def build(cls, service: str, config: MeshServiceConfig, routes: RouteTable,
              request_timeout_ms: int) -> MeshClients:
        credentials = service_credentials(service)
        return cls(credentials,
                   ConnectionPool(request_timeout_ms=request_timeout_ms, credentials=credentials),
                   NamesrvClient(config.namesrv, credentials=credentials),
                   ServiceAuth(config.etcd, config.etcd_prefix, routes, service)
                   if config.auth else None)
