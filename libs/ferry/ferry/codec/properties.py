"""The properties codec: a message's string map as UTF-8 `key\\x01value\\x02` pairs.

RocketMQ's layout. System property names are upper case (see
`system_properties`); values are text.
"""
from __future__ import annotations

from ferry.errors import CorruptRecordError

#: Ends a key (the value follows).
PROP_KV = "\x01"
#: Ends a pair.
PROP_END = "\x02"


def encode_properties(props: dict[str, str]) -> bytes:
    """Encode a property map; a name or value holding a separator raises ValueError."""
    if not props:
        return b""
    parts = []
    for key, value in props.items():
        if not key or PROP_KV in key or PROP_END in key:
            raise ValueError(f"invalid property name {key!r}")
        if PROP_KV in value or PROP_END in value:
            raise ValueError(f"property {key!r} has a reserved separator character")
        parts.append(f"{key}{PROP_KV}{value}{PROP_END}")
    return "".join(parts).encode()


def decode_properties(raw: bytes | bytearray | memoryview) -> dict[str, str]:
    """Decode `encode_properties` output; malformed input raises CorruptRecordError."""
    if not raw:
        return {}
    try:
        text = bytes(raw).decode()
    except UnicodeDecodeError as exc:
        raise CorruptRecordError(f"properties are not UTF-8: {exc}") from None
    if not text.endswith(PROP_END):
        raise CorruptRecordError("properties do not end with a pair separator")
    out: dict[str, str] = {}
    for pair in text[:-1].split(PROP_END):
        key, sep, value = pair.partition(PROP_KV)
        if not sep or not key:
            raise CorruptRecordError(f"malformed property pair {pair!r}")
        out[key] = value
    return out
