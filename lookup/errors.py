"""JSON error answers, and the exception that carries one out of a helper to the route wrapper."""

from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse


def error(status: int, message: str, headers: dict[str, str] | None = None, **extra: Any) -> JSONResponse:
    return JSONResponse({"error": message, **extra}, status_code=status, headers=headers)


class Refused(Exception):
    """Raised with the answer to give (a 4xx or 503); the route wrapper answers it.

    Lets a validation or store helper end the request without every caller checking a result.
    """

    def __init__(self, response: JSONResponse) -> None:
        super().__init__(response.status_code)
        self.response = response
