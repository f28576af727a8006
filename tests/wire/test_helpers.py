"""request/response/error_response/check_response."""
from __future__ import annotations

import pytest
from ferry.errors import (
    ERRORS_BY_CODE,
    FerryError,
    TopicNotFoundError,
)
from ferry.wire import (
    Flag,
    RequestCode,
    check_response,
    decode_frame,
    encode_frame,
    error_response,
    request,
    response,
)


def test_response_answers_its_request() -> None:
    req = request(RequestCode.GET_MIN_MAX, 77, {"topic": "t", "queue_id": 0})
    resp = decode_frame(encode_frame(response(req, {"min_offset": 0, "max_offset": 5}, b"b")))
    assert (resp.code, resp.request_id, resp.flags) == (RequestCode.GET_MIN_MAX, 77, Flag.RESPONSE)
    assert resp.fields == {"min_offset": 0, "max_offset": 5} and resp.body == b"b"
    assert resp.is_response and resp.error == 0   # no error code
    assert check_response(resp) is resp


@pytest.mark.parametrize("code", sorted(ERRORS_BY_CODE))
def test_every_error_class_survives_the_wire(code: int) -> None:
    cls = ERRORS_BY_CODE[code]
    req = request(RequestCode.PULL, 3)
    resp = decode_frame(encode_frame(error_response(req, cls("what went wrong"))))
    assert resp.error == code and resp.message == "what went wrong"
    with pytest.raises(cls, match="what went wrong") as info:
        check_response(resp)
    assert type(info.value) is cls


def test_unexpected_exception_becomes_system_error_without_details() -> None:
    resp = error_response(request(RequestCode.SEND, 1), KeyError("secret/path"))
    assert resp.error == 1 and "secret" not in resp.message


def test_unknown_error_code_is_a_plain_ferry_error() -> None:
    resp = error_response(request(RequestCode.SEND, 1), TopicNotFoundError("x"))
    resp.error = 999
    with pytest.raises(FerryError) as info:
        check_response(resp)
    assert info.value.code == 999
