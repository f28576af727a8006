"""One request processor per family: routes, brokers, topics, groups, health."""
from __future__ import annotations
