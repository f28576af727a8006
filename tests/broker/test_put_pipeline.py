"""The put pipeline on a real broker: delay redirect, TTL expiry, SEND_BACK, DELIVER_DUE."""
from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from ferry.codec import (
    DELIVER_AT_MS,
    ORIGIN_TOPIC,
    REAL_QUEUE_ID,
    REAL_TOPIC,
    RECONSUME_TIMES,
    TRACEPARENT,
    TTL_MS,
    MessageFlag,
)
from ferry.errors import (
    InvalidDelayError,
    InvalidNameError,
    MalformedRequestError,
    MessageNotFoundError,
)
from ferry.store import encode_properties
from ferry.wire import RequestCode, encode_messages

from tests.broker.conftest import Broker
from tests.broker.wire_client import WireClient, message

pytestmark = pytest.mark.integration

DELAY, TTL = int(MessageFlag.DELAY), int(MessageFlag.TTL)
TRACED, TXN_HALF = int(MessageFlag.TRACED), int(MessageFlag.TXN_HALF)


def flagged(body: bytes, flags: int, **props: str) -> Any:
    msg = message(body, tags="t1", keys="k1")
    msg.flags = flags
    msg.properties = encode_properties(props)
    return msg


async def send_flagged(client: WireClient, topic: str, queue_id: int, msgs: list[Any]
                       ) -> dict[str, Any]:
    flags = 0
    for m in msgs:
        flags |= m.flags
    resp = await client.call(RequestCode.SEND, {"topic": topic, "queue_id": queue_id,
                                                "flags": flags}, encode_messages(msgs))
    return resp.fields


async def test_a_delayed_message_goes_to_schedule_with_its_destination(client: WireClient) -> None:
    due = int(time.time() * 1000) + 60_000
    plain = message(b"now")
    later = flagged(b"later", DELAY, **{DELIVER_AT_MS: str(due), "user": "u"})
    got = await send_flagged(client, "pipe-delay", 5, [plain, later])
    assert got["offsets"] == [0, -1] and got["queue_offset"] == 0 and got["count"] == 2
    _, in_topic = await client.pull("pipe-delay", 5, 0)
    assert [m.body for m in in_topic] == [b"now"]
    _, scheduled = await client.pull("%SCHEDULE%", 5 % 4, 0)
    mine = [m for m in scheduled if m.body == b"later"]
    assert len(mine) == 1
    rec = mine[0]
    assert rec.msg_id == later.msg_id and rec.tags == "t1" and rec.keys == "k1"
    assert rec.properties[REAL_TOPIC] == "pipe-delay" and rec.properties[REAL_QUEUE_ID] == "5"
    assert rec.properties[DELIVER_AT_MS] == str(due) and rec.properties["user"] == "u"
    assert rec.flags & DELAY


async def test_bad_delays_are_refused_and_the_broker_keeps_serving(client: WireClient) -> None:
    too_far = int(time.time() * 1000) + 40 * 86_400_000
    with pytest.raises(InvalidDelayError, match="maximum delay"):
        await send_flagged(client, "pipe-bad", 0,
                           [flagged(b"x", DELAY, **{DELIVER_AT_MS: str(too_far)})])
    with pytest.raises(InvalidDelayError, match=DELIVER_AT_MS):
        await send_flagged(client, "pipe-bad", 0, [flagged(b"x", DELAY)])
    with pytest.raises(InvalidDelayError):
        await send_flagged(client, "pipe-bad", 0, [flagged(b"x", DELAY, **{DELIVER_AT_MS: "soon"})])
    # A delivery time already past is no delay at all.
    past = flagged(b"due", DELAY, **{DELIVER_AT_MS: str(int(time.time() * 1000) - 5)})
    assert (await send_flagged(client, "pipe-bad", 0, [past]))["offsets"] == [0]
    _, msgs = await client.pull("pipe-bad", 0, 0)
    assert [m.body for m in msgs] == [b"due"] and not msgs[0].flags & DELAY


async def test_an_internal_topic_is_refused_to_a_client_send(client: WireClient) -> None:
    for topic in ("%SCHEDULE%", "%RETRY%g1", "%DLQ%g1"):
        with pytest.raises(InvalidNameError, match="internal"):
            await client.send(topic, 0, [message(b"sneaky")])
    assert (await client.send("pipe-after", 0, [message(b"fine")]))["count"] == 1


