"""StoredMessage: a record decoded (`ferry.codec.record_check.decode_record` builds it).

Its own module so that the record check, which the build compiles into a twin,
and `ferry.codec.record`, which re-exports both, import it without a cycle.
"""
from __future__ import annotations

from functools import cached_property
from typing import NamedTuple

from ferry.codec.msg_id import msg_id_hex
from ferry.codec.properties import decode_properties


class _StoredFields(NamedTuple):
    topic: str
    queue_id: int
    queue_offset: int
    phy_offset: int
    size: int
    flags: int
    born_ts_ms: int
    store_ts_ms: int
    born_host: str
    store_host: str
    reconsume_times: int
    prepared_offset: int
    tag_hash: int
    msg_id: bytes
    tags: str
    keys: str
    body: bytes
    properties_raw: bytes


class StoredMessage(_StoredFields):
    """A decoded record; `properties` is decoded from `properties_raw` on first use.

    Immutable like a frozen dataclass, but a NamedTuple: readers decode
    hundreds of thousands per second and a tuple costs a tenth of a dataclass
    to build. (No __slots__, so the instance dict can cache `properties`.)
    """

    @cached_property
    def properties(self) -> dict[str, str]:
        return decode_properties(self.properties_raw)

    @property
    def msg_id_hex(self) -> str:
        return msg_id_hex(self.msg_id)

    @property
    def end_offset(self) -> int:
        return self.phy_offset + self.size
