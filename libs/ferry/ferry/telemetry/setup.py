"""The process's tracing: one `Tracing` set up once from the environment.

`setup_tracing(service, namesrv=...)` is called by every service at start and
by every client's `start()` (with `OTEL_SERVICE_NAME` or "ferry-client" as the
name). The first call names the process's service and builds the tracer
provider; a later call returns the same object, re-reading the environment:
if the settings changed (a test that sets `FERRY_TRACE_DIR`, turns tracing
off) the exporters are rebuilt in place. The trace topic's target is the first
namesrv the process names: a client started later against another namesrv
changes nothing (rebuilding would retarget every span of the process, and
would stop the exporters on that client's event loop); a first namesrv given
after the provider exists adds the topic exporter to it. A rebuild stops the
old provider in a background thread: its shutdown joins the exporters'
threads, which can take seconds, and `start()` runs on an event loop. After
an explicit `shutdown()` the next setup starts afresh, a new target included.
`tracing()` is what the
hops read: a disabled `Tracing` before any setup, so a hop costs one attribute
check (`tracing().enabled`) and makes no span.

Exporters run behind BatchSpanProcessors (a queue and a thread each): the
traced code only appends a finished span to a queue.
"""
from __future__ import annotations

import logging
import os
import random
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased

from ferry.telemetry.jsonl import JsonLinesExporter
from ferry.telemetry.settings import TracingSettings

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer

log = logging.getLogger(__name__)

#: The service name clients use when the process set up none itself.
CLIENT_SERVICE = "ferry-client"
INSTRUMENTATION_NAME = "ferry"
#: How often the batch processors hand finished spans to the exporters (the SDK's default,
#: 5 s, makes a trace slow to appear in the console; OTEL_BSP_SCHEDULE_DELAY overrides).
EXPORT_DELAY_MS = 500


class Tracing:
    """A process's tracing: whether it is on, its tracer, sampling, and the exporters.

    `enabled` is False when tracing is off (or before setup): then `tracer` is
    a no-op tracer and no hop makes a span. `sample()` is the producer's
    once-per-message decision at the configured ratio.
    """

    def __init__(self, service: str = "", settings: TracingSettings | None = None,
                 namesrv: str | None = None) -> None:
        self.service = service
        self.pid = os.getpid()   # the process whose exporter threads this one runs
        self.settings = settings or TracingSettings(enabled=False)
        self.namesrv = namesrv
        self.enabled = False
        self.sample_ratio = 0.0
        self.tracer: Tracer = trace.NoOpTracer()
        self.provider: TracerProvider | None = None
        self.exporters: list[SpanExporter] = []
        if service and self.settings.enabled:
            self._build()

    def _build(self) -> None:
        s = self.settings
        provider = TracerProvider(resource=Resource.create({"service.name": self.service}),
                                  sampler=ParentBased(ALWAYS_ON), shutdown_on_exit=True)
        exporters: list[SpanExporter] = []
        if s.trace_dir:
            exporters.append(JsonLinesExporter(s.trace_dir, self.service))
        if s.otlp_endpoint:
            # It reads OTEL_EXPORTER_OTLP_ENDPOINT itself (and adds /v1/traces).
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            exporters.append(OTLPSpanExporter())
        if s.trace_topic and self.namesrv:
            topic_exporter = _topic_exporter(self.namesrv, self.service)
            if topic_exporter is not None:
                exporters.append(topic_exporter)
        delay_ms = _delay_ms()
        for exporter in exporters:
            provider.add_span_processor(BatchSpanProcessor(exporter,
                                                           schedule_delay_millis=delay_ms))
        self.provider, self.exporters = provider, exporters
        self.tracer = provider.get_tracer(INSTRUMENTATION_NAME)
        self.sample_ratio = s.sample_ratio
        self.enabled = True

    def sample(self) -> bool:
        """Whether to trace one more message (a producer asks once per unforced message)."""
        return self.enabled and random.random() < self.sample_ratio  # noqa: S311 - not crypto

    def force_flush(self, timeout_ms: int = 10_000) -> bool:
        """Export every finished span now (tests and shutdown paths call it)."""
        return self.provider.force_flush(timeout_ms) if self.provider is not None else True

    def _detach(self) -> TracerProvider | None:
        """Disable this object and hand back its provider (still running) to stop."""
        provider, self.provider = self.provider, None
        self.enabled = False
        self.tracer = trace.NoOpTracer()
        self.exporters = []
        return provider

    def shutdown(self) -> None:
        """Flush and stop the exporters; the object stays usable but disabled.

        The trace topic's target is forgotten too: the next `setup_tracing`
        starts afresh (a process that stopped tracing may start it for another
        cluster)."""
        provider = self._detach()
        self.namesrv = None
        if provider is not None:
            provider.shutdown()

    def _reconfigure(self, settings: TracingSettings, namesrv: str | None) -> None:
        """Apply re-read settings; the first namesrv given stays the topic's target."""
        first_target = namesrv if not self.namesrv else None
        if settings == self.settings and (self.provider is not None or not settings.enabled):
            if first_target and self.provider is not None:
                self.namesrv = first_target
                self._add_topic_exporter(self.provider)
            elif first_target:
                self.namesrv = first_target
            return
        old = self._detach()
        if old is not None:   # its shutdown joins the exporter threads: not on the caller's loop
            threading.Thread(target=_shutdown_quietly, args=(old,), daemon=True,
                             name="ferry-tracing-shutdown").start()
        self.settings = settings
        self.namesrv = self.namesrv or namesrv
        if settings.enabled:
            self._build()

    def _add_topic_exporter(self, provider: TracerProvider) -> None:
        if not (self.settings.trace_topic and self.namesrv):
            return
        exporter = _topic_exporter(self.namesrv, self.service)
        if exporter is not None:
            provider.add_span_processor(BatchSpanProcessor(exporter,
                                                           schedule_delay_millis=_delay_ms()))
            self.exporters.append(exporter)


