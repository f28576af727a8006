"""What a claim attempt found, what to do when Redis is away, and the claim's errors."""
from __future__ import annotations

import enum
from dataclasses import dataclass

from ferry.errors import FerryError


class ClaimState(enum.Enum):
    """What `RedisClaim.acquire` found for a (scene, business key).

    Stored in Redis are only two states: `processing:<token>` (a lease, PX
    lease_ms) and `done:<token>` (PX done_ttl_ms); no key means never claimed,
    released, or expired.
    """

    CLAIMED = "claimed"        # no claim was there: now ours (processing); run the handler
    PROCESSING = "processing"  # another holder is processing it: retry later, do not skip
    DONE = "done"              # processed before: skip it and acknowledge
    UNCHECKED = "unchecked"    # Redis unreachable and the policy is PROCESS: run unchecked


class Outcome(enum.Enum):
    """What an idempotent handler did with one message (`consumer.run` counts these).

    A wrapped handler (`IdempotenceCheck.wrap`) may return one; any other return
    value means RAN, and a `DuplicateMessage` escaping it means DUPLICATE.
    """

    RAN = "ran"                # the handler ran and its effects are recorded
    DUPLICATE = "duplicate"    # processed before: skipped, the message is acknowledged
    UNCHECKED = "unchecked"    # ran without the check (Redis away, policy PROCESS)


class RedisUnavailablePolicy(enum.Enum):
    """What a claim does when Redis cannot be reached (never a silent skip)."""

    FAIL = "fail"        # default: raise ClaimUnavailableError, the message is retried later
    PROCESS = "process"  # run the handler without the check (logged, counted): may duplicate


class ClaimBusyError(FerryError):
    """Another consumer holds the claim of this message: it is retried later, not skipped.

    Local only (no wire code of its own): a handler raising it is nacked by
    `Consumer.run`, so the message comes back after the retry back-off.
    """

    retriable = True


class ClaimUnavailableError(FerryError):
    """Redis could not be reached to take a claim (policy FAIL): retry the message later."""

    retriable = True


@dataclass(frozen=True, slots=True)
class Claim:
    """One claim attempt: where it lives, whose it is (token) and what was found."""

    scene: str
    biz_key: str
    key: str       # the Redis key
    token: str     # ours when state is CLAIMED; confirm/release compare it atomically
    state: ClaimState

    @property
    def should_run(self) -> bool:
        """True when the handler should run (CLAIMED or UNCHECKED)."""
        return self.state in (ClaimState.CLAIMED, ClaimState.UNCHECKED)


@dataclass(slots=True)
class ClaimStats:
    """Counters of one RedisClaim (read them for metrics; they only grow)."""

    claimed: int = 0
    confirmed: int = 0
    released: int = 0
    skipped_done: int = 0
    busy: int = 0
    unavailable_failed: int = 0      # Redis down, message failed for retry (FAIL)
    unavailable_unchecked: int = 0   # Redis down, handler ran without the check (PROCESS)
    confirm_failed: int = 0          # handler ran, but "done" could not be written
    lost: int = 0                    # confirm/release found the claim no longer ours
