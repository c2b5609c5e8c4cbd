"""Training the sequence model (models/sequence.py) on the night's histories, within a time budget.

Loss, at every position of every history (jobs/recs/sequence/loss.py): full softmax cross-entropy
over the catalogue, or gSASRec's gBCE over sampled negatives.

Validation: each user's latest item is held out of their training history; every epoch or
every EVAL_STEPS steps, whichever comes first, the model ranks it from the rest (seen items masked) for a seeded sample of users, NDCG@10.
Training stops at `train_budget_s`, after `patience` checks without a better NDCG, or after
`max_epochs`, and keeps the best check's weights. The returned model scores from whole histories, the held-out item included.

Alone, or as one rank of a data-parallel group (`Group`: Ray Train's workers, jobs/recs/sequence/cluster.py).
"""

from __future__ import annotations

import copy
import io
import math
import os
import time
from dataclasses import dataclass, field
from typing import NamedTuple, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch
from torch.nn.parallel import DistributedDataParallel

from precompute.jobs import progress
from precompute.jobs.recs.sequence.loss import step_loss
from precompute.jobs.recs.spec import SequenceSpec
from precompute.jobs.work_dir import WorkPath
from precompute.models.sequence import SASRec

VALIDATION_USERS = 2000
EVAL_K = 10
WARM_MIN_SHARED = 0.9
"""A warm start needs this share of today's items to have weights from the last run."""
EVAL_STEPS = 100
"""Training steps between validation checks at most (a night's data may be a few steps an epoch,
or thousands)."""
T = TypeVar("T")


@dataclass
class TrainReport:
    epochs: int = 0
    steps: int = 0
    seconds: float = 0.0
    device: str = "cpu"
    stopped: str = ""
    """Why training stopped: the budget, patience, or the epoch limit."""
    best_step: int = 0
    best_ndcg10: float = 0.0
    curve: list[float] = field(default_factory=list)
    """Validation NDCG@10 at each check."""
    start: str = "cold"
    """Where the weights started: random (cold, and why) or the last run's (warm_start)."""
    workers: int = 1
    """Data-parallel workers it trained on (jobs/recs/sequence/cluster.py); 1: the job's own process."""
    nodes: int = 1
    """Distinct nodes those workers ran on."""


@dataclass(frozen=True)
class Group:
    """The data-parallel group a process trains in: rank 0 of 1 alone, or one of Ray Train's
    workers, whose torch.distributed process group is up. Each rank takes its share of every
    step's users and DDP averages the gradients, so all ranks hold the same weights; rank 0
    validates, and its decisions (check now, stop) reach every rank, so all take the same steps."""

    rank: int = 0
    size: int = 1

    def agree(self, value: T) -> T:
        """Rank 0's `value`, on every rank."""
        if self.size == 1:
            return value
        box = [value]
        torch.distributed.broadcast_object_list(box, src=0)
        return box[0]

    def share(self, users: np.ndarray) -> np.ndarray:
        """This rank's part of a step's users; a step too small to split is every rank's whole."""
        part = np.array_split(users, self.size)[self.rank]
        return part if len(part) else users


def latest(items: np.ndarray, offsets: np.ndarray, users: np.ndarray, length: int) -> np.ndarray:
    """[users, length] int64: each user's latest `length` items (positions + 1), left-padded with 0."""
    out = np.zeros((len(users), length), np.int64)
    for row, user in enumerate(users):
        history = items[offsets[user] : offsets[user + 1]][-length:]
        if len(history):
            out[row, length - len(history) :] = history + 1
    return out


def length_batches(
    lengths: np.ndarray, users: np.ndarray, size: int, rng: np.random.Generator
) -> list[np.ndarray]:
    """`users` in batches of about `size` of similar history length (a batch is padded to its
    longest), in a random order; ties shuffled, so batches differ from epoch to epoch."""
    order = users[np.lexsort((rng.random(len(users)), lengths[users]))]
    batches = np.array_split(order, max(1, round(len(order) / size)))
    return [batches[i] for i in rng.permutation(len(batches))]


def histories(items: np.ndarray, offsets: np.ndarray, users: np.ndarray, length: int) -> torch.Tensor:
    """Left-padded latest items, trimmed to the longest of these users' histories."""
    longest = int(np.diff(offsets)[users].max(initial=1))
    return torch.from_numpy(latest(items, offsets, users, max(1, min(length, longest))))


