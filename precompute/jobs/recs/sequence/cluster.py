"""The sequence model trained on the job's Ray cluster: Ray Train's TorchTrainer, data-parallel.

`train_workers` workers each run jobs/recs/sequence/train.py as one rank of a torch.distributed group
(gloo on CPUs, NCCL on GPUs): each takes its share of every step's users and DDP averages the
gradients. On CPUs the workers spread one a node, so each brings its node's cores; on GPUs they
take one GPU each, packed, so NCCL stays within a node where it can. Rank 0 hands the best weights
and its report back through a Ray queue: nothing is checkpointed, so no storage shared by the
nodes is needed (a night that fails trains again from the last night's weights).
"""

from __future__ import annotations

from typing import Any
from uuid import uuid4

import numpy as np
import torch

from precompute.jobs.recs.sequence.train import Group, TrainReport, WarmStart, new_model, train_sequence
from precompute.jobs.recs.spec import SequenceSpec
from precompute.models.sequence import SASRec

RESULT_TIMEOUT_S = 300
"""How long the driver waits for rank 0's weights once the trainer has finished."""


def train_on_cluster(
    items: np.ndarray, offsets: np.ndarray, catalogue: int, settings: SequenceSpec, warm: WarmStart | None
) -> tuple[SASRec, TrainReport]:
    """train_sequence on `settings.train_workers` Ray Train workers of the connected cluster."""
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer
    from ray.util.queue import Queue

    resources = ray.cluster_resources()
    gpus = resources.get("GPU", 0) > 0
    unit = "GPU" if gpus else "CPU"
    if resources.get(unit, 0) < settings.train_workers:  # Ray Train would wait for them for ever
        raise ValueError(
            f"sequence.train_workers = {settings.train_workers} needs a {unit} a worker; "
            f"the Ray cluster has {resources.get(unit, 0):g}"
        )
    result = Queue(maxsize=1, actor_options={"num_cpus": 0})
    try:
        trainer = TorchTrainer(
            _worker,
            train_loop_config={
                "items": items,
                "offsets": offsets,
                "catalogue": catalogue,
                "settings": settings,
                "warm": warm,
                "result": result,
            },
            scaling_config=ScalingConfig(
                num_workers=settings.train_workers,
                use_gpu=gpus,
                placement_strategy="PACK" if gpus else "SPREAD",
            ),
            run_config=RunConfig(name=f"sequence-{uuid4().hex[:12]}"),
        )
        trainer.fit()
        state, report = result.get(timeout=RESULT_TIMEOUT_S)
    finally:
        result.shutdown()
    model = new_model(catalogue, settings)
    model.load_state_dict(state)
    return model.eval(), report


def _worker(config: dict[str, Any]) -> None:
    """One rank: train, then rank 0 puts the weights and the report, with the nodes every rank ran
    on, into the driver's queue."""
    import ray
    import ray.train
    import ray.train.torch

    context = ray.train.get_context()
    group = Group(context.get_world_rank(), context.get_world_size())
    model, report = train_sequence(
        np.array(config["items"]),  # writable copies: the object store's arrays are read-only
        np.array(config["offsets"]),
        config["catalogue"],
        config["settings"],
        warm=config["warm"],
        device=str(ray.train.torch.get_device()),
        group=group,
    )
    nodes: list[str | None] = [None] * group.size
    torch.distributed.all_gather_object(nodes, ray.get_runtime_context().get_node_id())
    if group.rank == 0:
        report.workers, report.nodes = group.size, len(set(nodes))
        config["result"].put((model.state_dict(), report))
