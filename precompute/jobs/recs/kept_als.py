"""ALS kept through nights that change few interactions: what lets a collaborative night cost
what changed.

Trained again on a night with 1% new interactions, ALS has new item factors, which move every
user's scores: every user is rescored and the version written whole. Kept, the item factors and
the part's scale are the published version's, the model fingerprint does not move
(jobs/recs/state.py trained_digest), and the run is incremental: only the users whose
interactions changed are rescored, their vectors solved again from their own histories against
the kept factors, as every night solves them.

The model is kept while at most `retrain_share` (RecsSpec) of the interactions that tonight and
the night it was trained hold between them are not in both (so small changes that add up over
nights retrain it), and while the ALS settings and the catalogue are those it was trained with.
The share (1 - their Jaccard index) is estimated from bottom-k sketches of row hashes (SKETCH
rows: 8 MB however many interactions there are), as Broder's MinHash does. polars' row hash may
change with its version: the night after an upgrade retrains. A kept model learns nothing from
the rows that changed until a night past the share retrains it.

Where ALS is the only model the night would train (jobs/recs/models.py candidates), a kept one
is not evaluated again either: its held-out figures are those of the night it was trained
(jobs/recs/quality.py evaluate), whose verdict on it stands while it is kept. Measuring
scores a sample of 5,000 users against every item for each model and baseline: at 1M items the
larger part of a night's training stage.
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple

import numpy as np
import polars as pl
import pyarrow as pa

from precompute.jobs.recs.history.interactions import INDEX, USER, WEIGHT
from precompute.jobs.recs.spec import RecsSpec
from precompute.jobs.recs.state import part_digest
from precompute.jobs.recs.towers import ALSTowers, als_model
from precompute.jobs.work_dir import WorkPath, copy_file

SKETCH = 2**20
"""Hashes a night keeps of its interactions: the smallest, so two nights keep the same rows'."""


class KeptALS(NamedTuple):
    towers: ALSTowers | None
    """The published version's ALS; None: train tonight."""
    scale: float
    reason: str
    trained_on: np.ndarray
    """The sketch of the interactions the ALS was trained on: tonight's when it trains tonight.
    Every kept night compares with it, so changes that add up over nights retrain it."""
    quality: dict[str, Any] | None = None
    """A kept ALS's held-out figures (jobs/recs/quality.py RecsQuality, as a dict), measured the
    night it was trained; None when it trains tonight or a recs setting changed since."""
    source: WorkPath | None = None
    """The published run's file a kept ALS was read from."""


def retrain(why: str, sketch: np.ndarray) -> KeptALS:
    return KeptALS(None, 1.0, f"trained: {why}", sketch)


def interactions_sketch(valid: pa.Table) -> np.ndarray:
    """The SKETCH smallest distinct hashes of the rows (user, item position, weight), sorted."""
    rows = pl.from_arrow(valid.select([USER, INDEX, WEIGHT]))
    return np.unique(rows.hash_rows(seed=0).to_numpy())[:SKETCH]


def changed_share(before: np.ndarray, now: np.ndarray) -> float:
    """1 - the Jaccard index of two nights' rows, from their sketches: of the k smallest hashes of
    both nights together, the share that is not in both."""
    k = min(len(before), len(now))
    if not k:
        return 1.0
    smallest = np.union1d(before, now)[:k]
    return float(1 - np.isin(smallest, np.intersect1d(before, now, assume_unique=True)).mean())


def trained_with(settings: RecsSpec, vocabulary: str) -> str:
    """What an ALS's item factors mean: its settings and the catalogue, in order (`vocabulary`:
    jobs/recs/state.py vocabulary_digest)."""
    fields = {name: getattr(settings, name) for name in ("factors", "regularization_als", "alpha", "iterations")}
    return json.dumps({**fields, "vocabulary": vocabulary}, sort_keys=True)


def save_als(
    path: WorkPath,
    towers: ALSTowers,
    scale: float,
    settings: RecsSpec,
    vocabulary: str,
    kept: KeptALS,
    quality: dict[str, Any],
) -> None:
    """Tonight's ALS and its held-out `quality`, for the next night's kept_als. A kept one judged
    under tonight's settings is its published file copied (linked on local disk: work_dir.copy_file;
    copied, still cheaper than writing the factors again): its
    factors, sketch and settings are the file's, and so are the figures it is judged by, those
    of the night it was trained."""
    if kept.source is not None and kept.quality is not None:
        copy_file(kept.source.fs, kept.source.path, path.path)
        return
    with path.writer() as out:
        np.savez(
            out,
            item_factors=np.asarray(towers.model.item_factors, np.float32),
            scale=np.float64(scale),
            sketch=kept.trained_on,
            trained_with=np.array(trained_with(settings, vocabulary)),
            quality=np.array(json.dumps(quality)),
            judged_with=np.array(settings.model_dump_json()),
            digest=np.frombuffer(part_digest(towers), np.uint8),
        )


def kept_als(path: WorkPath | None, settings: RecsSpec, vocabulary: str, sketch: np.ndarray) -> KeptALS:
    """The published version's ALS (at `path`; None: nothing is published) and its scale when
    tonight, whose interactions' sketch is `sketch`, may keep them, else why not."""
    if path is None:
        return retrain("nothing published", sketch)
    if not path.is_file():
        return retrain("the published version left no ALS", sketch)
    with path.fs.open_input_file(path.path) as file, np.load(file, allow_pickle=False) as saved:
        if str(saved["trained_with"]) != trained_with(settings, vocabulary):
            return retrain("the ALS settings or the items changed", sketch)
        trained_on = saved["sketch"]
        share = changed_share(trained_on, sketch)
        if share > settings.retrain_share:
            why = f"{share:.1%} of the interactions changed since it was trained (retrain_share {settings.retrain_share:.0%})"
            return retrain(why, sketch)
        model = als_model(settings)
        model.item_factors = saved["item_factors"]
        reason = f"kept: {share:.1%} of the interactions changed since it was trained"
        # Its figures hold for the blend it was evaluated in: every recs setting as it was then.
        judged = "judged_with" in saved.files and str(saved["judged_with"]) == settings.model_dump_json()
        quality = json.loads(str(saved["quality"])) if judged else None
        digest = saved["digest"].tobytes() if "digest" in saved.files else None  # older files: hashed tonight
        return KeptALS(ALSTowers(model, digest), float(saved["scale"]), reason, trained_on, quality, path)
