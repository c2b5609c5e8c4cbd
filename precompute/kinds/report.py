"""What a night reports: each output's `OutputReport`, the kind's typed `Computed` inside it, and
the night's `RunReport` around them.

The run report's JSON (flows/run_report.py), its page (flows/run_page.py) and its metrics read
these fields; a kind adds its own by subclassing `Computed`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

STEPS = ("compute", "check", "publish", "collect")
"""The framework's steps of every output's night (flows/lifecycle.py), timed in `steps`."""


UNREPORTED = {"reported": False}
"""A Computed field's metadata: what the check reads but the report shows elsewhere, or not at all."""


@dataclass(kw_only=True)
class Computed:
    """What a kind's compute did: rows read, rejected, reused and computed, and its own stages' seconds."""

    rows: int
    """Input rows read."""
    rejects: int = 0
    """Rows quarantined with their reasons (in `rejects_path`)."""
    rejects_path: str | None = None
    reused: int = 0
    """Results carried from the published version (unchanged input, no inference)."""
    computed: int = 0
    """Results computed this night."""
    seconds: dict[str, float] = field(default_factory=dict)
    """The kind's own stages (validate, train, engine, embed, top-k, ...), in order."""
    rates: dict[str, float] = field(default_factory=dict)
    """Rows (or users) per second of the stages that pass over every row."""
    rate_unit: str = "rows/s"
    engine: dict[str, str] | None = None
    """backend, device and precision of the engine that computed, for a kind that runs one."""
    gate: list[dict[str, Any]] = field(default_factory=list)
    """Each precision the engine's ladder gated against FP32, with its figures."""
    samples: dict[str, bytes] = field(default_factory=dict, repr=False, metadata=UNREPORTED)
    """A few key -> value as written, read back before a key-value version is published."""

    def fields(self) -> dict[str, Any]:
        """The JSON of the kind's figures (those marked UNREPORTED left out)."""
        return {f.name: _plain(getattr(self, f.name)) for f in fields(self) if f.metadata != UNREPORTED}


@dataclass(kw_only=True)
class OutputReport:
    """One output's night: whether it published which version, the kind's figures, the check,
    the versions collected, and where the time went."""

    kind: str
    published: bool = False
    version: str | None = None
    error: str | None = None
    """The step it failed at and why, in one line."""
    computed: Computed | None = None
    validation: Any = None
    """What the kind's validate returned: the index check, the held-out quality, or None."""
    steps: dict[str, float] = field(default_factory=dict)
    """Seconds of the framework's steps (STEPS); the kind's own stages are its Computed.seconds."""
    deleted_versions: list[str] = field(default_factory=list)

    def json(self) -> dict[str, Any]:
        """The run report's block: the kind's figures beside the framework's, flat."""
        figures = self.computed.fields() if self.computed is not None else {}
        return {
            "kind": self.kind,
            "published": self.published,
            "version": self.version,
            **({"error": self.error} if self.error else {}),
            **figures,
            "steps": self.steps,
            "validation": _plain(self.validation),
            "deleted_versions": self.deleted_versions,
        }


def _plain(value: Any) -> Any:
    """A dataclass as its dict, anything else as it is (JSON's types)."""
    if hasattr(value, "__dataclass_fields__"):
        return asdict(value)
    return value


@dataclass(frozen=True)
class RunReport:
    """One night: each output's report in the order they ran, and the one line of each that failed."""

    run: str
    pipeline: str
    outputs: dict[str, OutputReport]
    failed: dict[str, str]

    def json(self) -> dict[str, Any]:
        return {
            "run": self.run,
            "pipeline": self.pipeline,
            "outputs": {name: output.json() for name, output in self.outputs.items()},
            "failed": self.failed,
        }
