"""Every error Ferry raises on purpose, and the registry from wire code to class.

A leaf module: it imports nothing of Ferry, so `ferry.store`, `ferry.wire`,
the clients and the services all raise and map the same classes. Each class
has one wire `code` (0 is success and has no class) and a `retriable` flag:
whether the same request may succeed if sent again, perhaps to another broker,
without changing it. `error_for_code()` turns a wire error back into the class.
"""
from __future__ import annotations


class FerryError(Exception):
    """Root of every error Ferry raises on purpose."""

    code: int = 1
    retriable: bool = False


class SystemError_(FerryError):  # noqa: N801 - `SystemError` is a builtin
    """An unexpected failure inside the server; it was logged there."""

    code = 1


class BusyError(FerryError):
    """The server is overloaded or shutting down; try again shortly."""

    code = 2
    retriable = True


class UnknownCodeError(FerryError):
    """The request code is not one this server knows."""

    code = 3


class MalformedRequestError(FerryError):
    """The request decoded as a frame but its header or body is invalid."""

    code = 4


class InvalidNameError(FerryError, ValueError):
    """A topic or group name breaks the naming rules."""

    code = 5


class MessageTooLargeError(FerryError, ValueError):
    """A message body (or a frame) is larger than the configured limit."""

    code = 6


class TopicNotFoundError(FerryError):
    """The topic does not exist (and is not created on first use here)."""

    code = 7
    retriable = True


class NoPermissionError(FerryError):
    """The broker does not accept this operation (not master, read-only topic)."""

    code = 8
    retriable = True


class FlushTimeoutError(FerryError):
    """Stored, but not made durable within the sync-flush timeout."""

    code = 9
    retriable = True


class SlaveNotAvailableError(FerryError):
    """Sync replication was asked for and no slave acknowledged in time."""

    code = 10
    retriable = True


class OffsetOutOfRangeError(FerryError):
    """A queue offset below the queue's minimum or beyond its maximum."""

    code = 11


class MessageNotFoundError(FerryError):
    """No stored message matches the id, key or offset asked for."""

    code = 12


class GroupNotFoundError(FerryError):
    """The consumer group does not exist."""

    code = 13


class RequestTimeoutError(FerryError):
    """No response arrived in time (raised by clients, never sent on the wire)."""

    code = 14
    retriable = True


class ConnectionLostError(FerryError):
    """The connection closed before the response arrived (client side)."""

    code = 15
    retriable = True


class StoreError(FerryError):
    """The log store failed: an I/O error, or a closed store."""

    code = 16


class CorruptRecordError(StoreError):
    """A stored record failed its checksum or structure check; it is never served."""

    code = 17


class AlreadyExistsError(FerryError):
    """Creating something (a topic, a group) that already exists."""

    code = 18


class StoreUnavailableError(FerryError):
    """The broker's log store cannot take writes (I/O error, full disk); send elsewhere."""

    code = 19
    retriable = True


class InvalidDelayError(FerryError, ValueError):
    """A delay or delivery time out of range (negative, or beyond the broker's maximum)."""

    code = 20


class AlreadyDeliveredError(FerryError):
    """Cancelling a delayed message that was already delivered to its topic."""

    code = 21


class TransactionStateError(FerryError):
    """Ending a transaction the other way than it already ended (commit after rollback)."""

    code = 22


class InvalidFilterError(FerryError, ValueError):
    """A subscription's tag or SQL92 expression does not parse or breaks a filter limit.

    Raised locally (`Consumer.start()`, `ferry.filter.compile_sql`) it carries
    where the expression went wrong: `line` and `column` (1-based; 0 when not
    about a position) and `expected` (what the parser could have taken there).
    From the wire only the message is known; it says the same in words.
    """

    code = 23

    def __init__(self, message: str, *, line: int = 0, column: int = 0,
                 expected: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.line = line
        self.column = column
        self.expected = expected


class NotMasterError(NoPermissionError):
    """This broker is not (or no longer) its group's master: refresh the route and retry.

    A slave refuses writes with it, and so does a master whose election lease it
    could not renew in time (it steps down before the lease can expire, so two
    masters never both acknowledge writes)."""

    code = 24
    retriable = True


class DuplicateMessage(FerryError):  # noqa: N818 - the name the idempotence API promises
    """A consumer's ledger already holds this (scene, business key): the message was processed.

    Raised by `ferry.idempotence.Ledger.record` inside the caller's own
    transaction; letting it propagate rolls that transaction back, so the
    business change of a duplicate never commits. Not retriable: the same
    message will always be a duplicate.
    """

    code = 25

    def __init__(self, message: str = "", *, scene: str = "", biz_key: str = "") -> None:
        super().__init__(message or f"already recorded: scene={scene}, biz_key={biz_key}")
        self.scene = scene
        self.biz_key = biz_key


class AuthenticationError(FerryError):
    """The request is not authenticated: no credentials, an unknown or disabled access key,
    a bad signature, a stale timestamp or a replayed nonce (the message says which).

    Not retriable: the same request will be refused again (a replayed one by design).
    """

    code = 26


class AccessDeniedError(FerryError):
    """The caller is authenticated but not permitted; the message names the action and resource."""

    code = 27


class MessageTypeMismatchError(FerryError):
    """The message's kind is not the one its topic takes (the topic's `type`: a `fifo` topic
    takes messages with a key, a `delay` topic delayed ones, a `transaction` topic
    transactional halves); the message names both. Not retriable: sent again, it is refused
    again."""

    code = 28


class BroadcastNotAllowedError(FerryError):
    """A broadcasting consumer joined a group whose config has `broadcast_allowed` false."""

    code = 29


class DiskFullError(FerryError):
    """The broker's disk is at its high-water mark: it takes no new writes until usage falls
    below the low-water mark (its consumers read, retention frees what they passed). Send to
    another broker, or again later."""

    code = 30
    retriable = True


def _all_subclasses(cls: type[FerryError]) -> list[type[FerryError]]:
    out: list[type[FerryError]] = []
    for sub in cls.__subclasses__():
        out.append(sub)
        out.extend(_all_subclasses(sub))
    return out


def _build_registry() -> dict[int, type[FerryError]]:
    registry: dict[int, type[FerryError]] = {}
    for cls in _all_subclasses(FerryError):
        if "code" not in cls.__dict__:
            continue  # a refinement of its parent (e.g. the wire's MalformedFrameError)
        if cls.code in registry:
            raise RuntimeError(f"wire code {cls.code} is used by {registry[cls.code]} and {cls}")
        registry[cls.code] = cls
    return registry


ERRORS_BY_CODE: dict[int, type[FerryError]] = _build_registry()


def error_for_code(code: int, message: str) -> FerryError:
    """The exception for a wire error code; unknown codes become a plain FerryError."""
    cls = ERRORS_BY_CODE.get(code)
    if cls is None:
        err = FerryError(f"error code {code}: {message}")
        err.code = code
        return err
    return cls(message)
