"""Ferry: a distributed message middleware in the RocketMQ tradition.

The public client API is re-exported here once it exists (see ferry.client).
"""
from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
