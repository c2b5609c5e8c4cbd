"""`POST /v1/recs:forItems`: recommendations for an anonymous session from the item ids it sends,
merged from a related output's lists (stores/key_value/records.py merge_ranked) in one round
trip to Redis."""

from __future__ import annotations

import numpy as np
from starlette.requests import Request
from starlette.responses import Response

from precompute.lookup.keys import KeyLookups, KeyOutput, RecsBatchGet
from precompute.lookup.openapi import batch_operation
from precompute.lookup.served import Endpoint, Handler
from precompute.stores.key_value.records import RANKED, merge_ranked


class ForItems(RecsBatchGet):
    """A session's item ids, oldest first (the latest weighs most), and at most `k` items back
    (by default as many as a related list holds)."""


class SessionOutput(KeyOutput):
    """A related output as the service answers it: its lists by item (KeyOutput), and sessions."""

    def __init__(self, keys: KeyLookups, name: str, seen: str) -> None:
        super().__init__(keys, name)
        self.seen = seen
        """The output's `seen`; with auto, the published version's choice (its meta) decides."""

    def endpoints(self, base: str) -> list[Endpoint]:
        session = "/v1/recs" + base.removeprefix("/v1/related") + ":forItems"
        operation = batch_operation(
            "Recommendations for a session's items (oldest first), merged from their related lists",
            ForItems,
            "items; missing: the session's ids with no list",
        )
        return [*super().endpoints(base), Endpoint(session, "POST", self.for_items(), session, operation)]

    def for_items(self) -> Handler:
        keys, output = self.keys, self.keys.outputs[self.name]

        async def for_items(request: Request) -> Response:
            req, k = await keys.batch_body(request, output, ForItems)
            version, vocabulary, values = await keys.read(output, req.ids)
            allowed = self.seen == "include" or (self.seen == "auto" and vocabulary.session_items)
            exclude = None if allowed else vocabulary.positions(req.ids)
            indices, scores = merge_ranked(values, output.max_k if k is None else k, exclude)
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
