"""The two auth errors: their wire codes and the HTTP statuses every service maps them to."""
from __future__ import annotations

from ferry.errors import AccessDeniedError, AuthenticationError, BusyError, error_for_code
from ferry.service.errors import error_body, status_for


def test_wire_codes_round_trip_and_are_not_retriable() -> None:
    assert isinstance(error_for_code(26, "no"), AuthenticationError)
    assert isinstance(error_for_code(27, "no"), AccessDeniedError)
    assert not AuthenticationError.retriable and not AccessDeniedError.retriable


def test_http_statuses_whatever_the_service_table() -> None:
    assert status_for(AuthenticationError("x"), [(BusyError, 503)]) == 401
    assert status_for(AccessDeniedError("x"), []) == 403
    assert error_body(AccessDeniedError("denied"))["error"]["type"] == "AccessDeniedError"
