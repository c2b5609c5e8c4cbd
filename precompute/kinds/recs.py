"""Recommendations: each user's top k items, from a model trained on the night's interactions.

    compute:  (after its items' embeddings published) recommend (jobs/recs/recommend.py: only the
              users whose inputs moved when the published version allows) into a new Redis version
    validate: held-out quality beside the baselines (jobs/recs/quality.py), published only above
              most-popular's; the record count and sample values read back
    serve:    GET /v1/recs/<output>/{id}?k=, POST /v1/recs/<output>:batchGet (and /v1/recs/...)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import Field, model_validator

from precompute.jobs import work_dir
from precompute.jobs.inputs import InteractionsInput
from precompute.jobs.recs.spec import RecsSpec
from precompute.kinds import Output, OutputSpec, QualityError, RunContext, Target
from precompute.kinds.keyed import KeyedKind, VersionVocabulary, published_run, store_line, writer
from precompute.kinds.report import UNREPORTED, Computed
from precompute.lookup.keys import RECS
from precompute.models.datasets import InputError, arrow_dataset, integer_column
from precompute.models.errors import ModelError
from precompute.models.towers import Signature, TowersSpec, column_problem, same_dim
from precompute.settings import Machine
from precompute.stores.key_value.versions import OutputVersions

if TYPE_CHECKING:  # the job imports Ray: the night's, not the service's
    from precompute.jobs.recs.quality import Measured, RecsQuality


class RecsOutputSpec(OutputSpec, RecsSpec):
    kind: Literal["recs"]
    input: InteractionsInput
    items: str | None = None
    """The embeddings output whose vectors are the item tower (recommended from this run's
    version): item texts, for the content part of the blend and for items nobody interacted with
    yet. Without it, the items are the interactions' item ids alone, and the models collaborative."""
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
        if self.model == "content" and self.items is None:
            raise ValueError('model = "content" ranks by item texts: it needs `items`, an embeddings output')
        return self

    def recs(self) -> RecsSpec:
        """What the job computes, without where its inputs are and how it is published (no
        content part without item texts)."""
        spec = RecsSpec.model_validate(self.model_dump(include=set(RecsSpec.model_fields)))
        return spec if self.items is not None else spec.model_copy(update={"content_weight": 0.0})


@dataclass(kw_only=True)
class RecsComputed(Computed):
    """What the recs job did (jobs/recs/recommend.py RecsJobReport), as the run report shows it."""

    users: int
    rescored: int
    copied: int
    """Users whose record the store copies from the published version instead."""
    mode: str
    mode_reason: str
    k: int
    users_per_s: float
    quality: RecsQuality = field(metadata=UNREPORTED)
    """The published model's held-out quality beside the baselines': the check reads it, and the
    report shows it as the check's result (`validation`)."""
    towers: dict[str, object] | None = None
    sequence: dict[str, object] | None = None
    ranking: dict[str, object] | None = None
    als: str | None = None
    grouping: str | None = None


