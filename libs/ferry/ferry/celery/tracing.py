"""Tracing for Celery on Ferry: the bridge's `bridge` span, the transport's hand-over, the task.

The trace of a traced Ferry message goes on into Celery as a task header:

- bridge: publishing a traced record as a task is a `bridge` span (PRODUCER),
  child of the bridge consumer's `process` span; the task's headers carry
  its context as `TRACEPARENT` / `TRACESTATE` (the same names as the message
  properties);
- transport (`ferry://`): a kombu message whose headers carry `TRACEPARENT`
  is sent to its Ferry topic as a traced message (the producer's `send` span
  is a child of that context), and a traced record handed to kombu carries
  its own context (the Ferry hops in between) in the task's headers;
- worker: a task whose request has `TRACEPARENT` runs under a `task` span
  (CONSUMER, operation `process`) with `ferry.outcome` ok / failed / retry.

`instrument()` connects the worker's signals (once per process; the `celery`
command's Ferry plugin and the `ferry://` transport call it). Only tasks with
trace context make spans: an untraced task costs one header lookup.
"""
from __future__ import annotations

import logging
import os
import threading
from collections.abc import Coroutine, Iterator, Mapping, MutableMapping
from contextlib import ExitStack, contextmanager
from typing import Any, TypeVar

from opentelemetry import context as otel_context
from opentelemetry.context import Context

from ferry.codec.system_properties import TRACEPARENT, TRACESTATE
from ferry.telemetry import extract, hop_span, inject, setup_tracing, tracing

log = logging.getLogger(__name__)
T = TypeVar("T")

#: Service names of the bridge's and the workers' spans.
BRIDGE_SERVICE = "ferry-celery-bridge"
WORKER_SERVICE = "ferry-celery-worker"
#: Span attributes beyond the ones every hop has.
TASK_NAME = "celery.task.name"
TASK_RETRIES = "celery.task.retries"
_OUTCOMES = {"SUCCESS": "ok", "FAILURE": "failed", "RETRY": "retry", "REVOKED": "revoked"}

_instrumented = False
_lock = threading.Lock()
# task id -> the ExitStack holding its open `task` span (prerun opens, postrun closes).
_running: dict[str, ExitStack] = {}


def trace_headers(headers: Mapping[str, Any]) -> dict[str, str]:
    """The trace context entries of a task's headers (empty when untraced)."""
    return {k: str(headers[k]) for k in (TRACEPARENT, TRACESTATE) if headers.get(k)}


def headers_context(headers: Mapping[str, Any]) -> Context | None:
    """The trace context a task's headers carry, or None."""
    if not headers.get(TRACEPARENT):
        return None
    return extract(trace_headers(headers))


@contextmanager
def bridge_span(msg_id: str, topic: str, group: str, task: str,
                parent: Context | None) -> Iterator[dict[str, str]]:
    """A `bridge` span around one publish; yields the headers that carry its context."""
    with hop_span("bridge", destination=task, msg_id=msg_id, parent=parent,
                  attributes={TASK_NAME: task, "ferry.origin_topic": topic,
                              "messaging.consumer.group.name": group}):
        headers: dict[str, str] = {}
        inject(headers)  # the bridge span is current here
        yield headers


async def in_context(ctx: Context, aw: Coroutine[Any, Any, T]) -> T:
    """Await `aw` with `ctx` as the current trace context (the transport's loop thread does
    not see the publishing thread's context)."""
    token = otel_context.attach(ctx)
    try:
        return await aw
    finally:
        otel_context.detach(token)


def set_trace_headers(headers: MutableMapping[str, Any], properties: Mapping[str, str]) -> None:
    """Replace a task's trace headers with the context a traced record carries."""
    for name in (TRACEPARENT, TRACESTATE):
        if name in properties:
            headers[name] = properties[name]
        else:
            headers.pop(name, None)


# -- the worker side ------------------------------------------------------------------------

def _namesrv(app: Any) -> str | None:
    url = str(getattr(getattr(app, "conf", None), "broker_url", "") or "")
    if url.startswith("ferry://"):
        return url[len("ferry://"):].split("/", 1)[0] or None
    return os.environ.get("FERRY_NAMESRV") or None


def _on_worker_init(sender: Any = None, **_: Any) -> None:
    setup_tracing(WORKER_SERVICE, namesrv=_namesrv(getattr(sender, "app", None)))


def _on_process_init(**_: Any) -> None:
    # A forked pool child: the parent's exporter threads did not come along. A fresh
    # Tracing for this process (setup_tracing would hand back the inherited one).
    from celery import current_app

    from ferry.telemetry import Tracing, TracingSettings, reset_tracing
    try:
        settings = TracingSettings.from_env()
    except ValueError as exc:
        log.warning("tracing off in this worker process: %s", exc)
        return
    reset_tracing(Tracing(WORKER_SERVICE, settings, _namesrv(current_app)))


def _on_shutdown(**_: Any) -> None:
    tracing().shutdown()


def _on_prerun(task_id: str | None = None, task: Any = None, **_: Any) -> None:
    if task_id is None or task is None or not tracing().enabled:
        return
    request = getattr(task, "request", None)
    parent = headers_context({k: getattr(request, k, None) for k in (TRACEPARENT, TRACESTATE)})
    if parent is None:
        return
    stack = ExitStack()
    stack.enter_context(hop_span(
        "task", destination=str(task.name), msg_id=task_id, parent=parent,
        attributes={TASK_NAME: str(task.name),
                    TASK_RETRIES: int(getattr(request, "retries", 0) or 0)}))
    _running[task_id] = stack


def _on_postrun(task_id: str | None = None, state: str | None = None, **_: Any) -> None:
    stack = _running.pop(task_id or "", None)
    if stack is None:
        return
    from opentelemetry import trace
    from opentelemetry.trace import Status, StatusCode
    span = trace.get_current_span()
    span.set_attribute("ferry.outcome", _OUTCOMES.get(str(state), str(state).lower()))
    if state == "FAILURE":
        span.set_status(Status(StatusCode.ERROR, "the task raised"))
    stack.close()


def instrument() -> None:
    """Connect the worker's tracing signals (idempotent; see the module docstring)."""
    global _instrumented
    with _lock:
        if _instrumented:
            return
        from celery import signals
        signals.worker_init.connect(_on_worker_init, weak=False)
        signals.worker_process_init.connect(_on_process_init, weak=False)
        signals.worker_process_shutdown.connect(_on_shutdown, weak=False)
        signals.worker_shutdown.connect(_on_shutdown, weak=False)
        signals.task_prerun.connect(_on_prerun, weak=False)
        signals.task_postrun.connect(_on_postrun, weak=False)
        _instrumented = True
