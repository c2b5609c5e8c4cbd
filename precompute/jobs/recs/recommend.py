"""Recommendations as a Ray job: read -> validate -> train, group by user -> top-k -> the caller's sink.

    driver:       read -> tag_rejects -> rejects.parquet (failing on their ratio) and good rows,
                  file by file, each file's kept (jobs/recs/history/interaction_files.py) -> item counts (the
                  ranker's prior); training; each user's history and fingerprint
                  (jobs/recs/history/user_histories.py) -> users to rescore
    main pass:    their histories, in blocks -> TopKActor pool, or the driver for at most
                  topk_driver_users users or on a one-node Ray (jobs/settings.py; exact: blocked
                  matmul, mask, topk; or an IVF index's candidates) -> values -> sink

Two towers (jobs/recs/models.py): content (the item tower is the corpus encoder, whose
embeddings the caller passes), a collaborative model trained here on the night's interactions,
or the pipeline's own towers (jobs/recs/own_towers.py, computed by the caller). Scoring is exact
(one matrix multiply per block of users against every item) up to 50,000 items on CPUs, or
for few users (an incremental night's); past that, candidates from an IVF index over the items
(their exact scores), at the fewest probed lists whose top k keeps `min_recall` of the exact top
k on a sample of users (jobs/recs/topk/candidates.py).

Incremental: given the published version's staged state, only users whose inputs moved are
rescored and the store copies the others (jobs/recs/state.py says which, and what a copy misses).
Unchanged: when the interactions' files, the items and the settings are the published version's,
it is copied whole and nothing is read, trained or scored.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

import numpy as np
import pyarrow as pa
import ray
import torch
from ray.actor import ActorHandle

from precompute.jobs import progress
from precompute.jobs.inputs import InteractionsInput
from precompute.jobs.nights import Night, Previous, record_night
from precompute.jobs.ray_session import actor_pool, one_node, ray_session
from precompute.jobs.recs.history.interaction_files import KeptFiles, validated_interactions
from precompute.jobs.recs.history.interactions import INDEX
from precompute.jobs.recs.history.kept_histories import grouped, keep_grouping
from precompute.jobs.recs.history.seen import Seen, user_ids, users_subset
from precompute.jobs.recs.history.user_histories import history_blocks, seen_of, user_rows
from precompute.jobs.recs.kept_als import interactions_sketch, kept_als, save_als
from precompute.jobs.recs.quality import RecsQuality, evaluate, quality_of
from precompute.jobs.recs.sequence.towers import SequenceTowers
from precompute.jobs.recs.sequence.train import save_weights, warm_start
from precompute.jobs.recs.spec import RecsSpec
from precompute.jobs.recs.state import (
    ALS_FILE,
    SEQUENCE_WEIGHTS,
    STATE,
    Items,
    inputs_digest,
    model_fingerprint,
    plan,
    rescore,
    stage,
    trained_digest,
    unchanged_night,
)
from precompute.jobs.recs.topk.candidates import CandidateTopK, choose_ranking, ranker_of
from precompute.jobs.recs.topk.exact import BlockedTopK, popularity_prior
from precompute.jobs.recs.topk.kept_index import keep_index, kept_index
from precompute.jobs.recs.topk.repeat import Repeat, seen_scores, with_repeats
from precompute.jobs.recs.towers import ALSTowers, OwnTowers, Towers, rows_of
from precompute.jobs.settings import JobSettings
from precompute.jobs.validate import REJECTS
from precompute.jobs.work_dir import WorkPath, cache_dir
from precompute.models.datasets import input_files
from precompute.models.settings import EngineSettings
from precompute.stores.key_value.records import RANKED, encode_ranked
from precompute.stores.key_value.sink import KeyValueSink
from precompute.stores.key_value.versions import CopyPlan

SAMPLES = 5
INTERACTIONS = "interactions"
"""The folder of the output's cache where its input's files' validations are kept (jobs/recs/history/interaction_files.py)."""
RECIPE = "towers/log1p-prior/exact-topk/v3"
"""The scoring code's identity in the model fingerprint: change it when a change to the code changes values."""


