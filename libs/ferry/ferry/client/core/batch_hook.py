"""A handler's optional batch hook for `consumer.run` (see `runner.Runner._prepared`).

`ferry.idempotence` offers one so that the Redis claim takes the claims of a
whole batch in one call before its handlers start; the tracing wrapper keeps
the hook of the handler it wraps. Its own module: the runner, the tracing
wrapper and ferry.idempotence all import it.
"""
from __future__ import annotations

from typing import Protocol

from ferry.client.core.message import ConsumerRecord

#: The attribute under which a handler offers a BatchHook (set by ferry.idempotence
#: and kept by the tracing wrapper); a private name, so no user handler has it by chance.
BATCH_HOOK_ATTR = "_ferry_batch_hook"


class BatchHook(Protocol):
    """What a handler may offer the runner for each batch it takes (see `Runner._prepared`)."""

    async def prepare(self, records: list[ConsumerRecord]) -> None:
        """Called before the batch's handlers start (e.g. take their claims in one call)."""

    def forget(self, records: list[ConsumerRecord]) -> None:
        """Called instead of the handlers when they will not start (a stop or cancel)."""


def batch_hook(handler: object) -> BatchHook | None:
    """The BatchHook a handler offers, or None."""
    return getattr(handler, BATCH_HOOK_ATTR, None)


def offer_batch_hook(handler: object, hook: BatchHook | None) -> None:
    """Have `handler` offer `hook` (no-op for None): for wrappers that keep their inner's."""
    if hook is not None:
        setattr(handler, BATCH_HOOK_ATTR, hook)
