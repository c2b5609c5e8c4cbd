"""Training the sequence model (models/sequence.py) on the night's histories, within a time budget.

Loss: full softmax cross-entropy over the catalogue at every position of every history (SASRec
trained this way beats its original sampled binary loss by a wide margin: Klenitskiy and Vasilev,
"Turning Dross Into Gold Loss: is BERT4Rec really better than SASRec?", RecSys 2023).

Validation: each user's latest item is held out of their training history; every EVAL_STEPS
steps the model ranks it from the rest (seen items masked) for a seeded sample of users, NDCG@10.
Training stops at `train_budget_s`, after `patience` checks without a better NDCG, or after
`max_epochs`, and keeps the best check's weights. The returned model scores from whole histories, the held-out item included.
"""

from __future__ import annotations

import copy
import math
import os
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from precompute.jobs.recs_spec import SequenceSpec
from precompute.models.sequence import SASRec

VALIDATION_USERS = 2000
EVAL_K = 10
EVAL_STEPS = 100
"""Training steps between validation checks (a night's data may be a few steps an epoch, or thousands)."""


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
    """Validation NDCG@10 every EVAL_STEPS steps."""


def latest(items: np.ndarray, offsets: np.ndarray, users: np.ndarray, length: int) -> np.ndarray:
    """[users, length] int64: each user's latest `length` items (positions + 1), left-padded with 0."""
    out = np.zeros((len(users), length), np.int64)
    for row, user in enumerate(users):
        history = items[offsets[user] : offsets[user + 1]][-length:]
        if len(history):
            out[row, length - len(history) :] = history + 1
    return out


def length_batches(lengths: np.ndarray, users: np.ndarray, size: int, rng: np.random.Generator) -> list[np.ndarray]:
    """`users` in batches of about `size` of similar history length (a batch is padded to its
    longest), in a random order; ties shuffled, so batches differ from epoch to epoch."""
    order = users[np.lexsort((rng.random(len(users)), lengths[users]))]
    batches = np.array_split(order, max(1, round(len(order) / size)))
    return [batches[i] for i in rng.permutation(len(batches))]


def histories(items: np.ndarray, offsets: np.ndarray, users: np.ndarray, length: int) -> torch.Tensor:
    """Left-padded latest items, trimmed to the longest of these users' histories."""
    longest = int(np.diff(offsets)[users].max(initial=1))
    return torch.from_numpy(latest(items, offsets, users, max(1, min(length, longest))))


def ndcg_at_10(model: SASRec, items: np.ndarray, offsets: np.ndarray, users: np.ndarray, device: str) -> float:
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
    flat = np.concatenate([items[s:e] for s, e in zip(starts, ends, strict=True)]) if len(users) else items[:0]
    return histories(flat, cut, np.arange(len(users)), length)


def train_sequence(
    items: np.ndarray, offsets: np.ndarray, catalogue: int, settings: SequenceSpec, seed: int = 0
) -> tuple[SASRec, TrainReport]:
    """SASRec trained on users' histories (CSR, each in time order): the best epoch by validation NDCG@10."""
    torch.manual_seed(seed)
    torch.set_num_threads(len(os.sched_getaffinity(0)))
    device = "cuda" if torch.cuda.is_available() else "cpu"
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
        raise ValueError("the sequence model learns from users with two or more interactions, and there are none")

    model = SASRec(catalogue, settings.dim, settings.blocks, settings.heads, settings.history, settings.dropout)
    model = model.to(device)
    optimiser = torch.optim.Adam(model.parameters(), lr=settings.learning_rate, betas=(0.9, 0.98))
    report = TrainReport(device=device)
    best_state = copy.deepcopy(model.state_dict())
    start = time.perf_counter()

    def check() -> None:
        """Validate; keep the weights if they are the best yet, and say why to stop, if so."""
        nonlocal best_state
        ndcg = round(ndcg_at_10(model, items, offsets, validation, device), 4)
        model.train()
        report.curve.append(ndcg)
        if ndcg > report.best_ndcg10 or len(report.curve) == 1:
            best_state, report.best_step, report.best_ndcg10 = copy.deepcopy(model.state_dict()), report.steps, ndcg
        elif len(report.curve) - report.curve.index(report.best_ndcg10) > settings.patience:
            report.stopped = f"{settings.patience} checks without a better validation NDCG@10"
        if time.perf_counter() - start > settings.train_budget_s:
            report.stopped = f"train_budget_s {settings.train_budget_s}"

    model.train()
    while not report.stopped:
        report.epochs += 1
        for batch in length_batches(np.diff(train_offsets), learners, settings.batch, rng):
            sequence = histories(train_items, train_offsets, batch, settings.history + 1).to(device)
            inputs, targets = sequence[:, :-1], sequence[:, 1:]
            logits = model(inputs)[targets > 0] @ model.item_vectors().T
            loss = torch.nn.functional.cross_entropy(logits, targets[targets > 0] - 1)
            optimiser.zero_grad(set_to_none=True)
            loss.backward()
            optimiser.step()
            report.steps += 1
            if report.steps % EVAL_STEPS == 0 or time.perf_counter() - start > settings.train_budget_s:
                check()
                if report.stopped:
                    break
        if report.epochs == settings.max_epochs and not report.stopped:
            check()
            report.stopped = report.stopped or f"max_epochs {settings.max_epochs}"
    model.load_state_dict(best_state)
    report.seconds = round(time.perf_counter() - start, 1)
    return model.eval().cpu(), report
