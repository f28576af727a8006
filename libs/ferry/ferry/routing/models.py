"""The values that routing keeps in etcd: a live broker, a topic's config, a group's config.

Each value is a frozen dataclass that validates itself when built, so an
invalid one never exists in memory, and converts to and from the JSON stored
under the etcd keys of docs/internals.md. `from_dict(..., strict=True)` is for
input from users (the namesrv API): unknown fields are rejected. The default,
lenient form ignores unknown fields so that values written by a newer Ferry
still load.
"""
from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ferry.codec.limits import MAX_QUEUES
from ferry.errors import MalformedRequestError
from ferry.names import Perm, validate_group, validate_topic

MIN_QUEUES = 1
DEFAULT_QUEUES = 8
MAX_RETRY = 64
#: Back-off before each redelivery of a nacked message: RocketMQ's delay levels from its
#: third on (10s 30s 1m 2m ... 2h). Attempt n (1-based) waits the n-th; later ones the last.
DEFAULT_RETRY_BACKOFF_MS: tuple[int, ...] = (
    10_000, 30_000, 60_000, 120_000, 180_000, 240_000, 300_000, 360_000, 420_000, 480_000,
    540_000, 600_000, 1_200_000, 1_800_000, 3_600_000, 7_200_000)
MAX_RETRY_BACKOFF_STEPS = 64
MAX_RETRY_BACKOFF_MS = 30 * 24 * 3600 * 1000   # the delay path's own maximum (30 days)
TOPIC_PERMS = ("rw", "r", "w")
TOPIC_TYPES = ("normal", "fifo", "delay", "transaction")
CONSUME_FROM = ("latest", "earliest", "timestamp")
#: A broker's role in its group; "" = a broker that does not replicate (id 0 is master).
BROKER_ROLES = ("", "master", "slave")
MAX_ADDR_LENGTH = 255
#: Priority levels a topic may have: each level is a set of its queues on every broker
#: (queue q of Q serves level q * levels // Q), drained highest first by consumers.
MIN_PRIORITY_LEVELS = 1
MAX_PRIORITY_LEVELS = 4
#: A topic's own retention (absent: the broker's): time up to ten years, size per queue
#: up to 2**53 bytes (exact in every JSON reader).
MIN_RETENTION_MS = 1
MAX_RETENTION_MS = 10 * 365 * 24 * 3_600_000
MIN_RETENTION_BYTES = 1
MAX_RETENTION_BYTES = 2**53

# Cluster and broker names follow the same rule as user topic names.
_BROKER_NAME = re.compile(r"[A-Za-z0-9_-]{1,127}")


class InvalidConfigError(MalformedRequestError, ValueError):
    """A broker, topic or group value has a field of the wrong type or out of range."""


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise InvalidConfigError(message)


def _int_in(value: object, what: str, low: int, high: int) -> int:
    # bool is an int subclass; `"queues": true` is a mistake, not 1.
    _require(isinstance(value, int) and not isinstance(value, bool),
             f"{what} must be an integer, got {value!r}")
    assert isinstance(value, int)
    _require(low <= value <= high, f"{what} must be in {low}..{high}, got {value}")
    return value


def _choice(value: object, what: str, choices: tuple[str, ...]) -> str:
    _require(isinstance(value, str) and value in choices,
             f"{what} must be one of {', '.join(choices)}; got {value!r}")
    assert isinstance(value, str)
    return value


def validate_broker_name(name: object, what: str = "broker name") -> str:
    """Return `name` if it is a valid cluster or broker name, else raise InvalidConfigError."""
    _require(isinstance(name, str) and _BROKER_NAME.fullmatch(name) is not None,
             f"invalid {what} {name!r}: names match [A-Za-z0-9_-]{{1,127}}")
    assert isinstance(name, str)
    return name


def _addr(value: object, what: str, *, required: bool) -> str:
    _require(isinstance(value, str), f"{what} must be a string, got {value!r}")
    assert isinstance(value, str)
    if not value:
        _require(not required, f"{what} is required")
        return value
    host, sep, port = value.rpartition(":")
    _require(bool(sep) and bool(host) and port.isdigit() and 0 < int(port) < 65536
             and len(value) <= MAX_ADDR_LENGTH,
             f"{what} must be 'host:port', got {value!r}")
    return value


