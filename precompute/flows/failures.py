"""The one line a user reads about a failure, and which failures are worth a retry.

A failure arrives wrapped: a Ray task's or a Ray Data UDF's exception holds the one user code
raised, and Prefect re-raises it from its task. The line names the root cause only.
"""

from __future__ import annotations

from ray.exceptions import RayTaskError, UserCodeException

MAX_LINE = 400


def root_cause(error: BaseException) -> BaseException:
    """The exception user code raised, out of Ray's wrappers (a task's, a Ray Data UDF's)."""
    while True:
        if isinstance(error, RayTaskError) and error.cause is not None:
            error = error.cause
        elif isinstance(error, UserCodeException) and error.__cause__ is not None:
            error = error.__cause__
        else:
            return error


def failure_line(error: BaseException) -> str:
    """`Type: message` of the root cause, on one line and bounded."""
    cause = root_cause(error)
    line = " ".join(f"{type(cause).__name__}: {cause}".split())
    return line if len(line) <= MAX_LINE else line[: MAX_LINE - 3] + "..."
