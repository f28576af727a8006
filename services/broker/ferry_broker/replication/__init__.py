"""Master/slave replication (issue 9): the link protocol, the master's server, the follower.

See docs/replication.md "Protocol" and "Truncation and rejoin".
"""
from __future__ import annotations

from .follower import ReplicaFollower
from .master import ReplicationServer

__all__ = ["ReplicaFollower", "ReplicationServer"]
