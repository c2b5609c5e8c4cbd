"""The sequence model's training on a GPU against the same training on the same machine's CPU
cores, in one process (`bench/gpu_check.sh`): seconds per epoch and the ratio.

Histories shaped like MovieLens-1M (6,040 users, 3,706 items, about a million interactions),
drawn as walks with a learnable habit (each next item a few steps on from the last), so the
validation checks rank something; speed does not depend on what the model learns.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import numpy as np
import torch

from precompute.jobs.recs.sequence.train import train_sequence
from precompute.jobs.recs.spec import SequenceSpec
from precompute.models.hardware import device_fingerprint

USERS, ITEMS, MEAN_LENGTH = 6040, 3706, 165


def walks(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(items, offsets): CSR histories in time order."""
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.geometric(1 / MEAN_LENGTH, USERS), 20, 2000)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    steps = rng.choice([1, 2, 3, 7], size=offsets[-1], p=[0.5, 0.25, 0.15, 0.1])
    starts = rng.integers(0, ITEMS, USERS)
    items = np.empty(offsets[-1], np.int64)
    for user in range(USERS):
        lo, hi = offsets[user], offsets[user + 1]
        items[lo:hi] = (starts[user] + np.cumsum(steps[lo:hi])) % ITEMS
    return items, offsets


def main(epochs: int = 2) -> dict[str, Any]:
    items, offsets = walks()
    settings = SequenceSpec(max_epochs=epochs, patience=epochs * 100, train_budget_s=3600)
    result: dict[str, Any] = {"bench": "sequence-train", "users": USERS, "items": ITEMS, "interactions": len(items)}
    for device in ("cuda", "cpu"):
        _, report = train_sequence(items, offsets, ITEMS, settings, device=device)
        result[device] = {
            "machine": device_fingerprint(device),
            "epochs": report.epochs,
            "steps": report.steps,
            "seconds": report.seconds,
            "best_ndcg10": report.best_ndcg10,
            "torch_threads": torch.get_num_threads(),
        }
        print(device, result[device], flush=True)
    cuda, cpu = result["cuda"], result["cpu"]
    result["ratio"] = round(cpu["seconds"] / cuda["seconds"], 2)
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 2)