async def test_trace_topic_takes_only_the_exporters_send(client: WireClient) -> None:
    with pytest.raises(InvalidNameError, match="internal"):
        await client.send("%TRACE%", 0, [message(b"sneaky")])
    with pytest.raises(InvalidNameError, match="internal"):   # the field opens %TRACE% only
        await client.call(RequestCode.SEND, {"topic": "%SCHEDULE%", "queue_id": 0,
                                             "trace_export": True},
                          encode_messages([message(b"sneaky")]))
    resp = await client.call(RequestCode.SEND, {"topic": "%TRACE%", "queue_id": 0,
                                                "trace_export": True},
                             encode_messages([message(b"{}", keys="M1 t:abc")]))
    assert resp.fields["count"] == 1


async def test_trace_export_is_exactly_true_on_the_trace_topic_with_no_flags(
        client: WireClient) -> None:
    body = encode_messages([message(b"{}", keys="M2")])
    for value in (1, "yes", False, None, [True]):   # only the boolean true opens %TRACE%
        with pytest.raises(MalformedRequestError, match="trace_export"):
            await client.call(RequestCode.SEND, {"topic": "%TRACE%", "queue_id": 0,
                                                 "trace_export": value}, body)
    with pytest.raises(InvalidNameError, match="trace"):   # nor on an ordinary topic
        await client.call(RequestCode.SEND, {"topic": "pipe-export", "queue_id": 0,
                                             "trace_export": True}, body)
    at = str(int(time.time() * 1000) + 60_000)
    for flag in (DELAY, TTL, TXN_HALF, TRACED):   # announced: refused before the store
        with pytest.raises(MalformedRequestError, match="flags"):
            await client.call(RequestCode.SEND, {"topic": "%TRACE%", "queue_id": 0,
                                                 "trace_export": True, "flags": flag},
                              encode_messages([flagged(b"{}", flag, **{DELIVER_AT_MS: at})]))
    for flag in (DELAY, TTL, TXN_HALF):   # unannounced in an entry: the fast path refuses it
        with pytest.raises(MalformedRequestError):
            await client.call(RequestCode.SEND, {"topic": "%TRACE%", "queue_id": 0,
                                                 "trace_export": True},
                              encode_messages([flagged(b"{}", flag, **{DELIVER_AT_MS: at})]))
    resp = await client.call(RequestCode.SEND, {"topic": "%TRACE%", "queue_id": 0,
                                                "trace_export": True}, body)
    assert resp.fields["count"] == 1   # the broker still serves the exporter


async def test_a_traced_only_batch_keeps_the_fast_path(client: WireClient) -> None:
    traced = flagged(b"x", TRACED, **{TRACEPARENT: "00-" + "1" * 32 + "-" + "2" * 16 + "-01"})
    fields = await send_flagged(client, "pipe-traced", 0, [traced, message(b"plain")])
    assert fields["count"] == 2 and "offsets" not in fields   # stored as it came
    _, msgs = await client.pull("pipe-traced", 0, 0)
    assert [m.flags & TRACED for m in msgs] == [TRACED, 0]


async def test_a_ttl_message_expires_unseen_and_is_counted(client: WireClient,
                                                           broker: Broker) -> None:
    await send_flagged(client, "pipe-ttl", 0, [
        flagged(b"short", TTL, **{TTL_MS: "300"}), message(b"plain"),
        flagged(b"long", TTL, **{TTL_MS: "600000"})])
    _, fresh = await client.pull("pipe-ttl", 0, 0)
    assert [m.body for m in fresh] == [b"short", b"plain", b"long"]
    await asyncio.sleep(0.5)
    fields, later = await client.pull("pipe-ttl", 0, 0)
    assert [m.body for m in later] == [b"plain", b"long"] and fields["next_offset"] == 3
    assert broker.get_json("/v1/stats")["expired"]["pipe-ttl"] >= 1
    with pytest.raises(MalformedRequestError, match=TTL_MS):
        await send_flagged(client, "pipe-ttl", 0, [flagged(b"x", TTL, **{TTL_MS: "-1"})])


async def test_a_hooked_flag_needs_an_announced_batch(client: WireClient) -> None:
    sneaky = flagged(b"x", DELAY, **{DELIVER_AT_MS: str(int(time.time() * 1000) + 60_000)})
    with pytest.raises(MalformedRequestError, match="announce"):
        await client.send("pipe-unannounced", 0, [sneaky])
    _, msgs = await client.pull("pipe-unannounced", 0, 0)
    assert msgs == []


