"""Failures in Anthropic's shape: `{"type": "error", "error": {"type", "message"}, "request_id"}`.

rill raises one ApiError (rill.openai.errors) everywhere; this module only renders it. The error
type follows the status as Anthropic's API reference lists them; the field a 400 is about leads
its message ("max_tokens: ..."), as Anthropic writes its own, since the shape has no `param`.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

import msgspec

from rill.openai.errors import ApiError

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


class ErrorInfo(msgspec.Struct):
    type: str
    message: str


class ErrorBody(msgspec.Struct):
    error: ErrorInfo
    request_id: str
    type: str = "error"


def error_type(status: int) -> str:
    return _TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")


def error_body(error: ApiError) -> ErrorBody:
    named = not error.param or error.message.startswith(error.param)
    message = error.message if named else f"{error.param}: {error.message}"
    return ErrorBody(ErrorInfo(error_type(error.status), message), new_request_id())


def new_request_id() -> str:
    return f"req_{secrets.token_hex(12)}"


def key_matches(x_api_key: str | None, authorization: str | None, api_key: str) -> bool:
    """The key as Anthropic's clients send it: `x-api-key`, or (the anthropic SDK 2.x)
    `Authorization: Bearer`. Both sides hashed first, so the time taken tells nothing of the key."""
    expected = hashlib.sha256(api_key.encode()).digest()
    given = x_api_key
    if given is None and authorization is not None and authorization.startswith("Bearer "):
        given = authorization[len("Bearer "):]
    return given is not None and hmac.compare_digest(hashlib.sha256(given.encode()).digest(), expected)


def authentication_error() -> ApiError:
    return ApiError(401, "invalid x-api-key: send the server's key as 'x-api-key: <key>' or "
                         "'Authorization: Bearer <key>'", code="invalid_api_key")
