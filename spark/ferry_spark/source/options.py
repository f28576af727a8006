"""The `ferry` data source's options: parsed and checked once, on the driver, at planning.

Offsets are given as "earliest", "latest" or JSON naming queues:
`{"<broker>": {"<queue_id>": offset}}` (one topic) or
`{"<topic>": {"<broker>": {"<queue_id>": offset}}}` (any read), where an
offset of -2 means the queue's earliest and -1 its latest (Kafka's
convention). A queue the JSON does not name takes the default: earliest for
a start, latest for an end.
"""
from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ferry.auth.credentials import Credentials
from ferry.errors import FerryError, MalformedRequestError
from ferry.filter import Sql, Subscription
from ferry.names import validate_group, validate_topic

from ferry_spark.errors import SourceOptionError

EARLIEST = -2
LATEST = -1
#: queue spec: (topic, broker, queue_id) -> offset (or EARLIEST / LATEST); topic None: any
QueueOffsets = dict[tuple[str | None, str, int], int]

READ_OPTIONS = frozenset({
    "namesrv", "topic", "topicpattern", "startingoffsets", "endingoffsets",
    "startingtimestampms", "endingtimestampms", "offsetoutofrange", "maxoffsetspertrigger",
    "minpartitions", "filter", "filtertype", "pushdownpredicate", "groupid", "path",
    "storedir", "broker", "requesttimeoutms", "accesskey", "secretkey"})
FILTER_TYPES = ("TAG", "SQL92")
WRITE_OPTIONS = frozenset({"namesrv", "topic", "requesttimeoutms", "path", "accesskey",
                           "secretkey"})
# Options Spark itself may pass along with the user's.
_SPARK_OPTIONS = frozenset({"checkpointlocation", "queryname", "path"})
DEFAULT_REQUEST_TIMEOUT_MS = 30_000
POLICIES = ("fail", "clamp")


@dataclass(frozen=True)
class OffsetSpec:
    """Where each queue's range starts or ends: a default plus named queues."""

    default: int                       # EARLIEST or LATEST
    queues: QueueOffsets = field(default_factory=dict)
    timestamp_ms: int | None = None    # resolved per queue with OFFSET_FOR_TIME

    def for_queue(self, topic: str, broker: str, queue_id: int) -> int:
        got = self.queues.get((topic, broker, queue_id))
        return self.queues.get((None, broker, queue_id), self.default) if got is None else got


@dataclass(frozen=True)
class ReadFilter:
    """What the broker filters a read by: a tag expression and/or a SQL92 selector.

    Kept as text (the compiled forms do not pickle into tasks); `fields()` are the
    PULL's `tags` and `sql`, as a consumer's subscription sends them.
    """

    tags: str | None = None
    sql: str | None = None

    def subscription(self) -> Subscription:
        sub = Subscription.of(Sql(self.sql) if self.sql is not None else self.tags)
        if self.sql is not None and self.tags is not None:
            sub = Subscription(Subscription.of(self.tags).tags, sub.sql)
        return sub

    def fields(self) -> dict[str, Any]:
        return self.subscription().to_fields()

    @property
    def is_all(self) -> bool:
        return self.subscription().is_all


@dataclass(frozen=True)
class ReadOptions:
    """A read's options, checked. `store_dir` set: read that directory, not the network.

    `topics` lists the topics read (`topic`, a comma list); with `topic_pattern` the
    topics are those whose names match it, looked up at each planning.
    """

    topics: tuple[str, ...]
    namesrv: str | None
    store_dir: str | None
    broker: str | None
    starting: OffsetSpec
    ending: OffsetSpec
    fail_out_of_range: bool
    max_offsets_per_trigger: int | None
    request_timeout_ms: int
    #: accessKey/secretKey; None: each process (driver, executor) signs with its environment's
    credentials: Credentials | None = None
    topic_pattern: str | None = None
    min_partitions: int | None = None
    filter: ReadFilter = field(default_factory=ReadFilter)
    push_down_predicate: bool = False
    group_id: str | None = None

    @property
    def topic(self) -> str:
        """The topic of a one-topic read (store-dir reads), else the option as given."""
        return ",".join(self.topics) if self.topics else f"/{self.topic_pattern}/"


