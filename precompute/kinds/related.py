"""Related items: each item's top k items ("customers who bought this also bought"), and the
recommendations of an anonymous session merged from them.

    compute:  the item table from the interactions' item ids, each item's list from the model that
              ranks held-out sessions best (jobs/recs/related.py) into a new Redis version
    validate: published only above most-popular's held-out NDCG; the record count and sample
              values read back
    serve:    GET /v1/related/<output>/{id}, POST /v1/related/<output>:batchGet (and
              /v1/related/...); POST /v1/recs/<output>:forItems (and /v1/recs:forItems): a
              session's items in, its recommendations out, merged from their lists
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from precompute.jobs.inputs import InteractionsInput
from precompute.jobs.recs.spec import RelatedSpec
from precompute.kinds import Output, OutputSpec, RunContext, Target
from precompute.kinds.keyed import KeyedKind, VersionVocabulary, store_line
from precompute.kinds.recs import check_interactions, check_lift
from precompute.kinds.report import UNREPORTED, Computed
from precompute.lookup.keys import RELATED
from precompute.lookup.served import Served
from precompute.lookup.serving import Serving
from precompute.lookup.session_route import SessionOutput
from precompute.models.datasets import integer_column
from precompute.settings import Machine
from precompute.stores.key_value.versions import OutputVersions

if TYPE_CHECKING:  # the job imports Ray: the night's, not the service's
    from precompute.jobs.recs.related import RelatedQuality


class RelatedOutputSpec(OutputSpec, RelatedSpec):
    kind: Literal["related"]
    input: InteractionsInput
    min_lift: float = Field(1.0, gt=0)
    """A version is published only if its held-out NDCG@10 is above this multiple of most-popular's."""


@dataclass(kw_only=True)
class RelatedComputed(Computed):
    items: int
    quality: RelatedQuality = field(metadata=UNREPORTED)
    """The check reads it; the report shows it as the check's result (`validation`)."""


class Related(KeyedKind[RelatedComputed]):
    name = "related"
    spec = RelatedOutputSpec
    route = "related"
    format = RELATED

    def check(self, output: Output) -> None:
        check_interactions(output, output.spec.input)

    def plan(self, output: Output, machine: Machine) -> list[str]:
        spec: RelatedOutputSpec = output.spec
        source = spec.input
        return [
            f"  input   {source.path} (user={source.user}, item={source.item}, time={source.time}, basket={source.basket})",
            f"  items   the interactions' item ids; top {spec.k} related items each (model {spec.model})",
            store_line(output, machine),
        ]

    def compute(self, run: RunContext, output: Output, target: Target[OutputVersions]) -> RelatedComputed:
        from precompute.jobs.recs.item_table import interaction_items
        from precompute.jobs.recs.related import run_related_job

        spec: RelatedOutputSpec = output.spec
        items = interaction_items(spec.input)
        integer_items = integer_column(spec.input, spec.input.item)
        vocabulary = VersionVocabulary(items.ids, items.vocabulary, integer_items, integer_items)
        allowed: list[bool] = []  # the night's choice, known once trained: the version's meta says it

        def meta() -> dict[str, Any]:
            return vocabulary.meta() | {"session_items": allowed[0]}

        version = target.store.writer(target.version, meta)

        def create(records: int, session_items: bool) -> None:
            allowed.append(session_items)
            version.create(records)

        related = run_related_job(
            spec.input,
            RelatedSpec.model_validate(spec.model_dump(include=set(RelatedSpec.model_fields))),
            run.machine.job,
            items,
            version.sink(),
            target.folder,
            create,
            output=output.name,
        )
        return RelatedComputed(
            rows=related.rows,
            rejects=related.rejects,
            rejects_path=related.rejects_path,
            computed=related.items,
            seconds=related.seconds,
            samples=related.samples,
            items=related.items,
            quality=related.quality,
        )

    def validate(
        self, run: RunContext, output: Output, target: Target[OutputVersions], computed: RelatedComputed
    ) -> RelatedQuality:
        """Published only if the merged lists' held-out NDCG@10 beats most-popular's by `min_lift`,
        then the version's records checked like every key-value version's."""
        check_lift(computed.quality, output.spec.min_lift)
        super().validate(run, output, target, computed)
        return computed.quality

    def max_k(self, output: Output) -> int:
        return output.spec.k

    def serve(self, serving: Serving, output: Output, machine: Machine) -> Served:
        serving.keys.serve(output.name, output.store, self.format, max_k=self.max_k(output))
        return SessionOutput(serving.keys, output.name, output.spec.seen)
