"""The root of Ferry's exceptions.

A leaf module: it imports nothing of Ferry, so `ferry.store` and `ferry.wire`
may both build their typed errors on it.
"""
from __future__ import annotations


class FerryError(Exception):
    """Root of every error Ferry raises on purpose.

    `retriable` tells a caller whether the same request may succeed if sent
    again (possibly to another broker) without changing it.
    """

    retriable: bool = False