def _lower(options: Mapping[str, str]) -> dict[str, str]:
    return {str(k).lower(): str(v) for k, v in options.items() if v is not None}


def _check_known(opts: Mapping[str, str], known: frozenset[str]) -> None:
    unknown = sorted(k for k in opts if k not in known and k not in _SPARK_OPTIONS
                     and not k.startswith("spark."))
    if unknown:
        raise SourceOptionError(f"ferry source: unknown option(s) {', '.join(unknown)}; "
                                f"known: {', '.join(sorted(known))}")


def _credentials(opts: Mapping[str, str], what: str) -> Credentials | None:
    """The accessKey/secretKey options as Credentials (None when neither is given).

    The secret never goes into a message: Credentials keeps it out of its repr,
    and a bad secret is reported without its value.
    """
    access_key, secret_key = opts.get("accesskey") or "", opts.get("secretkey") or ""
    if not access_key and not secret_key:
        return None
    if not access_key or not secret_key:
        raise SourceOptionError(f"ferry {what}: options accessKey and secretKey go together")
    try:
        return Credentials(access_key, secret_key)
    except MalformedRequestError as exc:
        raise SourceOptionError(f"ferry {what}: option accessKey/secretKey: {exc}") from None


def signing_credentials(given: Credentials | None) -> Credentials | None:
    """What a client of the source signs with: the options' credentials, else
    FERRY_ACCESS_KEY/FERRY_SECRET_KEY of this process (driver or executor), else none."""
    return given if given is not None else Credentials.from_env()


def _int(opts: Mapping[str, str], name: str, minimum: int) -> int | None:
    raw = opts.get(name.lower())
    if raw is None or raw == "":
        return None
    try:
        value = int(raw)
    except ValueError:
        raise SourceOptionError(f"ferry source: option {name} must be an integer, "
                                f"got {raw!r}") from None
    if value < minimum:
        raise SourceOptionError(f"ferry source: option {name} must be >= {minimum}, got {value}")
    return value


def parse_offsets(raw: str | None, name: str, default: int,
                  allowed: tuple[str, ...] = ("earliest", "latest")) -> OffsetSpec:
    """`raw` ("earliest", "latest" or per-queue JSON) as an OffsetSpec."""
    if raw is None or raw.strip() == "":
        return OffsetSpec(default)
    text = raw.strip()
    if text.lower() in allowed:
        return OffsetSpec(EARLIEST if text.lower() == "earliest" else LATEST)
    try:
        data: Any = json.loads(text)
    except ValueError:
        raise SourceOptionError(
            f"ferry source: option {name} must be {' or '.join(allowed)} or JSON like "
            f'{{"broker-a": {{"0": 42}}}}, got {raw!r}') from None
    if not isinstance(data, dict):
        raise SourceOptionError(f"ferry source: option {name} JSON must be an object "
                                f"of brokers, got {raw!r}")
    queues: QueueOffsets = {}
    for outer, inner in data.items():
        if not isinstance(inner, dict):
            raise SourceOptionError(f"ferry source: option {name}: broker {outer!r} must map "
                                    f"queue ids to offsets, got {inner!r}")
        # {"topic": {"broker": {...}}} names topics first; {"broker": {...}} any topic.
        if any(isinstance(v, dict) for v in inner.values()):
            for broker, per_queue in inner.items():
                _queue_offsets(queues, name, str(outer), broker, per_queue)
        else:
            _queue_offsets(queues, name, None, outer, inner)
    return OffsetSpec(default, queues)