def ndcg_at_10(
    model: SASRec, items: np.ndarray, offsets: np.ndarray, users: np.ndarray, device: str
) -> float:
    """Each of `users`' latest item ranked from the rest of their history, the rest masked."""
    model.eval()
    gains = []
    with torch.no_grad():
        vectors = model.item_vectors()
        for start in range(0, len(users), 256):
            batch = users[start : start + 256]
            before = offsets[batch + 1] - 1
            history = latest_before(items, offsets, batch, model.max_length)
            scores = model.user_states(history.to(device)) @ vectors.T
            for row, user in enumerate(batch):
                scores[row, items[offsets[user] : before[row]]] = -math.inf
            target = torch.from_numpy(items[before]).to(device)
            rank = (scores > scores.gather(1, target[:, None])).sum(1)
            gains.append(torch.where(rank < EVAL_K, 1 / torch.log2(rank.float() + 2), 0.0).cpu())
    return float(torch.cat(gains).mean()) if gains else 0.0


def latest_before(items: np.ndarray, offsets: np.ndarray, users: np.ndarray, length: int) -> torch.Tensor:
    """Each user's history less its latest item, left-padded."""
    ends = offsets[users + 1] - 1
    starts = offsets[users]
    cut = np.concatenate([[0], np.cumsum(ends - starts)])
    flat = (
        np.concatenate([items[s:e] for s, e in zip(starts, ends, strict=True)]) if len(users) else items[:0]
    )
    return histories(flat, cut, np.arange(len(users)), length)


def network(settings: SequenceSpec) -> dict[str, int]:
    """The shape of the network: weights carry over between runs only under the same one."""
    return {
        "dim": settings.dim,
        "blocks": settings.blocks,
        "heads": settings.heads,
        "history": settings.history,
    }


def new_model(catalogue: int, settings: SequenceSpec) -> SASRec:
    """A randomly initialised network of `settings`' shape over `catalogue` items."""
    return SASRec(catalogue, settings.dim, settings.blocks, settings.heads, settings.history, settings.dropout)


def save_weights(model: SASRec, settings: SequenceSpec, item_ids: pa.StringArray, path: WorkPath) -> None:
    """What the next night starts from: the weights, the network's shape and the items' ids by row."""
    saved = io.BytesIO()
    torch.save({"items": item_ids.to_pylist(), "network": network(settings), "state": model.state_dict()}, saved)
    path.write_bytes(saved.getvalue())


class WarmStart(NamedTuple):
    state: dict[str, torch.Tensor] | None
    """Weights for today's catalogue; None: train from random ones."""
    reason: str


def warm_start(path: WorkPath, item_ids: pa.StringArray, settings: SequenceSpec) -> WarmStart:
    """(weights for this catalogue, why) from a previous run's save_weights: each item keeps its
    embedding, a new item gets a fresh one; None (train cold) when there is none, the network's
    shape changed, or fewer than WARM_MIN_SHARED of today's items were in it."""
    if not path.is_file():
        return WarmStart(None, "cold: no weights from the published version")
    saved = torch.load(io.BytesIO(path.read_bytes()), weights_only=True)
    if saved["network"] != network(settings):
        return WarmStart(None, f"cold: the network changed from {saved['network']} to {network(settings)}")
    before = pc.index_in(item_ids, value_set=pa.array(saved["items"], pa.string()))
    shared = before.fill_null(-1).to_numpy().astype(np.int64)
    if (shared >= 0).mean() < WARM_MIN_SHARED:
        return WarmStart(None, f"cold: {(shared < 0).sum():,} of {len(item_ids):,} items are new")
    state = dict(saved["state"])
    old = state["item_embedding.weight"]
    fresh = new_model(len(item_ids), settings)
    embedding = fresh.item_embedding.weight.detach().clone()
    rows = np.flatnonzero(shared >= 0)
    embedding[rows + 1] = old[shared[rows] + 1]  # row 0 pads
    state["item_embedding.weight"] = embedding
    return WarmStart(state, f"warm: {len(rows):,} of {len(item_ids):,} items' weights carried over")


