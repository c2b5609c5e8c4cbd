"""Key lookups from Redis: `GET /v1/labels/{id}`, `GET /v1/recs/{id}?k=`, `GET /v1/related/{id}?k=`
and their `:batchGet`.

Each answer is one round trip (KeyValueReader pipelines the reads with the version
pointer, so a batch comes from one version) and some string joins: a version's
vocabulary is JSON-escaped once, the first time the version is read, and a value is
decoded with numpy. GETs take no pydantic: their two inputs are checked in plain code.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated

import numpy as np
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field
from starlette.requests import Request
from starlette.responses import Response

from precompute.lookup.errors import Refused, error, unavailable, validated_body
from precompute.lookup.metrics import Metrics
from precompute.lookup.openapi import batch_operation, get_operation
from precompute.lookup.outages import StoreHealth
from precompute.lookup.served import Endpoint, Handler
from precompute.lookup.settings import ServiceSettings
from precompute.stores.errors import StoreUnavailableError, VersionNotFoundError
from precompute.stores.key_value.reader import KeyValueReader
from precompute.stores.key_value.records import RANKED
from precompute.stores.key_value.settings import RedisSettings

VOCABULARIES_PER_OUTPUT = 2
"""The published version's vocabulary and the one before a switch (each cached by the version
and the version whose meta it reads: two keys)."""
NOTHING_PUBLISHED_RETRY_S = "5"
INTEGER = re.compile(r"-?(0|[1-9][0-9]*)")


def _digits(value: object) -> object:
    return str(value) if type(value) is int else value


Id = Annotated[str, BeforeValidator(_digits)]
"""An id as a string, or an integer (looked up as its digits: inputs with integer ids)."""


class LabelsBatchGet(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    ids: list[Id] = Field(min_length=1)


class RecsBatchGet(LabelsBatchGet):
    k: int | None = Field(None, ge=1)
    """At most this many items per user; by default all that were stored."""


@dataclass(frozen=True, slots=True)
class KeyFormat:
    """A key-value output as the API shows it: a format, bound to an output by KeyLookups.serve."""

    name: str
    """The output's key part in Redis (its store)."""
    list_key: str
    """Key of the ranked list in an answer."""
    entry: str
    """%-template of one entry of the list: the vocabulary entry (JSON) and the score."""
    batch_model: type[LabelsBatchGet]
    noun: str
    """What a record lists, for the API's summaries ("labels")."""
    subject: str
    """What a record's id names ("item")."""
    max_k: int = 0
    """The most entries a record holds (the pipeline file's `k` of a recs output): a larger `k` is refused."""

    @property
    def takes_k(self) -> bool:
        return "k" in self.batch_model.model_fields


LABELS = KeyFormat("labels", "labels", '{"label":%s,"score":%s}', LabelsBatchGet, "labels", "item")
RECS = KeyFormat("recs", "items", '{"id":%s,"score":%s}', RecsBatchGet, "recommended items", "user")
RELATED = KeyFormat("related", "items", '{"id":%s,"score":%s}', RecsBatchGet, "related items", "item")


class Vocabulary:
    """One version's vocabulary (label names, item ids), JSON-escaped once for all its answers,
    and how its ids are answered: as JSON numbers where the input's were integers (meta's
    integer_vocabulary, integer_ids), so `GET /v1/recs/42` lists items as the user wrote them."""

    def __init__(self, meta: dict, template: str) -> None:
        entries: Sequence[str] = meta["vocabulary"]
        self.entries = entries
        self.quoted = [str(int(e)) for e in entries] if meta.get("integer_vocabulary") else list(map(json.dumps, entries))
        self.integer_ids = bool(meta.get("integer_ids"))
        self.template = template
        self.session_items = bool(meta.get("session_items"))
        """A related output's: a session's own items may be answered (lookup/session_route.py)."""
        self._positions: dict[str, int] | None = None

    def positions(self, ids: Sequence[str]) -> np.ndarray:
        """The entries' positions of those of `ids` that are entries (a map made on first use)."""
        if self._positions is None:
            self._positions = {entry: at for at, entry in enumerate(self.entries)}
        found = [self._positions.get(item_id) for item_id in ids]
        return np.array([at for at in found if at is not None], np.int64)

    def id_json(self, item_id: str) -> str:
        """A requested id as JSON: a number where the ids were integers and it is one."""
        return item_id if self.integer_ids and INTEGER.fullmatch(item_id) else json.dumps(item_id)

    def render(self, value: bytes, k: int | None) -> str:
        """A stored value as a JSON array of entries, best first, the first `k` (None: all).

        Scores print as the shortest decimal that reads back as the stored float16 (0.9, not 0.8999).
        """
        pairs = np.frombuffer(value, RANKED)[:k]
        quoted, template = self.quoted, self.template
        entries = [
            template % (quoted[i], score)
            for i, score in zip(pairs["index"].tolist(), pairs["score"].astype(str).tolist(), strict=True)
        ]
        return f"[{','.join(entries)}]"