def _fields(data: object, known: frozenset[str], what: str, strict: bool) -> Mapping[str, Any]:
    _require(isinstance(data, Mapping), f"{what} must be a JSON object, got {type(data).__name__}")
    assert isinstance(data, Mapping)
    if strict:
        unknown = sorted(str(k) for k in data if k not in known)
        _require(not unknown, f"unknown {what} field(s): {', '.join(unknown)}")
    return data


def _loads(raw: bytes | str, what: str) -> object:
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidConfigError(f"{what} is not valid JSON: {exc}") from None
    except RecursionError:
        raise InvalidConfigError(f"{what} JSON nests too deeply") from None


def _dumps(data: Mapping[str, Any]) -> bytes:
    return json.dumps(data, separators=(",", ":"), sort_keys=True).encode()


@dataclass(frozen=True)
class BrokerInfo:
    """A live broker as registered under /ferry/brokers/{cluster}/{name}/{id}.

    `role` is "master" or "slave" as the broker group's election in etcd made
    it (docs/replication.md), and `epoch` the term it last saw; a broker that
    does not replicate registers "" and then `broker_id` 0 is the master, as
    before replication. Several keys of a group may say "master" for a moment
    (a dead master's key outlives it until its lease ends): the one with the
    highest epoch is the master. `topics` maps each topic the broker serves to
    its queue count there.
    """

    cluster: str
    name: str
    broker_id: int
    addr: str
    repl_addr: str = ""
    http_addr: str = ""
    topics: dict[str, int] = field(default_factory=dict)
    role: str = ""
    epoch: int = 0

    def __post_init__(self) -> None:
        validate_broker_name(self.cluster, "cluster name")
        _choice(self.role, "role", BROKER_ROLES)
        _int_in(self.epoch, "epoch", 0, (1 << 63) - 1)
        validate_broker_name(self.name)
        _int_in(self.broker_id, "broker_id", 0, 1 << 16)
        _addr(self.addr, "addr", required=True)
        _addr(self.repl_addr, "repl_addr", required=False)
        _addr(self.http_addr, "http_addr", required=False)
        _require(isinstance(self.topics, dict), "topics must be an object of topic -> queues")
        for topic, queues in self.topics.items():
            validate_topic(topic, allow_internal=True)
            _int_in(queues, f"queues of topic {topic!r}", MIN_QUEUES, MAX_QUEUES)

    @property
    def is_master(self) -> bool:
        return self.role == "master" if self.role else self.broker_id == 0

    @property
    def key(self) -> tuple[str, str, int]:
        """The identity used by the route cache: (cluster, name, broker_id)."""
        return (self.cluster, self.name, self.broker_id)

    def to_dict(self) -> dict[str, Any]:
        return {"cluster": self.cluster, "name": self.name, "id": self.broker_id,
                "addr": self.addr, "repl_addr": self.repl_addr, "http_addr": self.http_addr,
                "topics": dict(self.topics), "role": self.role, "epoch": self.epoch}

    def to_json(self) -> bytes:
        return _dumps(self.to_dict())

    @classmethod
    def from_dict(cls, data: object, *, strict: bool = False) -> BrokerInfo:
        d = _fields(data, _BROKER_FIELDS, "broker", strict)
        for required in ("cluster", "name", "id", "addr"):
            _require(required in d, f"broker field {required!r} is required")
        topics = d.get("topics", {})
        _require(isinstance(topics, dict), "topics must be an object of topic -> queues")
        return cls(cluster=d["cluster"], name=d["name"], broker_id=d["id"], addr=d["addr"],
                   repl_addr=d.get("repl_addr", ""), http_addr=d.get("http_addr", ""),
                   topics=dict(topics), role=d.get("role", ""), epoch=d.get("epoch", 0))

    @classmethod
    def from_json(cls, raw: bytes | str, *, strict: bool = False) -> BrokerInfo:
        return cls.from_dict(_loads(raw, "broker"), strict=strict)