def train_sequence(
    items: np.ndarray,
    offsets: np.ndarray,
    catalogue: int,
    settings: SequenceSpec,
    seed: int = 0,
    warm: WarmStart | None = None,
    device: str | None = None,
    group: Group = Group(),
) -> tuple[SASRec, TrainReport]:
    """SASRec trained on users' histories (CSR, each in time order), from the weights of `warm`
    or random ones: the best check's weights by validation NDCG@10 (a warm start's own among them).
    On `device`; None: the GPU where torch sees one. In a `group`, rank 0's model is the result."""
    torch.manual_seed(seed)
    if group.size == 1:  # a Ray Train worker keeps the threads Ray gave it (OMP_NUM_THREADS)
        torch.set_num_threads(len(os.sched_getaffinity(0)))
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    rng = np.random.default_rng(seed)
    lengths = np.diff(offsets)
    trainable = np.flatnonzero(lengths >= 3)  # one item to validate on, two to learn a step from
    validation = np.sort(rng.choice(trainable, min(VALIDATION_USERS, len(trainable)), replace=False))
    # Training histories: every user's, less the latest item of those validated on.
    keep = np.ones(len(items), bool)
    keep[offsets[validation + 1] - 1] = False
    train_offsets = np.concatenate([[0], np.cumsum(lengths - np.isin(np.arange(len(lengths)), validation))])
    train_items = items[keep]
    learners = np.flatnonzero(np.diff(train_offsets) >= 2)
    if not len(learners):
        raise ValueError(
            "the sequence model learns from users with two or more interactions, and there are none"
        )

    model = new_model(catalogue, settings)
    if warm is not None and warm.state is not None:
        model.load_state_dict(warm.state)
    model = model.to(device)
    step_model = DistributedDataParallel(model) if group.size > 1 else model  # DDP: gradients averaged
    optimiser = torch.optim.Adam(model.parameters(), lr=settings.learning_rate, betas=(0.9, 0.98))
    report = TrainReport(device=device, start=warm.reason if warm else "cold")
    best_state = copy.deepcopy(model.state_dict())
    start = time.perf_counter()

    def check() -> None:
        """Validate (rank 0); keep the weights if they are the best yet, and say why to stop, if so."""
        nonlocal best_state
        if group.rank == 0:
            ndcg = round(ndcg_at_10(model, items, offsets, validation, device), 4)
            model.train()
            report.curve.append(ndcg)
            if ndcg > report.best_ndcg10 or len(report.curve) == 1:
                best_state, report.best_step, report.best_ndcg10 = (
                    copy.deepcopy(model.state_dict()),
                    report.steps,
                    ndcg,
                )
            elif len(report.curve) - report.curve.index(report.best_ndcg10) > settings.patience:
                report.stopped = f"{settings.patience} checks without a better validation NDCG@10"
            if time.perf_counter() - start > settings.train_budget_s:
                report.stopped = f"train_budget_s {settings.train_budget_s}"
            left = max(0.0, settings.train_budget_s - (time.perf_counter() - start))
            progress.note(
                "sequence",
                f"epoch {report.epochs}, step {report.steps}, validation NDCG@10 {ndcg:.4f} (best "
                f"{report.best_ndcg10:.4f} at step {report.best_step}), {left:.0f} s of {settings.train_budget_s:.0f} s "
                f"budget left" + (f"; stopping: {report.stopped}" if report.stopped else ""),
            )
        report.stopped = group.agree(report.stopped)

    every = min(EVAL_STEPS, max(1, round(len(learners) / settings.batch)))  # length_batches' count
    if warm is not None and warm.state is not None:
        check()  # the weights to beat
    model.train()
    while not report.stopped:
        report.epochs += 1
        for batch in length_batches(np.diff(train_offsets), learners, settings.batch, rng):
            sequence = histories(train_items, train_offsets, group.share(batch), settings.history + 1).to(device)
            inputs, targets = sequence[:, :-1], sequence[:, 1:]
            loss = step_loss(
                model.item_vectors(), step_model(inputs)[targets > 0], targets[targets > 0] - 1, settings
            )
            optimiser.zero_grad(set_to_none=True)
            loss.backward()
            optimiser.step()
            report.steps += 1
            if report.steps % every == 0 or group.agree(time.perf_counter() - start > settings.train_budget_s):
                check()
                if report.stopped:
                    break
        if report.epochs == settings.max_epochs and not report.stopped:
            if report.steps % every:
                check()
            report.stopped = report.stopped or f"max_epochs {settings.max_epochs}"
    model.load_state_dict(best_state)
    report.seconds = round(time.perf_counter() - start, 1)
    return model.eval().cpu(), report