@dataclass(frozen=True)
class RecsJobReport:
    rows: int
    rejects: int
    rejects_path: str
    users: int
    rescored: int
    copied: int
    """Users whose record the store copies from the published version instead."""
    mode: str
    """"full" (every user scored), "incremental" (only users whose inputs moved) or "unchanged"
    (nothing moved: the published version copied whole, its quality as measured then)."""
    mode_reason: str
    k: int
    users_per_s: float
    """Rescored users over the recommend stage (actor start, top-k), not the kernel alone."""
    seconds: dict[str, float]
    samples: dict[str, bytes]
    """A few user_id -> value as written, for the read-back checks of a publish."""
    quality: RecsQuality
    """The published model's held-out quality beside the baselines'; the model scored is the one
    measured (jobs/recs/quality.py)."""
    towers: dict[str, object] | None = None
    """The towers model: its engines and feature rows (jobs/recs/own_towers.py), and the users
    without a features row (ranked by the prior and content alone)."""
    sequence: dict[str, object] | None = None
    """The sequence model, when published: its training (jobs/recs/sequence/train.py TrainReport:
    warm or cold start, steps, why it stopped, the validation curve) and engines."""
    ranking: dict[str, object] | None = None
    """How the top k was found (jobs/recs/topk/candidates.py Ranking: exact, or the IVF index and
    the recall curve it walked on the sample) and `ranked_in` "driver" or "actors"
    (jobs/settings.py topk_driver_users; None where no user was ranked); None on an unchanged
    night."""
    als: str | None = None
    """Whether the published ALS was kept or one trained, and why (jobs/recs/kept_als.py)."""
    grouping: str | None = None
    """How the users' histories were grouped: from every row, or the published night's
    regrouped with the new files' rows (jobs/recs/history/kept_histories.py); None on an unchanged night."""


def ranked_values(indices: np.ndarray, scores: np.ndarray) -> list[bytes]:
    """Record values; a user with fewer than k unseen items gets a shorter one (no filler pairs)."""
    lengths = (indices >= 0).sum(axis=1) * RANKED.itemsize
    values = encode_ranked(np.maximum(indices, 0), scores)
    return [value[:length] for value, length in zip(values, lengths, strict=True)]


class TopKActor:
    """Holds the model's towers (their item matrix read where Ray's object store holds it: a
    node's actors share one copy), the prior and the ranker (exact, or the items' lists, which
    hold no vector); scores a block of users per call."""

    def __init__(
        self,
        towers: ray.ObjectRef,
        prior: np.ndarray | None,
        k: int,
        block: int,
        ranking: ray.ObjectRef,
        counter: ActorHandle | None = None,
        repeat: Repeat | None = None,
    ) -> None:
        # Ray sets OMP_NUM_THREADS=1 in an actor with under one CPU; the matmul wants every core.
        torch.set_num_threads(len(os.sched_getaffinity(0)))
        self.towers: Towers = ray.get(towers)
        self.ranker = ranker_of(self.towers.items, k, block, prior, ray.get(ranking))
        self.prior, self.repeat, self.counter = prior, repeat, counter

    def __call__(self, batch: pa.Table) -> pa.Table:
        values = ranked(self.towers, self.ranker, seen_of(batch), self.prior, self.repeat)
        progress.add(self.counter, batch.num_rows)
        return values


def ranked(
    towers: Towers,
    ranker: BlockedTopK | CandidateTopK,
    seen: Seen,
    prior: np.ndarray | None = None,
    repeat: Repeat | None = None,
) -> pa.Table:
    """(id, value) of the users in `seen`: their tower, their top k (with their own items where
    `repeat` allows them: jobs/recs/topk/repeat.py), the value as written."""
    vectors = towers.users(seen)
    indices, scores = ranker(torch.from_numpy(vectors), seen)
    if repeat is not None:
        own = seen_scores(vectors, towers.items, prior, seen)
        indices, scores = with_repeats(indices, scores, own, repeat)
    values = pa.array(ranked_values(indices, scores), pa.binary())
    return pa.table({"id": pa.array(seen.ids, pa.string()), "value": values})


def rank_in_driver(
    towers: Towers,
    ranker: BlockedTopK | CandidateTopK,
    seen: Seen,
    users: np.ndarray,
    block: int,
    counter: progress.Counter | None,
    prior: np.ndarray | None = None,
    repeat: Repeat | None = None,
) -> list[pa.Table]:
    """The values of `users` (positions in `seen`), `block` users at a time, as TopKActor ranks them."""
    tables = []
    for start in range(0, len(users), block):
        tables.append(ranked(towers, ranker, users_subset(seen, users[start : start + block]), prior, repeat))
        progress.add(counter, tables[-1].num_rows)
    return tables