def check_id(item_id: str, field: str, max_chars: int) -> None:
    if not item_id or len(item_id) > max_chars:
        raise Refused(error(422, f"an id must have 1 to {max_chars} characters", field=field))


def parse_k(raw: str, max_k: int) -> int:
    k = int(raw) if raw.isascii() and raw.isdigit() and len(raw) < 10 else 0
    if not 1 <= k <= max_k:
        raise Refused(error(422, f"k must be an integer from 1 to {max_k}, got {raw!r}", field="k"))
    return k


class KeyLookups:
    """The key-lookup handlers of every output served from Redis, sharing one reader (opened in
    the service's lifespan: it binds to the event loop) and its health."""

    def __init__(self, settings: ServiceSettings, redis: RedisSettings, metrics: Metrics) -> None:
        self.settings = settings
        self.redis = redis
        self.metrics = metrics
        self.outputs: dict[str, KeyFormat] = {}
        """The outputs served, by name."""
        self.reader: KeyValueReader | None = None
        self.health = StoreHealth("redis")
        self._vocabularies: dict[tuple[str, str], Vocabulary] = {}

    def serve(self, name: str, store: str, format: KeyFormat, max_k: int = 0) -> KeyOutput:
        """Serve output `name`, stored under `store`, in `format`; `max_k`: the most entries its records hold."""
        self.outputs[name] = dataclasses.replace(format, name=store, max_k=min(self.settings.max_k, max_k))
        return KeyOutput(self, name)

    def open(self) -> None:
        if self.reader is None:
            self.reader = KeyValueReader(self.redis)

    async def close(self) -> None:
        if self.reader is not None:
            reader, self.reader = self.reader, None
            await reader.aclose()

    def get(self, name: str) -> Handler:
        settings, output = self.settings, self.outputs[name]
        params = {"k"} if output.takes_k else set()

        async def get(request: Request) -> Response:
            item_id = request.path_params["id"]
            check_id(item_id, "id", settings.max_id_chars)
            k = None
            if request.scope["query_string"]:
                query = request.query_params
                for name in query:
                    if name not in params:
                        raise Refused(error(422, f"unknown query parameter {name!r}", field=name))
                if "k" in query:
                    k = parse_k(query["k"], output.max_k)
            version, vocabulary, (value,) = await self.read(output, [item_id])
            if value is None:
                return error(
                    404,
                    f"no {output.name} for id {item_id!r} in version {version}",
                    id=item_id,
                    version=version,
                )
            return Response(
                f'{{"version":"{version}","id":{vocabulary.id_json(item_id)},'
                f'"{output.list_key}":{vocabulary.render(value, k)}}}',
                media_type="application/json",
            )

        get.__doc__ = f"The {output.name} of one id, best first, from the published version."
        return get

    def batch_get(self, name: str) -> Handler:
        output = self.outputs[name]

        async def batch_get(request: Request) -> Response:
            req, k = await self.batch_body(request, output, output.batch_model)
            version, vocabulary, values = await self.read(output, req.ids)
            results, missing = [], []
            for item_id, value in zip(req.ids, values, strict=True):
                if value is None:
                    missing.append(vocabulary.id_json(item_id))
                else:
                    results.append(
                        f'{{"id":{vocabulary.id_json(item_id)},"{output.list_key}":{vocabulary.render(value, k)}}}'
                    )
            return Response(
                f'{{"version":"{version}","results":[{",".join(results)}],"missing":[{",".join(missing)}]}}',
                media_type="application/json",
            )

        batch_get.__doc__ = (
            f"The {output.name} of many ids, all from one published version; unknown ids listed."
        )
        return batch_get

    async def batch_body(
        self, request: Request, output: KeyFormat, model: type[LabelsBatchGet]
    ) -> tuple[LabelsBatchGet, int | None]:
        """A batch call's body as `model`, its ids and its k (None where it has none) checked;
        Refused with a 422 naming the first field that is wrong."""
        settings = self.settings
        req = await validated_body(request, model, settings)
        if len(req.ids) > settings.max_batch_ids:
            raise Refused(error(422, f"at most {settings.max_batch_ids} ids per call", field="ids"))
        for i, item_id in enumerate(req.ids):
            check_id(item_id, f"ids.{i}", settings.max_id_chars)
        k = getattr(req, "k", None)
        if k is not None and k > output.max_k:
            raise Refused(error(422, f"k must be at most {output.max_k}: the most a record holds", field="k"))
        return req, k

    async def read(self, output: KeyFormat, ids: list[str]) -> tuple[str, Vocabulary, list[bytes | None]]:
        """(published version, its vocabulary, values); Refused with a 503 while nothing can be read."""
        reader = self.open_reader()
        try:
            version, values = await reader.get_many(output.name, ids)
            vocabulary = await self.vocabulary(reader, output, version)
        except VersionNotFoundError:
            self.health.ok()
            raise Refused(
                error(
                    503,
                    f"no version of {output.name} is published yet",
                    headers={"Retry-After": NOTHING_PUBLISHED_RETRY_S},
                )
            ) from None
        except StoreUnavailableError as e:
            self.metrics.store_errors.labels(output.name).inc()
            self.health.failed(e)
            raise Refused(unavailable("key-value store", e)) from None
        self.health.ok()
        return version, vocabulary, values

    def open_reader(self) -> KeyValueReader:
        if self.reader is None:
            raise Refused(error(503, "warming up", headers={"Retry-After": "1"}))
        return self.reader

    async def vocabulary(self, reader: KeyValueReader, output: KeyFormat, version: str) -> Vocabulary:
        """The version's Vocabulary, made once for the version whose meta it reads: an overlay
        that shares its base's (stores/key_value/meta.py) gets the base's, not a second copy."""
        vocabulary = self._vocabularies.get((output.name, version))
        if vocabulary is None:
            owner = await reader.meta_owner(output.name, version)
            vocabulary = self._vocabularies.get((output.name, owner))
            if vocabulary is None:
                vocabulary = Vocabulary(await reader.meta(output.name, version), output.entry)
            self._vocabularies.pop((output.name, owner), None)  # newest again: evicted last
            self._vocabularies[output.name, owner] = self._vocabularies[output.name, version] = vocabulary
            while len(self._vocabularies) > 2 * VOCABULARIES_PER_OUTPUT * len(self.outputs):
                del self._vocabularies[next(iter(self._vocabularies))]
        return vocabulary

    async def version(self, name: str) -> str | None:
        """An output's published version (None before its first publish), its vocabulary prepared.

        Raises StoreUnavailableError while Redis is down.
        """
        reader, output = self.open_reader(), self.outputs[name]
        try:
            version, _ = await reader.get_many(output.name, [])
        except VersionNotFoundError:
            self.health.ok()
            return None
        except StoreUnavailableError as e:
            self.health.failed(e)
            raise
        await self.vocabulary(reader, output, version)
        self.health.ok()
        return version


