"""W3C trace context in a message's properties: `TRACEPARENT` and `TRACESTATE`.

A traced message carries its sender's span context in these two system
properties (upper case, like every system property) and has
`MessageFlag.TRACED` set in its flags, so every later hop decides from one bit
whether to parse properties at all. `inject` writes the context of a span into
a properties dict; `extract` reads it back as an OpenTelemetry `Context` that a
hop span uses as its parent (a remote parent: the trace continues across
processes).
"""
from __future__ import annotations

from collections.abc import Mapping, MutableMapping

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.propagators.textmap import Getter, Setter
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from ferry.codec.message_flags import MessageFlag
from ferry.codec.system_properties import TRACEPARENT, TRACESTATE

TRACED = int(MessageFlag.TRACED)

# The W3C header names the propagator uses, and the property names they travel under.
_TO_PROPERTY = {"traceparent": TRACEPARENT, "tracestate": TRACESTATE}
_PROPAGATOR = TraceContextTextMapPropagator()


class _PropertySetter(Setter[MutableMapping[str, str]]):
    def set(self, carrier: MutableMapping[str, str], key: str, value: str) -> None:
        carrier[_TO_PROPERTY.get(key, key)] = value


class _PropertyGetter(Getter[Mapping[str, str]]):
    def get(self, carrier: Mapping[str, str], key: str) -> list[str] | None:
        value = carrier.get(_TO_PROPERTY.get(key, key))
        return None if value is None else [value]

    def keys(self, carrier: Mapping[str, str]) -> list[str]:
        return list(carrier)


_SETTER = _PropertySetter()
_GETTER = _PropertyGetter()


def inject(properties: MutableMapping[str, str], context: Context | None = None) -> bool:
    """Write the span context of `context` (default: the current one) into `properties`.

    Returns whether anything was written: nothing when there is no valid span
    in the context (the caller then does not set `MessageFlag.TRACED`).
    """
    _PROPAGATOR.inject(properties, context=context, setter=_SETTER)
    return TRACEPARENT in properties


def extract(properties: Mapping[str, str]) -> Context | None:
    """The remote parent context a message carries, or None (no or invalid `TRACEPARENT`)."""
    if TRACEPARENT not in properties:
        return None
    ctx = _PROPAGATOR.extract(properties, getter=_GETTER)
    if not trace.get_current_span(ctx).get_span_context().is_valid:
        return None
    return ctx


def is_traced(flags: int) -> bool:
    """Whether a message's flags say it carries trace context (one bit test)."""
    return bool(flags & TRACED)