def run_recs_job(
    interactions: InteractionsInput,
    settings: RecsSpec,
    job: JobSettings,
    items: Items,
    sink: KeyValueSink,
    work_dir: WorkPath,
    before_write: Callable[[int, CopyPlan | None], None] | None = None,
    items_model: str = "",
    previous: Previous | None = None,
    own: OwnTowers | None = None,
    output: str = "recs",
    engine: EngineSettings | None = None,
) -> RecsJobReport:
    """Top-k items for every user with a valid interaction: all of them, or with `previous` (the
    published version) only those whose inputs moved since, written through `sink`.

    items_model: the identity of the model that embedded the items (part of the model fingerprint).
    own: the towers model's vectors (jobs/recs/own_towers.py), for settings.model "towers".
    output: the output's name, for the progress lines (jobs/progress.py).
    engine: how this machine runs engines (the sequence model's), as train_towers takes it.
    before_write: called with the number of records (users) and, in an incremental run, the
    copy plan (the version to copy, the users gone since), once the users to rescore are scored
    and before the first write: a store creates the version there, and copies it (the sink then
    overwrites the rescored users). The values are materialised before the write (about 70
    bytes a user) so that the samples are exactly what was written. Stages in `work_dir` what
    the next run compares with (jobs/recs/state.py).
    """
    if len(items.ids) != len(items.vectors) or len(items.ids) != len(items.keys):
        raise ValueError(f"{len(items.ids)} item ids, {len(items.vectors)} vectors, {len(items.keys)} keys")
    rejects_path = work_dir / REJECTS
    start = time.perf_counter()
    files, vocabulary = input_files(interactions).digests(), items.vocabulary
    inputs = inputs_digest(interactions, files, settings, vocabulary, items.keys, items_model, RECIPE, own, engine)
    seconds: dict[str, float] = {"digest": time.perf_counter() - start}
    if (night := unchanged_night(inputs, previous, work_dir)) is not None:
        assert previous is not None  # unchanged_night compares with it
        start = time.perf_counter()
        if before_write:
            before_write(night.figures["users"], CopyPlan(previous.version, []))
        seconds["write"] = time.perf_counter() - start
        return RecsJobReport(
            rows=night.figures["rows"],
            rejects=night.figures["rejects"],
            rejects_path=str(rejects_path),
            users=night.figures["users"],
            rescored=0,
            copied=night.figures["users"],
            mode="unchanged",
            mode_reason=f"the interactions, items and settings are those of {previous.version}",
            k=settings.k,
            users_per_s=0.0,
            seconds={stage: round(value, 3) for stage, value in seconds.items()},
            samples={},
            quality=quality_of(night.figures["quality"]),
        )
    with ray_session(job.ray_address):
        resources = ray.cluster_resources()
        gpus = resources.get("GPU", 0) > 0
        start = time.perf_counter()
        kept_files = KeptFiles(cache_dir(job.work_dir, output) / INTERACTIONS, files, vocabulary)
        validated = validated_interactions(interactions, items.ids, rejects_path, kept_files)
        valid, rows, rejects = validated.good, validated.rows, validated.rejects
        seconds["validate"] = time.perf_counter() - start

        start = time.perf_counter()
        counts = np.bincount(valid[INDEX].to_numpy(), minlength=len(items.ids))
        prior = popularity_prior(counts, settings.popularity_weight) if settings.popularity_weight else None
        seconds["popularity"] = time.perf_counter() - start

        start = time.perf_counter()
        before = None if previous is None else previous.run_dir / STATE
        kept = kept_als(None if before is None else before / ALS_FILE, settings, vocabulary, interactions_sketch(valid))
        warm = None if before is None else warm_start(before / SEQUENCE_WEIGHTS, items.ids, settings.sequence)
        with progress.stage(output, "train"):
            quality, towers = evaluate(valid, items.vectors, settings, own=own, engine=engine, warm=warm, kept=kept)
        trained = settings.model != "content"
        repeat = None if quality.repeat is None else Repeat(**quality.repeat)
        seconds["train"] = time.perf_counter() - start

        start = time.perf_counter()
        scoring = {
            "model": towers.name,
            "trained": trained_digest(towers, own) if trained else None,
            "content_weight": settings.content_weight if trained else None,
            "popularity_weight": settings.popularity_weight,
            "repeat": quality.repeat,
        }
        fingerprint = model_fingerprint(items_model, settings.k, scoring, len(items.ids), vocabulary, RECIPE)
        planned = plan(fingerprint, items, previous)
        grouping, grouped_how = grouped(validated, vocabulary, previous)
        seen = grouping.seen
        users = user_rows(grouping, planned.changed_items)
        mode, reason, copy, rescoring = "full", planned.reason, None, np.ones(users.num_rows, bool)
        if planned.previous is not None and users.num_rows not in planned.previous.records:
            reason = (
                f"{users.num_rows} users are more or fewer than a copy of {planned.previous.version} holds"
            )
        elif planned.previous is not None:
            rescoring, gone = rescore(users, planned.users)
            mode, copy = "incremental", CopyPlan(planned.previous.version, gone)
        rescored = int(rescoring.sum())
        stage(work_dir, fingerprint, items.ids, items.keys, users, planned.items_base)
        keep_grouping(work_dir / STATE, grouping, validated, vocabulary)
        figures = {"rows": rows, "rejects": rejects, "users": users.num_rows, "quality": asdict(quality)}
        record_night(work_dir / STATE, Night(inputs, figures))
        sequence_report = None
        parts = getattr(towers, "parts", [])  # a blend's; the content model has none
        if sequence := next((part for part, _ in parts if isinstance(part, SequenceTowers)), None):
            save_weights(sequence.model, settings.sequence, items.ids, work_dir / STATE / SEQUENCE_WEIGHTS)
            sequence_report = {"training": asdict(sequence.report), "engines": sequence.engines}
        if als := next(((part, scale) for part, scale in parts if isinstance(part, ALSTowers)), None):
            save_als(work_dir / STATE / ALS_FILE, *als, settings, vocabulary, kept, asdict(quality))
        seconds["group"] = time.perf_counter() - start

        start = time.perf_counter()
        dims = towers.items.shape[1] + (prior is not None)
        previous_index = kept_index(planned.previous, items.keys, dims)
        ranking = choose_ranking(
            settings.topk,
            towers,
            prior,
            settings.k,
            job.users_per_block,
            seen,
            settings.min_recall,
            gpus,
            rescored,
            previous_index,
        )
        if ranking.lists is not None:
            carried = previous_index if ranking.kept_from else None
            keep_index(work_dir / STATE, ranking.lists, items.keys, carried, ranking.check)
        seconds["index"] = time.perf_counter() - start

        start = time.perf_counter()
        values, ranked_in = None, None
        if rescored:
            chosen, block = np.flatnonzero(rescoring), ranking.users_per_call(job.users_per_block, dims)
            in_driver = rescored <= job.topk_driver_users or (job.topk_driver_users > 0 and one_node())
            ranked_in = "driver" if in_driver and not gpus else "actors"
            with progress.stage(output, "top-k", rescored, counted=ranked_in) as counter:
                if ranked_in == "driver":
                    ranker = ranker_of(towers.items, settings.k, block, prior, ranking)
                    values = ray.data.from_arrow(rank_in_driver(towers, ranker, seen, chosen, block, counter, prior, repeat))
                else:
                    values = history_blocks(seen, chosen, block).map_batches(
                        TopKActor,
                        fn_constructor_kwargs={
                            "towers": ray.put(towers),
                            "prior": prior,
                            "k": settings.k,
                            "block": block,
                            "ranking": ray.put(replace(ranking, check=None)),
                            "counter": counter,
                            "repeat": repeat,
                        },
                        batch_size=block,
                        batch_format="pyarrow",
                        **actor_pool(job.topk_actors, gpus),
                    ).materialize()
        seconds["recommend"] = time.perf_counter() - start
        samples = {row["id"]: row["value"] for row in values.take(SAMPLES)} if values else {}

        start = time.perf_counter()
        with progress.stage(output, "write"):
            if before_write:
                before_write(users.num_rows, copy)
            if values:
                sink.routed(values, rescored).write_datasink(sink)
        seconds["write"] = time.perf_counter() - start
    towers_report = None
    if own is not None:
        without = int((~rows_of(own.user_ids, user_ids(users["id"]))[0]).sum())
        towers_report = {**own.report, "users_without_features": without}
    return RecsJobReport(
        rows=rows,
        rejects=rejects,
        rejects_path=str(rejects_path),
        users=users.num_rows,
        rescored=rescored,
        copied=users.num_rows - rescored,
        mode=mode,
        mode_reason=reason,
        k=settings.k,
        users_per_s=round(rescored / seconds["recommend"], 1) if rescored else 0.0,
        seconds={stage: round(value, 3) for stage, value in seconds.items()},
        samples=samples,
        quality=quality,
        towers=towers_report,
        sequence=sequence_report,
        ranking={**ranking.report(), "ranked_in": ranked_in},
        als=kept.reason if als else None,
        grouping=grouped_how,
    )