def _queue_offsets(queues: QueueOffsets, name: str, topic: str | None, broker: str,
                   per_queue: Any) -> None:
    if not isinstance(per_queue, dict):
        raise SourceOptionError(f"ferry source: option {name}: broker {broker!r} must map "
                                f"queue ids to offsets, got {per_queue!r}")
    for qid, offset in per_queue.items():
        if not str(qid).isdigit() or isinstance(offset, bool) or not isinstance(offset, int) \
                or offset < EARLIEST:
            raise SourceOptionError(
                f"ferry source: option {name}: {broker}/{qid} must be a queue id mapped to "
                f"an offset >= 0 (or -2 earliest, -1 latest), got {offset!r}")
        queues[(topic, str(broker), int(qid))] = offset


def _policy(opts: Mapping[str, str]) -> bool:
    policy = opts.get("offsetoutofrange", "fail").strip().lower()
    if policy not in POLICIES:
        raise SourceOptionError(f"ferry source: option offsetOutOfRange must be fail or clamp, "
                                f"got {policy!r}")
    return policy == "fail"


def read_options(options: Mapping[str, str], *, stream: bool | None) -> ReadOptions:
    """The checked options of a batch (`stream` False) or streaming read.

    `stream` None (at `load()`, before Spark says which) checks what both share.
    """
    opts = _lower(options)
    _check_known(opts, READ_OPTIONS)
    topics, pattern = _topics(opts)
    store_dir = opts.get("storedir") or opts.get("path") or None
    if store_dir is not None and (pattern is not None or len(topics) > 1):
        raise SourceOptionError("ferry source: a path/storeDir read takes one topic")
    namesrv = opts.get("namesrv") or None
    if store_dir is None and namesrv is None:
        namesrv = os.environ.get("FERRY_NAMESRV")
        if namesrv is None:
            raise SourceOptionError("ferry source: option namesrv (or path/storeDir for an "
                                    "offline read of a broker data directory) is required")
    if store_dir is not None and stream is True:
        raise SourceOptionError("ferry source: path/storeDir (an offline store read) is for "
                                "batch reads only")
    if stream is True and ("endingoffsets" in opts or "endingtimestampms" in opts):
        raise SourceOptionError("ferry source: endingOffsets/endingTimestampMs are for batch "
                                "reads only")
    if stream is False and "maxoffsetspertrigger" in opts:
        raise SourceOptionError("ferry source: maxOffsetsPerTrigger is for streaming reads only")
    group_id = _group(opts)
    if stream is False and group_id is not None:
        raise SourceOptionError("ferry source: groupId is for streaming reads only (a batch "
                                "read commits no offsets)")
    start_default = LATEST if stream else EARLIEST
    starting = parse_offsets(opts.get("startingoffsets"), "startingOffsets", start_default)
    ending = parse_offsets(opts.get("endingoffsets"), "endingOffsets", LATEST,
                           allowed=("latest",))
    start_ts = _int(opts, "startingTimestampMs", 0)
    end_ts = _int(opts, "endingTimestampMs", 0)
    if start_ts is not None:
        if "startingoffsets" in opts:
            raise SourceOptionError("ferry source: give startingOffsets or startingTimestampMs, "
                                    "not both")
        starting = OffsetSpec(start_default, timestamp_ms=start_ts)
    if end_ts is not None:
        if "endingoffsets" in opts:
            raise SourceOptionError("ferry source: give endingOffsets or endingTimestampMs, "
                                    "not both")
        ending = OffsetSpec(LATEST, timestamp_ms=end_ts)
    read_filter = _filter(opts)
    if store_dir is not None and (not read_filter.is_all or _flag(opts, "pushDownPredicate")):
        raise SourceOptionError("ferry source: filter/pushDownPredicate are for network reads "
                                "(the broker filters), not path/storeDir")
    return ReadOptions(
        topics=topics, topic_pattern=pattern, namesrv=namesrv, store_dir=store_dir, broker=opts.get("broker") or None,
        starting=starting, ending=ending, fail_out_of_range=_policy(opts),
        max_offsets_per_trigger=_int(opts, "maxOffsetsPerTrigger", 1),
        request_timeout_ms=_int(opts, "requestTimeoutMs", 1) or DEFAULT_REQUEST_TIMEOUT_MS,
        credentials=_credentials(opts, "source"),
        min_partitions=_int(opts, "minPartitions", 1), filter=read_filter,
        push_down_predicate=_flag(opts, "pushDownPredicate"), group_id=group_id)