class Recs(KeyedKind[RecsComputed]):
    name = "recs"
    spec = RecsOutputSpec
    route = "recs"
    format = RECS

    def needs(self, output: Output) -> list[str]:
        return [] if output.spec.items is None else [output.spec.items]

    def check(self, output: Output) -> None:
        spec: RecsOutputSpec = output.spec
        if spec.items is not None:
            items = output.other(spec.items)
            if items is None:
                raise output.error("items", f"no output named {spec.items!r}")
            if items.spec.kind != "embeddings":
                raise output.error("items", f"output {spec.items!r} is not of kind embeddings")
        check_interactions(output, spec.input)
        if spec.towers is not None:
            check_towers(output, spec.towers)

    def plan(self, output: Output, machine: Machine) -> list[str]:
        spec: RecsOutputSpec = output.spec
        source = spec.input
        return [
            f"  input   {source.path} (user={source.user}, item={source.item}, weight={source.weight}, time={source.time}, basket={source.basket})",
            f"  items   the vectors of output {spec.items!r}; top {spec.k} per user"
            if spec.items is not None
            else f"  items   the interactions' item ids (no item texts: no content part); top {spec.k} per user",
            store_line(output, machine),
        ]

    def compute(self, run: RunContext, output: Output, target: Target[OutputVersions]) -> RecsComputed:
        """Recommend from the published embeddings into the new version, rescoring only the users
        whose inputs moved since the published one (jobs/recs/state.py)."""
        from precompute.jobs.ray_session import ray_session
        from precompute.jobs.recs.item_table import interaction_items, sorted_items
        from precompute.jobs.recs.own_towers import own_towers
        from precompute.jobs.recs.recommend import run_recs_job
        from precompute.jobs.text.embed import STAGED

        spec: RecsOutputSpec = output.spec
        machine = run.machine
        if spec.items is None:
            items, items_model = interaction_items(spec.input), ""
            integer_items = integer_column(spec.input, spec.input.item)
        else:
            items_output = output.other(spec.items)
            assert items_output is not None and items_output.source is not None  # check and needs saw to it
            items_version = run.published(spec.items).version
            embeddings = run.run_dir(spec.items, items_version) / STAGED
            items = sorted_items(embeddings, items_version, work_dir.cache_dir(run.work_dir, spec.items))
            items_model, corpus = items_output.source.hash, items_output.spec.input
            integer_items = integer_column(corpus, corpus.id)
        vocabulary = VersionVocabulary(
            items.ids, items.vocabulary, integer_column(spec.input, spec.input.user), integer_items
        )
        version = writer(target, vocabulary)
        own = None
        if spec.towers is not None:  # Ray stays up for the job (the night's ray_stopped_last)
            with ray_session(machine.job.ray_address):
                own = own_towers(spec.towers, items.ids, target.folder, machine.engine)
        recs = run_recs_job(  # an unchanged night starts no Ray
            spec.input,
            spec.recs(),
            machine.job,
            items,
            version.sink(),
            target.folder,
            version.create,
            items_model=items_model,
            previous=published_run(run, output, target),
            own=own,
            output=output.name,
            engine=machine.engine,
        )
        return RecsComputed(
            rows=recs.rows,
            rejects=recs.rejects,
            rejects_path=recs.rejects_path,
            reused=recs.copied,
            computed=recs.rescored,
            seconds=recs.seconds,
            rates={"top-k": recs.users_per_s},
            rate_unit="users/s",
            samples=recs.samples,
            users=recs.users,
            rescored=recs.rescored,
            copied=recs.copied,
            mode=recs.mode,
            mode_reason=recs.mode_reason,
            k=recs.k,
            users_per_s=recs.users_per_s,
            quality=recs.quality,
            towers=recs.towers,
            sequence=recs.sequence,
            ranking=recs.ranking,
            als=recs.als,
            grouping=recs.grouping,
        )

    def validate(
        self, run: RunContext, output: Output, target: Target[OutputVersions], computed: RecsComputed
    ) -> RecsQuality:
        """Published only if the model's held-out NDCG@10 beats most-popular's by `min_lift`, then
        the version's records checked like every key-value version's."""
        check_lift(computed.quality, output.spec.min_lift)
        super().validate(run, output, target, computed)
        return computed.quality

    def max_k(self, output: Output) -> int:
        return output.spec.k


def check_lift(quality: Measured, min_lift: float) -> None:
    """QualityError unless the held-out NDCG@10 is above `min_lift` x most-popular's."""
    from precompute.jobs.recs.quality import beats_most_popular

    if refusal := beats_most_popular(quality, min_lift):
        raise QualityError(refusal)


def check_interactions(output: Output, source: InteractionsInput) -> None:
    """The user and item columns, the basket one where named, and the weight and time ones where
    the data has them (or the file names them), each of a type the job reads."""
    columns = {"user": source.user, "item": source.item}
    optional = {"weight": source.weight, "time": source.time}
    columns |= {name: column for name, column in optional.items() if name in source.model_fields_set}
    if source.basket is not None:
        columns["basket"] = source.basket
    output.check_input(source, columns, optional)


def check_towers(output: Output, towers: TowersSpec) -> None:
    """Both graphs open and return one dim; each features file has the id column and a column of
    the right type for every input of its tower."""
    signatures = {}
    for tower in ("user", "item"):
        path = getattr(towers, tower)
        try:
            signatures[tower] = Signature(Path(path).read_bytes())
        except OSError as e:
            raise output.error(f"towers.{tower}", f"cannot read {path} ({e.strerror})") from None
        except ModelError as e:
            raise output.error(f"towers.{tower}", f"{path}: {e}") from None
    try:
        same_dim(signatures["user"], signatures["item"])
    except ModelError as e:
        raise output.error("towers", str(e)) from None
    for tower, features in (("user", towers.users), ("item", towers.items)):
        field = f"towers.{tower}s"
        try:
            schema = arrow_dataset(features).schema
        except InputError as e:
            raise output.error(f"{field}.path", str(e)) from None
        for column in [features.id, *(i.name for i in signatures[tower].inputs)]:
            if column not in schema.names:
                raise output.error(
                    field,
                    f"column {column!r} (the {tower} tower's input or id) is not in {features.path} "
                    f"(it has {', '.join(schema.names)})",
                )
        for input_ in signatures[tower].inputs:
            if problem := column_problem(schema.field(input_.name).type, input_):
                raise output.error(field, f"column {input_.name!r} of {features.path} {problem}")
