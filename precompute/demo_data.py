"""The demo's data, shipped in the repository's data/demo/: what the demo, the benches and the tests read."""

from pathlib import Path

from precompute.models.settings import Engine
from precompute.models.source import bundled_encoder
from precompute.models.text.reference import TextSample

DEMO_CORPUS = Path(__file__).resolve().parents[1] / "data" / "demo" / "corpus.parquet"
"""5,000 Debian package descriptions (data/README.md)."""
DEMO_INTERACTIONS = DEMO_CORPUS.with_name("interactions.parquet")
"""Users x the packages they depend on, recommend or suggest."""


def demo_engine(**changes: object) -> Engine:
    """The bundled encoder, gated and calibrated on the demo corpus: what the benches run.
    `changes` replace fields by name (Engine.replace), e.g. precision="fp32"."""
    engine = Engine(model=bundled_encoder(), reference=TextSample(path=str(DEMO_CORPUS)))
    return engine.replace(**changes) if changes else engine