async def stored(client: WireClient, msg: Any, topic: str = "orders") -> dict[str, Any]:
    """Send `msg` to queue 0 of `topic`; the SEND_BACK fields that name it there."""
    got = await client.send(topic, 0, [msg])
    return {"topic": topic, "queue_id": 0, "queue_offset": got["queue_offset"],
            "msg_id": msg.msg_id}


async def send_back(client: WireClient, ref: dict[str, Any], *, reconsume: int, delay_ms: int,
                    max_reconsume: int = 16) -> dict[str, Any]:
    resp = await client.call(RequestCode.SEND_BACK, {
        "group": "g1", **ref, "reconsume_times": reconsume, "delay_ms": delay_ms,
        "max_reconsume_times": max_reconsume})
    return resp.fields


async def test_send_back_routes_by_attempt_and_back_off(client: WireClient) -> None:
    now = message(b"retry-now", tags="t", keys="k")
    got = await send_back(client, await stored(client, now), reconsume=1, delay_ms=0)
    assert got["target"] == "%RETRY%g1"
    _, retried = await client.pull("%RETRY%g1", 0, got["queue_offset"])
    rec = retried[0]
    assert (rec.body, rec.msg_id, rec.reconsume_times) == (b"retry-now", now.msg_id, 1)
    assert rec.properties[ORIGIN_TOPIC] == "orders" and rec.tags == "t"
    # Nacked again from the retry topic: the origin is the one the broker recorded.
    again = await send_back(client, {"topic": "%RETRY%g1", "queue_id": 0,
                                     "queue_offset": got["queue_offset"],
                                     "msg_id": now.msg_id}, reconsume=2, delay_ms=0)
    _, twice = await client.pull("%RETRY%g1", 0, again["queue_offset"])
    assert twice[0].properties[ORIGIN_TOPIC] == "orders" and twice[0].reconsume_times == 2

    later = message(b"retry-later")
    before = int(time.time() * 1000)
    got = await send_back(client, await stored(client, later), reconsume=2, delay_ms=10_000)
    assert got["target"] == "%SCHEDULE%"
    found = []
    for q in range(4):
        _, recs = await client.pull("%SCHEDULE%", q, 0, max_count=1000)
        found += [r for r in recs if r.msg_id == later.msg_id]
    assert len(found) == 1 and found[0].reconsume_times == 2 and found[0].flags & DELAY
    props = found[0].properties
    assert props[REAL_TOPIC] == "%RETRY%g1" and int(props[DELIVER_AT_MS]) >= before + 10_000

    dead = message(b"dead")
    got = await send_back(client, await stored(client, dead), reconsume=3, delay_ms=10,
                          max_reconsume=2)
    assert got["target"] == "%DLQ%g1"
    _, dlq = await client.pull("%DLQ%g1", 0, got["queue_offset"])
    assert dlq[0].msg_id == dead.msg_id and dlq[0].properties[ORIGIN_TOPIC] == "orders"


async def test_send_back_copies_only_a_stored_message_with_its_own_origin(
        client: WireClient) -> None:
    """Issue 24: the broker copies its own record; a client's body, id or origin count for
    nothing, and a producer's ORIGIN_TOPIC property is overwritten by the real topic."""
    sly = flagged(b"real", 0, **{ORIGIN_TOPIC: "payments"})
    ref = await stored(client, sly, topic="pipe-origin")
    fields = {"group": "g-origin", **ref, "reconsume_times": 1, "delay_ms": 0,
              "max_reconsume_times": 3}
    with pytest.raises(MalformedRequestError, match="no message"):
        await client.call(RequestCode.SEND_BACK, fields, encode_messages([message(b"forged")]))
    with pytest.raises(MessageNotFoundError):
        await client.call(RequestCode.SEND_BACK, dict(fields, queue_offset=ref["queue_offset"] + 7))
    with pytest.raises(MessageNotFoundError):
        await client.call(RequestCode.SEND_BACK, dict(fields, msg_id=message(b"x").msg_id))
    with pytest.raises(InvalidNameError, match="retry or dead-letter"):
        await client.call(RequestCode.SEND_BACK, dict(fields, topic="%RETRY%g1"))
    _, nothing = await client.pull("%RETRY%g-origin", 0, 0)
    assert nothing == []   # the refusals stored nothing
    got = await client.call(RequestCode.SEND_BACK, fields)
    _, (copy,) = await client.pull("%RETRY%g-origin", 0, got.fields["queue_offset"])
    assert copy.body == b"real" and copy.properties[ORIGIN_TOPIC] == "pipe-origin"


