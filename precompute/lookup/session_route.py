"""`POST /v1/recs:forItems`: recommendations for an anonymous session from the item ids it sends,
merged from a related output's lists (stores/key_value/records.py merge_ranked) in one round trip to Redis."""

from __future__ import annotations

import numpy as np
from pydantic import Field
from starlette.requests import Request
from starlette.responses import Response

from precompute.lookup.errors import error, validated_body
from precompute.lookup.keys import Id, KeyOutput, LabelsBatchGet, check_id
from precompute.lookup.openapi import batch_operation
from precompute.lookup.served import Endpoint, Handler
from precompute.stores.key_value.records import RANKED, merge_ranked


class ForItems(LabelsBatchGet):
    ids: list[Id] = Field(min_length=1)
    """The session's item ids, oldest first: the latest weighs most."""
    k: int | None = Field(None, ge=1)
    """At most this many items; by default as many as a related list holds."""


class SessionOutput:
    """A related output as the service answers it: its lists by item (KeyOutput), and sessions."""

    def __init__(self, keyed: KeyOutput, seen: str) -> None:
        self.keyed = keyed
        self.store = keyed.store
        self.seen = seen
        """The output's `seen`; with auto, the published version's choice (its meta) decides."""

    def endpoints(self, base: str) -> list[Endpoint]:
        session = "/v1/recs" + base.removeprefix("/v1/related") + ":forItems"
        operation = batch_operation(
            "Recommendations for a session's items (oldest first), merged from their related lists",
            ForItems,
            "items; missing: the session's ids with no list",
        )
        return [*self.keyed.endpoints(base), Endpoint(session, "POST", self.for_items(), session, operation)]

    def for_items(self) -> Handler:
        keys, name = self.keyed.keys, self.keyed.name
        settings, output = keys.settings, keys.outputs[name]

        async def for_items(request: Request) -> Response:
            req = await validated_body(request, ForItems, settings)
            if len(req.ids) > settings.max_batch_ids:
                return error(422, f"at most {settings.max_batch_ids} ids per call", field="ids")
            for i, item_id in enumerate(req.ids):
                check_id(item_id, f"ids.{i}", settings.max_id_chars)
            k = output.max_k if req.k is None else req.k
            if k > output.max_k:
                return error(422, f"k must be at most {output.max_k}: the most a related list holds", field="k")
            version, vocabulary, values = await keys.read(output, req.ids)
            allowed = self.seen == "include" or (self.seen == "auto" and vocabulary.session_items)
            exclude = None if allowed else vocabulary.positions(req.ids)
            indices, scores = merge_ranked(values, k, exclude)
            pairs = np.empty(len(indices), RANKED)
            pairs["index"], pairs["score"] = indices, scores
            missing = [vocabulary.id_json(i) for i, value in zip(req.ids, values, strict=True) if value is None]
            return Response(
                f'{{"version":"{version}","items":{vocabulary.render(pairs.tobytes(), None)},'
                f'"missing":[{",".join(missing)}]}}',
                media_type="application/json",
            )

        for_items.__doc__ = "Recommendations for a session's items, merged from their related lists."
        return for_items

    async def open(self) -> None:
        await self.keyed.open()

    async def version(self) -> str | None:
        return await self.keyed.version()

    def engine(self, version: str) -> str | None:
        return None

    async def close(self) -> None:
        await self.keyed.close()