class KeyOutput:
    """One key-value output as the service answers it (lookup/served.py Served)."""

    store = "key-value store"

    def __init__(self, keys: KeyLookups, name: str) -> None:
        self.keys = keys
        self.name = name

    def endpoints(self, base: str) -> list[Endpoint]:
        output = self.keys.outputs[self.name]
        one, many = (
            f"The {output.noun} of one {output.subject}",
            f"The {output.noun} of many {output.subject}s",
        )
        single, batch = f"{base}/{{id}}", f"{base}:batchGet"
        return [
            # `:path`: an id may hold a '/' (sent as %2F); metrics label the route by its template.
            Endpoint(
                f"{base}/{{id:path}}",
                "GET",
                self.keys.get(self.name),
                single,
                get_operation(
                    f"{one}, best first, from the published version",
                    f"{output.subject} id",
                    output.list_key,
                    output.takes_k,
                ),
            ),
            Endpoint(
                batch,
                "POST",
                self.keys.batch_get(self.name),
                batch,
                batch_operation(
                    f"{many}, all from one published version", output.batch_model, output.list_key
                ),
            ),
        ]

    async def open(self) -> None:
        self.keys.open()

    async def version(self) -> str | None:
        return await self.keys.version(self.name)

    def engine(self, version: str) -> str | None:
        return None

    async def close(self) -> None:
        await self.keys.close()