_BROKER_FIELDS = frozenset({"cluster", "name", "id", "addr", "repl_addr", "http_addr", "topics",
                            "role", "epoch"})


@dataclass(frozen=True)
class TopicConfig(Perm):
    """A topic's configuration under /ferry/topics/{topic}.

    `queues` is the queue count on each broker group that serves the topic;
    `brokers` names those broker groups, and empty means every master.
    `priority_levels` (1..4, at most `queues`) splits each broker's queues into
    that many levels: queue q serves level `q * priority_levels // queues`, and a
    consumer drains a higher level before a lower one (see docs/client.md).
    `retention_ms` and `retention_bytes` (per queue) are the topic's own retention;
    None (absent in JSON) keeps the broker's (docs/broker.md, "Per-topic retention").
    """

    name: str
    queues: int = DEFAULT_QUEUES
    perm: str = "rw"
    type: str = "normal"
    brokers: tuple[str, ...] = ()
    priority_levels: int = MIN_PRIORITY_LEVELS
    retention_ms: int | None = None
    retention_bytes: int | None = None

    def __post_init__(self) -> None:
        validate_topic(self.name, allow_internal=True)
        if self.retention_ms is not None:
            _int_in(self.retention_ms, "retention_ms", MIN_RETENTION_MS, MAX_RETENTION_MS)
        if self.retention_bytes is not None:
            _int_in(self.retention_bytes, "retention_bytes", MIN_RETENTION_BYTES,
                    MAX_RETENTION_BYTES)
        _int_in(self.queues, "queues", MIN_QUEUES, MAX_QUEUES)
        _int_in(self.priority_levels, "priority_levels", MIN_PRIORITY_LEVELS,
                MAX_PRIORITY_LEVELS)
        _require(self.priority_levels <= self.queues,
                 f"priority_levels ({self.priority_levels}) may not exceed queues "
                 f"({self.queues}): each level needs a queue on every broker")
        _choice(self.perm, "perm", TOPIC_PERMS)
        _choice(self.type, "type", TOPIC_TYPES)
        _require(isinstance(self.brokers, tuple), "brokers must be a tuple of broker names")
        for name in self.brokers:
            validate_broker_name(name)
        _require(len(set(self.brokers)) == len(self.brokers), "brokers lists a name twice")

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "queues": self.queues, "perm": self.perm,
                "type": self.type, "brokers": list(self.brokers),
                "priority_levels": self.priority_levels,
                **{k: v for k, v in (("retention_ms", self.retention_ms),
                                     ("retention_bytes", self.retention_bytes)) if v is not None}}

    def to_json(self) -> bytes:
        return _dumps(self.to_dict())

    @classmethod
    def from_dict(cls, data: object, *, strict: bool = False, name: str | None = None
                  ) -> TopicConfig:
        """Build from JSON fields; `name`, when given (the URL's), must agree with the body's."""
        d = _fields(data, _TOPIC_FIELDS, "topic", strict)
        body_name = d.get("name", name)
        _require(body_name is not None, "topic field 'name' is required")
        _require(name is None or body_name == name,
                 f"topic name in the body {body_name!r} differs from the URL's {name!r}")
        brokers = d.get("brokers", [])
        _require(isinstance(brokers, list | tuple), "brokers must be a list of broker names")
        return cls(name=body_name, queues=d.get("queues", DEFAULT_QUEUES),
                   perm=d.get("perm", "rw"), type=d.get("type", "normal"),
                   brokers=tuple(brokers),
                   priority_levels=d.get("priority_levels", MIN_PRIORITY_LEVELS),
                   retention_ms=d.get("retention_ms"), retention_bytes=d.get("retention_bytes"))

    @classmethod
    def from_json(cls, raw: bytes | str, *, strict: bool = False) -> TopicConfig:
        return cls.from_dict(_loads(raw, "topic"), strict=strict)


_TOPIC_FIELDS = frozenset({"name", "queues", "perm", "type", "brokers", "priority_levels",
                           "retention_ms", "retention_bytes"})


