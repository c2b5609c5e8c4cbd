"""A file or folder the pipeline file names: relative to that file, as its author wrote it."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, ValidationInfo

BASE = "base"
"""The validation context key of the folder relative paths are read from (the pipeline file's)."""


def relative_to_file(value: str, info: ValidationInfo) -> str:
    """A relative local path made absolute from the context's base; URIs and absolute paths as given."""
    base = (info.context or {}).get(BASE)
    if base is None or "://" in value or Path(value).is_absolute():
        return value
    return str(Path(base) / value)


Location = Annotated[str, AfterValidator(relative_to_file)]
"""A local path or an object-store URI."""