async def test_deliver_due_keeps_ids_and_carries_attempts(client: WireClient) -> None:
    msg = flagged(b"due", 0, **{RECONSUME_TIMES: "3"})
    got = await client.call(RequestCode.DELIVER_DUE, {"topic": "%RETRY%g2", "queue_id": -1},
                            encode_messages([msg]))
    _, recs = await client.pull("%RETRY%g2", got.fields["queue_id"], got.fields["queue_offset"])
    assert recs[0].msg_id == msg.msg_id and recs[0].reconsume_times == 3
    with pytest.raises(InvalidNameError):
        await client.call(RequestCode.DELIVER_DUE, {"topic": "%SCHEDULE%", "queue_id": 0},
                          encode_messages([message(b"loop")]))
    delayed = flagged(b"x", DELAY, **{DELIVER_AT_MS: str(int(time.time() * 1000) + 1000)})
    with pytest.raises(MalformedRequestError, match="DELAY"):
        await client.call(RequestCode.DELIVER_DUE, {"topic": "pipe-due", "queue_id": 0},
                          encode_messages([delayed]))


async def test_deliver_due_with_roll_stores_the_message_in_schedule_again(
        client: WireClient) -> None:
    due = int(time.time() * 1000) + 600_000
    rolled = flagged(b"roll", DELAY, **{DELIVER_AT_MS: str(due), "user": "u"})
    got = await client.call(RequestCode.DELIVER_DUE,
                            {"topic": "pipe-roll", "queue_id": 6, "roll": True},
                            encode_messages([rolled]))
    _, in_topic = await client.pull("pipe-roll", 6, 0)
    assert in_topic == []  # not delivered: stored again for later
    _, scheduled = await client.pull("%SCHEDULE%", 6 % 4, 0, max_count=1000)
    (rec,) = [m for m in scheduled if m.body == b"roll"]
    assert rec.queue_offset == got.fields["queue_offset"]
    assert rec.msg_id == rolled.msg_id and rec.flags & DELAY
    assert rec.properties[DELIVER_AT_MS] == str(due) and rec.properties[REAL_TOPIC] == "pipe-roll"
    with pytest.raises(MalformedRequestError, match="DELAY"):  # roll needs the flag
        await client.call(RequestCode.DELIVER_DUE,
                          {"topic": "pipe-roll", "queue_id": 0, "roll": True},
                          encode_messages([message(b"plain")]))


async def test_garbage_in_the_new_requests_is_refused_and_the_broker_keeps_serving(
        client: WireClient) -> None:
    ref = {"topic": "orders", "queue_id": 0, "queue_offset": 0, "msg_id": "00" * 16}
    bad_requests: list[tuple[int, dict[str, Any], bytes]] = [
        (RequestCode.SEND_BACK, {"group": "g1", **ref, "reconsume_times": 1,
                                 "max_reconsume_times": 3}, b"\x07" * 50),
        (RequestCode.SEND_BACK, {"group": "bad group", **ref, "reconsume_times": 1,
                                 "max_reconsume_times": 3}, b""),
        (RequestCode.SEND_BACK, {"group": "g1", **ref, "reconsume_times": -1,
                                 "max_reconsume_times": 3}, b""),
        (RequestCode.SEND_BACK, {"group": "g1", **ref, "reconsume_times": 1,
                                 "max_reconsume_times": 3, "delay_ms": 10**15}, b""),
        (RequestCode.SEND_BACK, {"group": "g1", **ref, "msg_id": "zz", "reconsume_times": 1,
                                 "max_reconsume_times": 3}, b""),
        (RequestCode.SEND_BACK, {"group": "g1", **ref, "reconsume_times": 1,
                                 "max_reconsume_times": 3, "traceparent": "00-x"}, b""),
        (RequestCode.DELIVER_DUE, {"topic": "pipe-due", "queue_id": 99999},
         encode_messages([message(b"x")])),
        (RequestCode.DELIVER_DUE, {"topic": "pipe-due", "queue_id": 0}, b""),
        (RequestCode.SEND, {"topic": "pipe-due", "queue_id": 0, "flags": "x"},
         encode_messages([message(b"x")])),
    ]
    for code, fields, body in bad_requests:
        resp = await client.request(code, fields, body)
        assert resp.error in (4, 5, 6, 20), (code, fields, resp.message)
    assert (await client.send("pipe-due", 0, [message(b"still serving")]))["count"] == 1