def _delay_ms() -> int:
    return int(os.environ.get("OTEL_BSP_SCHEDULE_DELAY") or EXPORT_DELAY_MS)


def _shutdown_quietly(provider: TracerProvider) -> None:
    """Stop a replaced provider (flushing its spans); a failure is logged, never raised."""
    try:
        provider.shutdown()
    except Exception:   # a background thread has no caller to tell
        log.exception("stopping the replaced tracer provider failed")


#: Makes the exporter to the `%TRACE%` topic of the cluster behind a namesrv:
#: (namesrv, service) -> exporter. It is a client of that topic, so the client side provides
#: it (`ferry.client.core.trace_topic.TraceTopicExporter`, installed by the `ferry` package's
#: __init__, which runs before any of its modules): telemetry imports nothing of the client.
_trace_topic_exporter: Callable[[str, str], SpanExporter] | None = None


def use_trace_topic_exporter(factory: Callable[[str, str], SpanExporter] | None) -> None:
    """Export to the trace topic with `factory(namesrv, service)` (None: no topic exporter)."""
    global _trace_topic_exporter
    _trace_topic_exporter = factory


def _topic_exporter(namesrv: str, service: str) -> SpanExporter | None:
    """The exporter to the `%TRACE%` topic (None when no factory is installed)."""
    factory = _trace_topic_exporter
    return factory(namesrv, service) if factory is not None else None


_current = Tracing()
_lock = threading.Lock()


def tracing() -> Tracing:
    """The process's Tracing (a disabled one before `setup_tracing`)."""
    return _current


def setup_tracing(service: str, *, namesrv: str | None = None) -> Tracing:
    """Set up (or refresh, see the module doc) the process's tracing from the environment."""
    global _current
    settings = TracingSettings.from_env()
    with _lock:
        if not _current.service:
            _current = Tracing(service or os.environ.get("OTEL_SERVICE_NAME") or CLIENT_SERVICE,
                               settings, namesrv)
        else:
            _current._reconfigure(settings, namesrv)
        return _current


def reset_tracing(replacement: Tracing | None = None) -> Tracing:
    """Forget the process's Tracing: the next `setup_tracing` starts afresh (service
    name included); returns the new current one (`replacement`, else a disabled one).

    For a forked child (the parent's exporter threads did not come along: its
    provider is dropped, not shut down) and for tests that must not see the
    tracing an earlier test set up. An old provider that is still running is
    shut down in a background thread, never on the caller's event loop.
    """
    global _current
    with _lock:
        old, _current = _current, replacement or Tracing()
    provider = old._detach()
    if provider is not None and os.getpid() == old.pid:
        threading.Thread(target=_shutdown_quietly, args=(provider,), daemon=True,
                         name="ferry-tracing-reset").start()
    return _current


def client_service_name() -> str:
    """The service name a client sets up tracing with when the process has none yet."""
    return os.environ.get("OTEL_SERVICE_NAME") or CLIENT_SERVICE
