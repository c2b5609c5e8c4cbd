"""`precompute check`: what a run of the pipeline file will read, build and write, before it runs."""

from __future__ import annotations

from precompute.pipeline import Pipeline
from precompute.settings import Machine


def plan(pipeline: Pipeline, machine: Machine) -> str:
    """One block per output, in the order the flow runs them, each as its kind describes it."""
    lines = [f"pipeline {pipeline.path}: {len(pipeline.outputs)} outputs, schedule '{pipeline.flow.cron}'"]
    for name in pipeline.run_order():
        output = pipeline.declared[name]
        kind = output.kind
        default = ", default route" if pipeline.default(kind.name) == name else ""
        needs = kind.needs(output)
        lines.append(f"\n{name} ({kind.name}{default}{', after ' + ', '.join(needs) if needs else ''})")
        lines += kind.plan(output, machine)
    return "\n".join(lines)
