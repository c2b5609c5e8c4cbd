"""`precompute check`: what a run of the pipeline file will read, build and write, before it runs."""

from __future__ import annotations

from precompute.models.engine import precision_ladder, resolve_backend, resolve_device
from precompute.models.engine_cache import EngineCache
from precompute.stores.redis_settings import RedisSettings
from precompute.stores.vector_settings import VectorStoreSettings

from precompute.pipeline import Pipeline


def engine_line(pipeline: Pipeline, name: str) -> str:
    """The engine's ladder, and which of its precisions are already built in the cache."""
    settings = pipeline.engine_settings(name)
    device = resolve_device(settings)
    backend = resolve_backend(settings, device).name
    ladder = precision_ladder(settings, device, backend)
    built = {
        key["precision"]
        for key in EngineCache(settings.cache_dir).keys()
        if key.get("model") == settings.model.hash and key.get("backend") == backend and "precision" in key
    }
    state = ", ".join(f"{p} {'reused' if p in built else 'built on first run'}" for p in ladder)
    return f"{backend}/{device}, ladder {' > '.join(ladder)}: {state}"


def plan(pipeline: Pipeline) -> str:
    """One block per output, in the order the flow runs them."""
    vectors, redis = VectorStoreSettings(), RedisSettings()
    lines = [f"pipeline {pipeline.path}: {len(pipeline.outputs)} outputs, schedule '{pipeline.flow.cron}'"]
    for name, output in pipeline.outputs.items():
        defaults = [kind for kind in ("embeddings", "labels", "recs") if pipeline.default(kind) == name]
        lines.append(f"\n{name} ({output.kind}{', default route' if defaults else ''})")
        spec = output.input
        if output.kind == "recs":
            lines.append(f"  input   {spec.path} (user={spec.user}, item={spec.item}, weight={spec.weight})")
            lines.append(f"  items   the vectors of output {output.items!r}; top {output.k} per user")
        else:
            lines.append(f"  input   {spec.path} (id={spec.id}, text={spec.text}, label={spec.label})")
            source = pipeline.sources[name]
            what = (
                f"{source.dim}-d, {source.pooling} pooling{', normalised' if source.normalize else ''}"
                if source.task == "embed"
                else f"classifier, {source.dim} labels, {'sigmoid' if source.multi_label else 'softmax'}"
            )
            lines.append(
                f"  model   {source.folder} ({source.architecture}, {what}, "
                f"{source.max_seq_length} tokens, hash {source.hash})"
            )
            lines.append(f"  engine  {engine_line(pipeline, name)}")
            settings = pipeline.engine_settings(name)
            lines.append(
                f"  gate    {settings.gate_texts} held-out and {settings.calibration_texts} calibration "
                f"texts from {settings.reference.path}"
            )
        if output.kind == "embeddings":
            store = pipeline.vector_settings(name, vectors)
            where = f"qdrant {store.type} collection {store.name!r}"
        else:
            where = f"redis keys {redis.prefix}:{pipeline.store(name)}:<version>"
        lines.append(f"  store   {where}: a new version each run, {output.keep_versions} kept for rollback")
    return "\n".join(lines)
