"""The topic → task bridge: each message of a topic becomes one Celery task.

`ferry celery-bridge --topic orders --group billing --task app.tasks.bill`
consumes `orders` in the group `billing` and for each message calls
`app.send_task("app.tasks.bill", args=(body, meta), task_id=<message id>)`
(`send_task` is `apply_async` by task name: the bridge need not import the
task's code). The task therefore receives:

- `body`: the message body decoded as JSON when it parses, else its UTF-8
  text, else `{"base64": "<the bytes, base64>"}`;
- `meta`: `{"msg_id", "topic", "key", "keys", "tags", "properties", "broker",
  "queue_id", "queue_offset", "born_ts_ms", "store_ts_ms", "reconsume_times"}`;

and headers `ferry_topic`, `ferry_queue_id`, `ferry_queue_offset`, `ferry_key`
(read by `ferry.celery.idempotent.TaskRef`). The offset of a message is
committed only after its publish returned (the Celery broker accepted the
task): a bridge killed before that sends it again, under the same task id,
so an idempotent task (`idempotent_task`) runs it once. A publish that fails
(the Celery broker away beyond kombu's own retries) nacks the message: it
comes back through `%RETRY%<group>` with the group's back-off.

A traced message's publish is a `bridge` span, and the task's headers carry
its context (`TRACEPARENT`), so the worker's `task` span continues the
message's trace (see `ferry.celery.tracing`).
"""
from __future__ import annotations

import asyncio
import base64
import json
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry.context import Context

from ferry.celery.idempotent import HEADER_KEY, HEADER_QUEUE_ID, HEADER_QUEUE_OFFSET, HEADER_TOPIC
from ferry.celery.tracing import bridge_span
from ferry.client import Consumer, ConsumerRecord
from ferry.client.core.tracing import record_context
from ferry.telemetry import tracing

log = logging.getLogger(__name__)

DEFAULT_CONCURRENCY = 8
MAX_CONCURRENCY = 256
#: How often (messages) the bridge logs its progress.
PROGRESS_EVERY = 1_000


def task_body(body: bytes) -> Any:
    """The message body as the task's first argument (see the module docstring)."""
    try:
        text = body.decode()
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(body).decode()}
    try:
        return json.loads(text)
    except ValueError:
        return text


def task_meta(record: ConsumerRecord) -> dict[str, Any]:
    """The message's metadata as the task's second argument."""
    return {"msg_id": record.msg_id, "topic": record.topic, "key": record.key,
            "keys": list(record.keys), "tags": record.tags,
            "properties": dict(record.properties), "broker": record.broker,
            "queue_id": record.queue_id, "queue_offset": record.queue_offset,
            "born_ts_ms": record.born_ts_ms, "store_ts_ms": record.store_ts_ms,
            "reconsume_times": record.reconsume_times}


def task_headers(record: ConsumerRecord) -> dict[str, Any]:
    return {HEADER_TOPIC: record.topic, HEADER_QUEUE_ID: record.queue_id,
            HEADER_QUEUE_OFFSET: record.queue_offset, HEADER_KEY: record.key}


@dataclass(frozen=True)
class BridgeConfig:
    topic: str
    group: str
    task: str
    namesrv: str | None = None
    auto_offset_reset: str | None = None   # None: the group's consume_from, else latest
    concurrency: int = DEFAULT_CONCURRENCY
    queue: str | None = None               # Celery queue to route to (default: the app's routing)

    def __post_init__(self) -> None:
        if not 1 <= self.concurrency <= MAX_CONCURRENCY:
            raise ValueError(f"concurrency must be in 1..{MAX_CONCURRENCY}")
        if not self.task:
            raise ValueError("--task names the Celery task to send")


class Bridge:
    """Consumes one topic and sends each message as a Celery task (see the module docstring)."""

    def __init__(self, app: Any, config: BridgeConfig) -> None:
        self.app = app
        self.config = config
        self.sent = 0
        self.failed = 0
        self._pool = ThreadPoolExecutor(config.concurrency, thread_name_prefix="ferry-bridge")

    def publish(self, record: ConsumerRecord, parent: Context | None = None) -> None:
        """Send one record as a task; returns once the Celery broker accepted it (blocking).

        `parent`: the trace context of a traced record (the consumer's `process`
        span): the publish is then a `bridge` span whose context the task carries."""
        options: dict[str, Any] = {}
        if self.config.queue:
            options["queue"] = self.config.queue
        c = self.config
        headers = task_headers(record)
        if parent is None:
            self.app.send_task(c.task, args=(task_body(record.body), task_meta(record)),
                               task_id=record.msg_id, headers=headers, **options)
            return
        with bridge_span(record.msg_id, record.topic, c.group, c.task, parent) as trace:
            self.app.send_task(c.task, args=(task_body(record.body), task_meta(record)),
                               task_id=record.msg_id, headers={**headers, **trace}, **options)

    async def _send(self, record: ConsumerRecord) -> None:
        parent = None
        if tracing().enabled and record_context(record) is not None:
            parent = otel_context.get_current()  # the executor thread would not see it
        try:
            await asyncio.get_running_loop().run_in_executor(self._pool, self.publish, record,
                                                             parent)
        except Exception:
            self.failed += 1
            raise   # run() nacks it: it comes back through the retry topic
        self.sent += 1
        if self.sent % PROGRESS_EVERY == 0:
            log.info("celery-bridge %s/%s: %d tasks sent", self.config.topic,
                     self.config.group, self.sent)

    async def run(self, stop: asyncio.Event) -> None:
        """Bridge until `stop` is set; then finish what is in flight and commit."""
        c = self.config
        consumer = Consumer(c.topic, group=c.group, namesrv=c.namesrv,
                            auto_offset_reset=c.auto_offset_reset)
        await consumer.start()
        try:
            runner = asyncio.ensure_future(consumer.run(self._send, concurrency=c.concurrency))
            waiter = asyncio.ensure_future(stop.wait())
            await asyncio.wait({runner, waiter}, return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
        finally:
            await consumer.stop()   # in-flight publishes get RUN_STOP_GRACE_MS, then commit
            self._pool.shutdown(wait=False)
        if runner.done() and not runner.cancelled() and runner.exception() is not None:
            raise runner.exception()  # type: ignore[misc]
