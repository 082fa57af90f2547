"""Error codes: the domain names them (app/domain/errors.py), the HTTP layer gives each a status (app/api/errors.py)."""

from __future__ import annotations

from app.api import errors as api
from app.domain.errors import CODES, ServiceError


def test_every_code_has_one_status_and_its_body_names_the_openai_type_of_that_status() -> None:
    assert set(api.STATUS) == CODES
    for code in CODES:
        body = ServiceError(code, "why", param="p").body()["error"]
        assert body == {
            "message": "why",
            "type": api._TYPES.get(api.STATUS[code], "invalid_request_error"),
            "param": "p",
            "code": code,
        }


def test_the_http_layer_gives_the_domains_error_its_status() -> None:
    err = ServiceError("queue_full", "busy", retry_after_s=3)
    assert api.status_of(err) == 429
    assert api.status_of(ServiceError("unavailable", "loading")) == 503
    assert err.event(session_id="s") == {
        "type": "error",
        "code": "queue_full",
        "message": "busy",
        "retry_after_s": 3,
        "session_id": "s",
    }
