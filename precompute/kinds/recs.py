"""Recommendations: each user's top k items, from a model trained on the night's interactions.

    run:   (after its items' embeddings published) recommend (jobs/recs/recommend.py: only the users whose
           inputs moved when the published version allows) into a new Redis version -> held-out
           quality beside the baselines (jobs/recs/quality.py); published only above most-popular's
           -> collect old versions
    serve: GET /v1/recs/<output>/{id}?k=, POST /v1/recs/<output>:batchGet (and /v1/recs/...)
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, model_validator

from precompute.jobs.inputs import InteractionsInput
from precompute.jobs.recs.spec import RecsSpec
from precompute.kinds import OutputKind, OutputSpec, QualityError
from precompute.kinds.keyed import (
    VersionVocabulary,
    collect_garbage,
    key_value_versions,
    publish_new_version,
    published_run,
    store_line,
)
from precompute.models.datasets import InputError, arrow_dataset, integer_column
from precompute.models.errors import ModelError
from precompute.models.towers import Signature, TowersSpec, column_problem, same_dim

if TYPE_CHECKING:
    from precompute.flows.steps import RunContext
    from precompute.lookup.served import Served
    from precompute.pipeline import Pipeline
    from precompute.service.app import Service
    from precompute.settings import Machine
    from precompute.stores.versions import Versioned


class RecsOutputSpec(OutputSpec, RecsSpec):
    kind: Literal["recs"]
    input: InteractionsInput
    items: str
    """The embeddings output whose vectors are the item tower (recommended from this run's version)."""
    towers: TowersSpec | None = None
    """The user's own two-tower model (models/towers.py): two ONNX files and their features
    Parquets, e.g. { user = "user.onnx", item = "item.onnx", users = { path = "users.parquet",
    id = "user_id" }, items = { path = "items.parquet", id = "item_id" } }."""
    min_lift: float = Field(1.0, gt=0)
    """A version is published only if its held-out NDCG@10 is above this multiple of most-popular's
    on the same split (jobs/recs/quality.py)."""

    @model_validator(mode="after")
    def _towers_with_model(self) -> RecsOutputSpec:
        if (self.model == "towers") != (self.towers is not None):
            raise ValueError('model = "towers" and the towers table go together')
        return self

    def recs(self) -> RecsSpec:
        """What the job computes, without where its inputs are and how it is published."""
        return RecsSpec.model_validate(self.model_dump(include=set(RecsSpec.model_fields)))


class Recs(OutputKind):
    name = "recs"
    spec = RecsOutputSpec
    store_family = "redis"
    route = "recs"

    def needs(self, spec: RecsOutputSpec) -> list[str]:
        return [spec.items]

    def check(self, pipeline: Pipeline, name: str) -> None:
        output: RecsOutputSpec = pipeline.outputs[name]
        items = pipeline.outputs.get(output.items)
        if items is None:
            raise pipeline.error(name, "items", f"no output named {output.items!r}")
        if items.kind != "embeddings":
            raise pipeline.error(name, "items", f"output {output.items!r} is not of kind embeddings")
        columns = {"user": output.input.user, "item": output.input.item}
        optional = {"weight": output.input.weight, "time": output.input.time}
        given = output.input.model_fields_set
        columns |= {field: column for field, column in optional.items() if field in given}
        pipeline.check_input(name, output.input, columns, optional)
        if output.towers is not None:
            check_towers(pipeline, name, output.towers)

    def plan(self, pipeline: Pipeline, name: str, machine: Machine) -> list[str]:
        output: RecsOutputSpec = pipeline.outputs[name]
        spec = output.input
        return [
            f"  input   {spec.path} (user={spec.user}, item={spec.item}, weight={spec.weight}, time={spec.time})",
            f"  items   the vectors of output {output.items!r}; top {output.k} per user",
            store_line(pipeline, name, machine),
        ]

    def versions(self, pipeline: Pipeline, name: str, machine: Machine) -> AbstractContextManager[Versioned]:
        return key_value_versions(pipeline, name, machine)

    def run(self, run: RunContext, name: str) -> dict[str, Any]:
        from precompute.jobs import work_dir
        from precompute.jobs.ray_session import ray_session
        from precompute.jobs.recs.item_table import sorted_items
        from precompute.jobs.recs.own_towers import own_towers
        from precompute.jobs.recs.quality import beats_most_popular
        from precompute.jobs.recs.recommend import RecsJobReport, run_recs_job
        from precompute.jobs.text.embed import STAGED
        from precompute.stores.key_value.versions import NewVersion

        output: RecsOutputSpec = run.pipeline.outputs[name]
        items_version = run.published(output.items)["version"]
        machine, spec = run.machine, output.recs()
        embeddings = work_dir.run_dir(run.work_dir, output.items, items_version) / STAGED
        items_model = run.pipeline.sources[output.items].hash

        def recommend() -> tuple[RecsJobReport, str]:
            """Recommend from the published embeddings into a new version, rescoring only the users
            whose inputs moved since the published one (jobs/recs/state.py); publish it only if the
            model's held-out NDCG@10 beats most-popular's by `min_lift`."""
            items = sorted_items(embeddings, items_version, work_dir.cache_dir(run.work_dir, output.items))

            def job(new: NewVersion, folder: work_dir.WorkPath) -> RecsJobReport:
                """The job first: bad interactions fail on their reject ratio, with reasons, not as poor quality."""
                previous = published_run(run, name, new)
                own = None
                if output.towers is not None:  # Ray stays up for the job (publish_new_version)
                    with ray_session(machine.job.ray_address):
                        own = own_towers(output.towers, items.ids, folder, machine.engine)
                report = run_recs_job(  # an unchanged night starts no Ray
                    output.input,
                    spec,
                    machine.job,
                    items,
                    new.sink(),
                    folder,
                    new.create,
                    items_model=items_model,
                    previous=previous,
                    own=own,
                    output=name,
                    engine=machine.engine,
                )
                if refusal := beats_most_popular(report.quality, output.min_lift):
                    raise QualityError(refusal)
                return report

            corpus = run.pipeline.outputs[output.items].input
            vocabulary = VersionVocabulary(
                items.ids, items.vocabulary, integer_column(output.input, output.input.user), integer_column(corpus, corpus.id)
            )
            return publish_new_version(run, name, vocabulary, job)

        recs, version = run.step("recommend", recommend)
        deleted = run.step("collect_garbage", lambda: collect_garbage(run, name))
        return {
            "kind": self.name,
            "version": version,
            "published": True,
            "rows": recs.rows,
            "rejects": recs.rejects,
            "rejects_path": recs.rejects_path,
            "users": recs.users,
            "rescored": recs.rescored,
            "copied": recs.copied,
            "reused": recs.copied,
            "computed": recs.rescored,
            "mode": recs.mode,
            "mode_reason": recs.mode_reason,
            "k": recs.k,
            "seconds": recs.seconds,
            "users_per_s": recs.users_per_s,
            "rates": {"top-k": recs.users_per_s},
            "rate_unit": "users/s",
            **({"towers": recs.towers} if recs.towers is not None else {}),
            **({"sequence": recs.sequence} if recs.sequence is not None else {}),
            **({"ranking": recs.ranking} if recs.ranking is not None else {}),
            **({"als": recs.als} if recs.als is not None else {}),
            **({"grouping": recs.grouping} if recs.grouping is not None else {}),
            "validation": asdict(recs.quality),
            "deleted_versions": deleted,
        }

    def serve(self, service: Service, name: str) -> Served:
        from precompute.lookup.keys import RECS

        output: RecsOutputSpec = service.pipeline.outputs[name]
        return service.keys.serve(name, service.pipeline.store(name), RECS, max_k=output.k)


def check_towers(pipeline: Pipeline, name: str, towers: TowersSpec) -> None:
    """Both graphs open and return one dim; each features file has the id column and a column of
    the right type for every input of its tower."""
    signatures = {}
    for tower in ("user", "item"):
        path = getattr(towers, tower)
        try:
            signatures[tower] = Signature(Path(path).read_bytes())
        except OSError as e:
            raise pipeline.error(name, f"towers.{tower}", f"cannot read {path} ({e.strerror})") from None
        except ModelError as e:
            raise pipeline.error(name, f"towers.{tower}", f"{path}: {e}") from None
    try:
        same_dim(signatures["user"], signatures["item"])
    except ModelError as e:
        raise pipeline.error(name, "towers", str(e)) from None
    for tower, features in (("user", towers.users), ("item", towers.items)):
        field = f"towers.{tower}s"
        try:
            schema = arrow_dataset(features).schema
        except InputError as e:
            raise pipeline.error(name, f"{field}.path", str(e)) from None
        for column in [features.id, *(i.name for i in signatures[tower].inputs)]:
            if column not in schema.names:
                raise pipeline.error(
                    name,
                    field,
                    f"column {column!r} (the {tower} tower's input or id) is not in {features.path} "
                    f"(it has {', '.join(schema.names)})",
                )
        for input_ in signatures[tower].inputs:
            if problem := column_problem(schema.field(input_.name).type, input_):
                raise pipeline.error(name, field, f"column {input_.name!r} of {features.path} {problem}")
