"""APIError and the mapping of every failure to an OpenAI-style error body."""
from __future__ import annotations

import json
from dataclasses import dataclass

from pydantic import ValidationError
from starlette.responses import JSONResponse

# Integers longer than this are refused before conversion, whose cost grows with the square of the
# length (Python's own default limit); no field takes more than an int64's 19 digits anyway.
_MAX_INT_DIGITS = 4300


@dataclass
class APIError(Exception):
    """An error a client caused or must know about; rendered as ``{"error": {...}}`` with ``status``."""

    status: int
    message: str
    type: str = "invalid_request_error"
    param: str | None = None
    code: str | None = None
    headers: dict[str, str] | None = None

    def __str__(self) -> str:
        return self.message

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def bad_request(message: str, param: str | None = None) -> APIError:
    return APIError(400, message, param=param)


def from_validation_error(exc: ValidationError) -> APIError:
    """A 400 naming the first field that is wrong and what was expected of it."""
    first = exc.errors()[0]
    param = ".".join(str(p) for p in first["loc"]) or None
    where = f"'{param}'" if param else "the request body"
    return APIError(400, f"{where}: {first['msg']}", param=param, code="invalid_type")


def parse_json(body: bytes) -> dict:
    """The request body as a JSON object, or a 400 saying why it is not one."""
    try:
        data = json.loads(body, parse_int=_parse_int)
    except RecursionError:
        # from None: the chained traceback would be thousands of frames deep.
        raise APIError(400, "request body is not valid JSON: its arrays and objects are nested too deeply "
                       "to read", code="invalid_json") from None
    except ValueError as exc:  # malformed JSON, bytes that are not UTF-8, an integer too long to read
        raise APIError(400, f"request body is not valid JSON: {exc}", code="invalid_json") from exc
    if not isinstance(data, dict):
        raise APIError(400, f"request body must be a JSON object, got {type(data).__name__}", code="invalid_json")
    return data


def _parse_int(digits: str) -> int:
    # int() refuses more digits than sys.get_int_max_str_digits() with advice meant for the server's owner.
    if len(digits.lstrip("-")) > _MAX_INT_DIGITS:
        raise ValueError(f"an integer has {len(digits.lstrip('-'))} digits; at most {_MAX_INT_DIGITS} are read")
    return int(digits)


STATUS_TYPES = {401: "authentication_error", 404: "not_found_error", 405: "invalid_request_error",
                413: "invalid_request_error", 503: "service_unavailable"}


def http_error(status: int, message: str, code: str | None = None) -> APIError:
    return APIError(status, message, STATUS_TYPES.get(status, "invalid_request_error"), code=code)
