"""One exception root for models/, and the few cases callers handle differently."""

from __future__ import annotations


class ModelError(Exception):
    """Root of every error raised by models/."""


class InvalidInputError(ModelError, ValueError):
    """A text that cannot be encoded; names the row so a job can quarantine it."""

    def __init__(self, row: int, reason: str) -> None:
        super().__init__(f"row {row}: {reason}")
        self.row = row
        self.reason = reason


class BackendUnavailableError(ModelError):
    """The selected backend or device is not installed or not present on the machine."""


class GateFailedError(ModelError):
    """No precision on the ladder, FP32 included, passed the accuracy gate."""