@dataclass(frozen=True)
class GroupConfig:
    """A consumer group's configuration under /ferry/groups/{group}.

    `retry_max` (RocketMQ's `max_reconsume_times`; the JSON name
    `max_reconsume_times` is accepted as an alias on input) is how often a
    failed message is redelivered before it goes to the group's dead-letter
    topic; `retry_backoff_ms` is the wait before each redelivery (attempt n
    waits its n-th value, attempts beyond the list its last); `consume_from`
    says where a group with no committed offset starts (at
    `consume_timestamp_ms` for "timestamp"). `created_ms` is when namesrv first
    stored the group (0: unknown): a broker whose committed-offset table began
    later lost the group's offsets, or is newer than the group (issue 16).
    """

    name: str
    retry_max: int = 16
    broadcast_allowed: bool = True
    consume_from: str = "latest"
    consume_timestamp_ms: int = 0
    retry_backoff_ms: tuple[int, ...] = DEFAULT_RETRY_BACKOFF_MS
    created_ms: int = 0

    def __post_init__(self) -> None:
        validate_group(self.name)
        _int_in(self.created_ms, "created_ms", 0, (1 << 63) - 1)
        _int_in(self.retry_max, "retry_max", 0, MAX_RETRY)
        _require(isinstance(self.retry_backoff_ms, tuple)
                 and 1 <= len(self.retry_backoff_ms) <= MAX_RETRY_BACKOFF_STEPS,
                 f"retry_backoff_ms must be a list of 1..{MAX_RETRY_BACKOFF_STEPS} integers")
        for step in self.retry_backoff_ms:
            _int_in(step, "a retry_backoff_ms value", 0, MAX_RETRY_BACKOFF_MS)
        _require(isinstance(self.broadcast_allowed, bool),
                 f"broadcast_allowed must be true or false, got {self.broadcast_allowed!r}")
        _choice(self.consume_from, "consume_from", CONSUME_FROM)
        _int_in(self.consume_timestamp_ms, "consume_timestamp_ms", 0, (1 << 63) - 1)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "retry_max": self.retry_max,
                "broadcast_allowed": self.broadcast_allowed, "consume_from": self.consume_from,
                "consume_timestamp_ms": self.consume_timestamp_ms,
                "retry_backoff_ms": list(self.retry_backoff_ms), "created_ms": self.created_ms}

    def to_json(self) -> bytes:
        return _dumps(self.to_dict())

    def backoff_ms(self, attempt: int) -> int:
        """The wait before redelivery `attempt` (1 = the first retry)."""
        steps = self.retry_backoff_ms
        return steps[min(max(attempt, 1), len(steps)) - 1]

    @classmethod
    def from_dict(cls, data: object, *, strict: bool = False, name: str | None = None
                  ) -> GroupConfig:
        """Build from JSON fields; `name`, when given (the URL's), must agree with the body's."""
        d = _fields(data, _GROUP_FIELDS, "group", strict)
        body_name = d.get("name", name)
        _require(body_name is not None, "group field 'name' is required")
        _require(name is None or body_name == name,
                 f"group name in the body {body_name!r} differs from the URL's {name!r}")
        _require(not ("retry_max" in d and "max_reconsume_times" in d),
                 "give retry_max or its alias max_reconsume_times, not both")
        backoff = d.get("retry_backoff_ms", DEFAULT_RETRY_BACKOFF_MS)
        _require(isinstance(backoff, list | tuple),
                 f"retry_backoff_ms must be a list of integers, got {backoff!r}")
        return cls(name=body_name, retry_max=d.get("retry_max", d.get("max_reconsume_times", 16)),
                   broadcast_allowed=d.get("broadcast_allowed", True),
                   consume_from=d.get("consume_from", "latest"),
                   consume_timestamp_ms=d.get("consume_timestamp_ms", 0),
                   retry_backoff_ms=tuple(backoff), created_ms=d.get("created_ms", 0))

    @classmethod
    def from_json(cls, raw: bytes | str, *, strict: bool = False) -> GroupConfig:
        return cls.from_dict(_loads(raw, "group"), strict=strict)


_GROUP_FIELDS = frozenset({"name", "retry_max", "max_reconsume_times", "broadcast_allowed",
                           "consume_from", "consume_timestamp_ms", "retry_backoff_ms",
                           "created_ms"})
