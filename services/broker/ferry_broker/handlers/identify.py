"""IDENTIFY: which broker a connection reached, so that a client can sign for it.

A signature covers its target (docs/security.md, "Wire signing"): the broker's
`cluster/name/id`. A client learns it once per connection, before its first
signed request, with this request; it is never signed itself (the client
cannot sign before it knows the target) and answers anyone, auth on or off:
it tells no more than the broker's registration in etcd, which every identity
may list.
"""
from __future__ import annotations

from ferry.wire import Frame, response

from ferry_broker.context import BrokerContext, ConnInfo


async def handle_identify(ctx: BrokerContext, conn: ConnInfo, req: Frame) -> Frame:
    cfg = ctx.config
    return response(req, {"target": cfg.auth_target, "cluster": cfg.cluster, "name": cfg.name,
                          "id": cfg.id})