def _topics(opts: Mapping[str, str]) -> tuple[tuple[str, ...], str | None]:
    """`topic` (a comma list) or `topicPattern` (a regex), checked: exactly one is given."""
    raw, pattern = opts.get("topic") or "", opts.get("topicpattern") or ""
    if not raw.strip() and not pattern:
        raise SourceOptionError("ferry source: option topic is required (a name or a comma "
                                "list; or topicPattern, a regex)")
    if raw.strip() and pattern:
        raise SourceOptionError("ferry source: give option topic or topicPattern, not both")
    if pattern:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise SourceOptionError(f"ferry source: option topicPattern: {exc}") from None
        return (), pattern
    topics = tuple(dict.fromkeys(t.strip() for t in raw.split(",") if t.strip()))
    for topic in topics:
        _named(topic, lambda t: validate_topic(t, allow_internal=True),
               "ferry source: option topic")
    return topics, None


def _filter(opts: Mapping[str, str]) -> ReadFilter:
    """The `filter` option as a ReadFilter of its `filterType` (TAG or SQL92), compiled
    once here so that a bad expression fails the read at load(), naming its position."""
    kind = opts.get("filtertype", "TAG").strip().upper()
    if kind not in FILTER_TYPES:
        raise SourceOptionError(f"ferry source: option filterType must be TAG or SQL92, "
                                f"got {kind!r}")
    expression = opts.get("filter", "").strip()
    if not expression:
        return ReadFilter()
    out = ReadFilter(sql=expression) if kind == "SQL92" else ReadFilter(tags=expression)
    try:
        out.subscription()
    except FerryError as exc:
        raise SourceOptionError(f"ferry source: option filter ({kind}): {exc}") from None
    return out


def _flag(opts: Mapping[str, str], name: str) -> bool:
    raw = opts.get(name.lower(), "false").strip().lower()
    if raw not in ("true", "false"):
        raise SourceOptionError(f"ferry source: option {name} must be true or false, got {raw!r}")
    return raw == "true"


def _named(name: str | None, check: Callable[[str], object], what: str) -> str | None:
    """`name` if `check` accepts it (None stays None), else SourceOptionError naming `what`."""
    if name is not None:
        try:
            check(name)
        except ValueError as exc:
            raise SourceOptionError(f"{what}: {exc}") from None
    return name


def _group(opts: Mapping[str, str]) -> str | None:
    return _named(opts.get("groupid") or None, validate_group, "ferry source: option groupId")


@dataclass(frozen=True)
class WriteOptions:
    """A write's options: `topic` None means each row names its own (a `topic` column)."""

    namesrv: str
    topic: str | None
    request_timeout_ms: int
    credentials: Credentials | None = None   # as ReadOptions.credentials


def write_options(options: Mapping[str, str]) -> WriteOptions:
    opts = _lower(options)
    _check_known(opts, WRITE_OPTIONS)
    namesrv = opts.get("namesrv") or os.environ.get("FERRY_NAMESRV")
    if not namesrv:
        raise SourceOptionError("ferry sink: option namesrv is required")
    topic = _named(opts.get("topic") or None, validate_topic, "ferry sink: option topic")
    return WriteOptions(namesrv, topic,
                        _int(opts, "requestTimeoutMs", 1) or DEFAULT_REQUEST_TIMEOUT_MS,
                        _credentials(opts, "sink"))
