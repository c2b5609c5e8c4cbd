"""One exception root for stores/, and the few cases callers handle differently."""

from __future__ import annotations


class StoreError(Exception):
    """Root of every error raised by stores/."""


class StoreUnavailableError(StoreError):
    """The store cannot answer now (down, overloaded, a version switching under us); retryable.

    The service answers 503 with `Retry-After: retry_after`; a job retries after the delay.
    """

    def __init__(self, message: str, retry_after: float = 1.0) -> None:
        super().__init__(f"{message} (retry after {retry_after:g} s)")
        self.retry_after = retry_after


class VersionNotFoundError(StoreError):
    """The named version does not exist, or nothing is published yet; not retryable."""


class PublishValidationError(StoreError):
    """A version failed its checks before publish (record count, sample reads); nothing was switched."""
