"""Every failure a client can see, in OpenAI's shape:
`{"error": {"message", "type", "param", "code"}}` with a matching HTTP status."""

from __future__ import annotations

import re
from http import HTTPStatus

import msgspec

from rill.errors import EngineDeadError, ValidationError
from rill.openai.chat_bodies import ErrorInfo, ErrorResponse

# msgspec ends a validation message with the path of the bad value: "... - at `$.messages[0].role`".
_PATH = re.compile(r" - at `\$\.?(?P<path>[^`]*)`$")
_MISSING = re.compile(r"missing required field `(?P<field>[^`]+)`")

_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    404: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    503: "service_unavailable",
}


class ApiError(Exception):
    """An error with its HTTP status, raised anywhere in serving and turned into a response at the edge."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}

    @property
    def body(self) -> ErrorResponse:
        kind = _TYPES.get(self.status, "invalid_request_error" if self.status < 500 else "server_error")
        return ErrorResponse(ErrorInfo(self.message, kind, self.param, self.code))


def bad_request(message: str, param: str | None = None, code: str = "invalid_value") -> ApiError:
    return ApiError(400, message, param=param, code=code)


def from_decode_error(error: msgspec.MsgspecError) -> ApiError:
    """A body msgspec refused: name the field it stopped at."""
    message = str(error)
    if isinstance(error, msgspec.DecodeError) and not isinstance(error, msgspec.ValidationError):
        return bad_request(f"the request body is not valid JSON: {message}", code="invalid_json")
    path, missing = _PATH.search(message), _MISSING.search(message)
    param = path["path"] if path else None
    if missing:
        param = f"{param}.{missing['field']}" if param else missing["field"]
        return bad_request(message, param, code="missing_required_parameter")
    return bad_request(message, param or None, code="invalid_type")


def from_exception(error: BaseException) -> ApiError:
    """The ApiError for an exception: rill's own errors map to 4xx/503, anything else is a 500."""
    if isinstance(error, ApiError):
        return error
    if isinstance(error, ValidationError):
        return bad_request(error.message, error.param, error.code)
    if isinstance(error, msgspec.MsgspecError):
        return from_decode_error(error)
    if isinstance(error, EngineDeadError):
        return ApiError(503, str(error), code="engine_dead")
    return ApiError(500, f"internal error: {type(error).__name__}: {error}", code="internal_error")


def from_status(status: int, description: str | None = None) -> ApiError:
    """For HTTP errors the framework raises (404 route, 405, 413 body too large)."""
    phrase = HTTPStatus(status).phrase
    code = phrase.lower().replace(" ", "_")
    return ApiError(status, description or phrase, code=code)
