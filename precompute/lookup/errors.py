"""JSON error answers, the exception that carries one out of a helper to the route wrapper, and
the bounded reading of a JSON body (no body, however large or deep, is a 500)."""

from __future__ import annotations

import json
from typing import Any, TypeVar

import anyio
from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse

from precompute.lookup.settings import ServiceSettings
from precompute.stores.errors import StoreUnavailableError


def error(status: int, message: str, headers: dict[str, str] | None = None, **extra: Any) -> JSONResponse:
    return JSONResponse({"error": message, **extra}, status_code=status, headers=headers)


def unavailable(store: str, e: StoreUnavailableError) -> JSONResponse:
    """503 naming the store, not its address or driver error (those go to the service's log)."""
    return error(503, f"{store} unavailable", headers={"Retry-After": str(max(1, round(e.retry_after)))})


class Refused(Exception):
    """Raised with the answer to give (a 4xx or 503); the route wrapper answers it.

    Lets a validation or store helper end the request without every caller checking a result.
    """

    def __init__(self, response: JSONResponse) -> None:
        super().__init__(response.status_code)
        self.response = response


async def json_body(request: Request, max_bytes: int, timeout_s: float) -> Any:
    """The body parsed as JSON. Refused: 413 past `max_bytes` (read no further), 408 after
    `timeout_s`, 400 when it is not JSON, which includes nesting deeper than Python's parser
    recurses (about 1,000 levels)."""
    length = request.headers.get("content-length", "0")
    if not length.isdigit() or int(length) > max_bytes:
        raise Refused(error(413, f"body must be at most {max_bytes} bytes"))
    body = bytearray()
    try:
        with anyio.fail_after(timeout_s):
            async for chunk in request.stream():
                body += chunk
                if len(body) > max_bytes:
                    raise Refused(error(413, f"body must be at most {max_bytes} bytes"))
    except TimeoutError:
        raise Refused(error(408, f"the body did not arrive within {timeout_s:g} s")) from None
    try:
        return json.loads(body)
    except (ValueError, RecursionError):
        raise Refused(
            error(400, "body must be JSON (UTF-8, nested at most about 1,000 levels deep)")
        ) from None


Model = TypeVar("Model", bound=BaseModel)


async def validated_body(request: Request, model: type[Model], settings: ServiceSettings) -> Model:
    """The JSON body as `model`; Refused with 422 naming the first field that is wrong."""
    try:
        return model.model_validate(
            await json_body(request, settings.max_body_bytes, settings.request_timeout_s)
        )
    except ValidationError as e:
        first = e.errors()[0]
        raise Refused(error(422, first["msg"], field=".".join(map(str, first["loc"])))) from None
