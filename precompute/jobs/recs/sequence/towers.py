"""The sequence model as towers (jobs/recs/models.py): SASRec trained on the night's histories
(jobs/recs/sequence/train.py), exported as a pair of tower graphs (models/sequence.py) and put
through the towers' precision ladder and gate (models/towers.py choose_engines), so the top-k
actors run the gated engine."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from precompute.jobs.recs.history.seen import Seen
from precompute.jobs.recs.sequence.train import TrainReport, WarmStart, latest, train_sequence
from precompute.jobs.recs.spec import SequenceSpec
from precompute.models.backends.base import Runner
from precompute.models.engines.runtime import resolve_device
from precompute.models.sequence import HISTORY, ITEM, SASRec, export_towers
from precompute.models.settings import EngineSettings
from precompute.models.towers import (
    GATE_ITEMS,
    TowerEngines,
    TowerInput,
    choose_engines,
    open_tower,
    vectors_of,
)


class SequenceTowers:
    """The sequence model through its gated engines (models/sequence.py export_towers): item j's
    vector is its embedding as the chosen item graph computes it; a user's is the chosen user
    graph's state after their latest items, run here, on the users' side (in each top-k actor,
    which opens its own engine of the graph)."""

    name = "sequence"

    def __init__(
        self, model: SASRec, engines: TowerEngines, items: int, engine: EngineSettings, report: TrainReport
    ) -> None:
        self.graph, self.length, self.engine = engines.user, model.max_length, engine
        self.report, self.engines = report, engines.report()
        self.model = model
        """The trained network: what the job saves for the next night's warm start."""
        with open_tower(engines.item, engine, engines.device) as runner:
            self.items = vectors_of(
                runner, pa.table({ITEM: np.arange(1, items + 1)}), [TowerInput(ITEM, np.int64, None)]
            )
        self.runner: Runner | None = None

    def users(self, seen: Seen) -> np.ndarray:
        if self.runner is None:
            self.runner = open_tower(self.graph, self.engine, resolve_device(self.engine))
        everyone = np.arange(len(seen.offsets) - 1)
        if not len(everyone):
            return np.zeros((0, self.items.shape[1]), np.float32)
        rows = history_rows(seen, everyone, self.length)
        return vectors_of(self.runner, rows, [TowerInput(HISTORY, np.int64, self.length)])

    def __getstate__(self) -> dict[str, object]:
        return {**self.__dict__, "runner": None, "model": None}  # an engine is opened where it runs


def history_rows(train: Seen, users: np.ndarray, length: int) -> pa.Table:
    """Users' latest items as the user graph's feature rows."""
    latest_items = latest(train.items, train.offsets, users, length)
    return pa.table({HISTORY: pa.FixedSizeListArray.from_arrays(latest_items.ravel(), length)})


def sequence(
    train: Seen, items: int, settings: SequenceSpec, engine: EngineSettings, warm: WarmStart | None
) -> SequenceTowers:
    """SASRec trained on the users' histories (from `warm`'s weights where it has them),
    exported and put through the precision ladder: calibrated on the first users' histories and
    all items, gated on the next users' top items."""
    if settings.train_workers > 1:
        from precompute.jobs.recs.sequence.cluster import train_on_cluster  # imports Ray Train

        model, report = train_on_cluster(train.items, train.offsets, items, settings, warm)
    else:
        model, report = train_sequence(train.items, train.offsets, items, settings, warm=warm)
    users = np.arange(len(train.offsets) - 1)
    calibration = users[: settings.calibration_rows]
    gate = users[settings.calibration_rows : settings.calibration_rows + settings.gate_users]
    item_rows = pa.table({ITEM: np.arange(1, items + 1)})
    engines = choose_engines(
        settings,
        export_towers(model),
        (
            history_rows(train, calibration, model.max_length),
            history_rows(train, gate if len(gate) else calibration, model.max_length),
        ),
        (item_rows.slice(0, settings.calibration_rows), item_rows.slice(0, GATE_ITEMS)),
        resolve_device(engine),
        engine,
    )
    return SequenceTowers(model, engines, items, engine, report)
