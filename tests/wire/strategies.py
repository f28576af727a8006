"""Hypothesis strategies for frames and message batches."""
from __future__ import annotations

from ferry.wire import MAX_REQUEST_ID, Frame, WireMessage
from hypothesis import strategies as st

_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=40)
    | st.binary(max_size=40)
)
field_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner, max_size=5),
    max_leaves=20,
)
fields = st.dictionaries(st.text(max_size=16), field_values, max_size=8)

frames = st.builds(
    Frame,
    code=st.integers(min_value=0, max_value=2**16),
    request_id=st.integers(min_value=0, max_value=MAX_REQUEST_ID),
    flags=st.integers(min_value=0, max_value=3),
    error=st.integers(min_value=0, max_value=100),
    message=st.text(max_size=60),
    fields=fields,
    body=st.binary(max_size=2048),
)

wire_messages = st.builds(
    WireMessage,
    body=st.binary(max_size=512),
    msg_id=st.binary(min_size=16, max_size=16).filter(any) | st.just(b""),
    born_ts_ms=st.integers(min_value=-(2**63), max_value=2**63 - 1),
    flags=st.integers(min_value=0, max_value=2**32 - 1),
    tags=st.text(max_size=20),
    keys=st.text(max_size=40),
    properties=st.binary(max_size=64),
)
