"""The run report as a page: `reports/<run>.html` beside the JSON, one self-contained file (inline
CSS and SVG, no script, nothing fetched) that opens from disk, a Prefect link artifact, or a
mail attachment.

Per output: whether it published and which version, rows, rejects counted by reason (read from
the output's rejects file), rows reused and computed, where the night's time went (seconds per
step and per stage of the kind's compute, training and engine building included), rows/s per
stage, each precision gate's cosine distribution as a histogram, and the held-out checks:
recall@10 of an index, hit rate and NDCG of recommendations beside their baselines.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from jinja2 import Environment, StrictUndefined
from markupsafe import Markup, escape

from precompute.jobs.validate import REASON
from precompute.kinds.report import OutputReport, RunReport
from precompute.models.engines.gate import COSINE_BINS

TOP_REASONS = 10
GATE_FIELDS = {
    "reason": "",
    "recall_ratio": None,
    "recall": None,
    "recall_fp32": None,
    "mrr_ratio": None,
    "pairs": None,
    "overlap": None,
    "accuracy": None,
    "accuracy_fp32": None,
    "mean_cosine": None,
    "min_cosine": None,
    "agreement": None,
    "cosine_histogram": None,
    "note": "",
}
"""A gate's fields the page reads: an encoder's gate has recall and cosines, a label head's
accuracy and agreement, a classifier's agreement alone."""

TEMPLATE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Run {{ run }}</title>
<style>
body { font: 14px/1.45 system-ui, sans-serif; margin: 24px auto; max-width: 1100px; color: #1f2328; }
h1 { font-size: 22px; margin-bottom: 4px; } h2 { font-size: 18px; margin: 28px 0 8px; }
h3 { font-size: 14px; margin: 14px 0 6px; color: #59636e; }
.sub { color: #59636e; margin-bottom: 16px; }
table { border-collapse: collapse; margin: 6px 0; } td, th { padding: 4px 10px; border-bottom: 1px solid #d1d9e0; text-align: left; }
th { background: #f6f8fa; } td.n { text-align: right; font-variant-numeric: tabular-nums; }
.ok { color: #1a7f37; font-weight: 600; } .bad { color: #cf222e; font-weight: 600; }
.card { border: 1px solid #d1d9e0; border-radius: 6px; padding: 4px 16px 12px; margin: 16px 0; }
.charts { display: flex; flex-wrap: wrap; gap: 24px; } .error { background: #ffebe9; padding: 8px; border-radius: 4px; }
svg text { font: 11px system-ui, sans-serif; fill: #1f2328; }
</style></head><body>
<h1>Nightly run {{ run }}</h1>
<div class="sub">pipeline {{ pipeline }} &middot;
{% if failed %}<span class="bad">{{ failed|length }} output(s) failed</span>{% else %}<span class="ok">every output published</span>{% endif %}</div>
<table><tr><th>output</th><th>kind</th><th>status</th><th>version</th><th>rows</th><th>rejects</th><th>reused</th><th>computed</th><th>collected versions</th></tr>
{% for o in outputs %}<tr><td>{{ o.name }}</td><td>{{ o.kind }}</td>
<td>{% if o.published %}<span class="ok">published</span>{% else %}<span class="bad">failed</span>{% endif %}</td>
<td>{{ o.version or "-" }}</td><td class="n">{{ o.rows }}</td><td class="n">{{ o.rejects }}</td>
<td class="n">{{ o.reused }}</td><td class="n">{{ o.computed }}</td><td>{{ o.deleted|join(", ") or "-" }}</td></tr>
{% endfor %}</table>
{% for o in outputs %}<div class="card"><h2>{{ o.name }} <small>({{ o.kind }})</small></h2>
{% if not o.published %}<div class="error">{{ o.error }}</div>{% endif %}
{% if o.reasons %}<h3>Rejected rows by reason ({{ o.rejects }}; in {{ o.rejects_path }})</h3>
<table><tr><th>reason</th><th>rows</th></tr>{% for reason, count in o.reasons %}<tr><td>{{ reason }}</td><td class="n">{{ count }}</td></tr>{% endfor %}</table>{% endif %}
<div class="charts">
{% if o.steps %}<div><h3>seconds per step</h3>{{ bars(o.steps) }}</div>{% endif %}
{% if o.seconds %}<div><h3>seconds per stage of compute</h3>{{ bars(o.seconds) }}</div>{% endif %}
{% if o.rates %}<div><h3>{{ o.rate_unit }} per stage</h3>{{ bars(o.rates) }}</div>{% endif %}
{% for g in o.gates %}<div><h3>Gate {{ g.precision }}: {% if g.passed %}<span class="ok">passed</span>{% else %}<span class="bad">failed</span>{% endif -%}
{% if g.recall_ratio is not none %}, known-item recall ratio {{ "%.4f"|format(g.recall_ratio) }} ({{ "%.4f"|format(g.recall) }} vs FP32 {{ "%.4f"|format(g.recall_fp32) }}, {{ g.pairs }} pairs){% endif %}
{%- if g.accuracy is not none %}, held-out accuracy {{ "%.4f"|format(g.accuracy) }} vs FP32 {{ "%.4f"|format(g.accuracy_fp32) }}{% endif %}</h3>
<div>{% if g.mrr_ratio is not none %}MRR@10 ratio {{ "%.4f"|format(g.mrr_ratio) }}, {% endif %}{% if g.overlap is not none %}neighbour overlap {{ "%.4f"|format(g.overlap) }}, {% endif %}
{%- if g.mean_cosine is not none %}mean cosine {{ "%.4f"|format(g.mean_cosine) }}, min {{ "%.4f"|format(g.min_cosine) }}{% endif %}
{%- if g.agreement is not none %}top-label agreement {{ "%.4f"|format(g.agreement) }}{% endif %} (reported, not gated{% if g.mean_cosine is not none %} but the cosine floor{% endif %})</div>
{% if g.cosine_histogram %}<div>cosine to FP32 of {{ g.cosine_histogram|sum }} held-out texts</div>{{ histogram(g.cosine_histogram) }}{% endif %}{% if g.reason %}<div>{{ g.reason }}</div>{% endif %}{% if g.note %}<div>{{ g.note }}</div>{% endif %}</div>{% endfor %}
</div>
{% if o.recall is not none %}<h3>Index check</h3><div>recall@10 {{ "%.3f"|format(o.recall) }} of the HNSW index against exact search</div>
{% if o.curve %}<table><tr><th>hnsw_ef</th><th>oversampling</th><th>exact</th><th>recall@10</th><th>median ms</th><th>p99 ms</th><th></th></tr>
{% for r in o.curve %}<tr><td class="n">{{ r.hnsw_ef }}</td><td class="n">{{ r.oversampling }}</td><td>{{ r.exact }}</td><td class="n">{{ r.recall_at_10 }}</td><td class="n">{{ r.median_ms }}</td><td class="n">{{ r.get('p99_ms', '') }}</td><td>{% if loop.last %}chosen{% endif %}</td></tr>{% endfor %}</table>{% endif %}{% endif %}
{% if o.models %}<h3>Held-out quality ({{ o.quality.split }} split, each user's last {{ o.quality.get('target', 'interaction') }}, {{ o.quality.users }} users{% if o.quality.get('cold_users') is not none %}, {{ o.quality.cold_users }} cold{% endif %})</h3>{% if o.quality.get('note') %}<div>{{ o.quality.note }}</div>{% endif %}{% if o.quality.get('seen') %}<div>seen items: {{ o.quality.seen }}</div>{% endif %}
<table><tr><th>model</th><th>HR@{{ o.quality.k }}</th><th>recall@{{ o.quality.k }}</th><th>NDCG@{{ o.quality.k }}</th><th>new-item NDCG@{{ o.quality.k }}</th><th>coverage</th><th></th></tr>
{% for name, m in o.models %}<tr><td>{{ name }}</td><td class="n">{{ m.hit_rate }}</td><td class="n">{{ m.get('recall', '') }}</td><td class="n">{{ m.ndcg }}</td><td class="n">{{ m.get('new_item_ndcg', '') }}</td><td class="n">{{ m.coverage }}</td>
<td>{{ bar(m.hit_rate, o.best_hit_rate) }}</td></tr>{% endfor %}</table>
<div class="charts">{% if o.candidates %}<div><h3>held-out NDCG@{{ o.quality.k }} of each candidate</h3>{{ bars(o.candidates, 4) }}</div>{% endif %}
{% for name, curve in o.get('curves', {}).items() %}<div><h3>{{ name }}: validation NDCG@10 at each training check</h3>{{ line(curve) }}</div>{% endfor %}</div>{% endif %}
</div>{% endfor %}
</body></html>
"""

BAR_W, BAR_H, LABEL_W = 260, 18, 110


def bars(values: dict[str, float], digits: int = 1) -> Markup:
    """Horizontal bars, one per stage (or model), scaled to the largest."""
    top = max(values.values()) or 1.0
    rows = []
    for i, (name, value) in enumerate(values.items()):
        y, width = i * (BAR_H + 6), max(1.0, BAR_W * value / top)
        rows.append(
            f'<text x="0" y="{y + 13}">{escape(name)}</text>'
            f'<rect x="{LABEL_W}" y="{y}" width="{width:.1f}" height="{BAR_H}" fill="#0969da"/>'
            f'<text x="{LABEL_W + width + 4:.1f}" y="{y + 13}">{value:,.{digits}f}</text>'
        )
    height = len(values) * (BAR_H + 6)
    return Markup(f'<svg width="{LABEL_W + BAR_W + 80}" height="{height}">{"".join(rows)}</svg>')


def bar(value: float, top: float) -> Markup:
    width = max(1.0, 160 * value / (top or 1.0))
    return Markup(
        f'<svg width="170" height="12"><rect width="{width:.1f}" height="12" fill="#1a7f37"/></svg>'
    )


def line(values: list[float]) -> Markup:
    """A curve over its checks (one point each), its best point marked: a training run you can read."""
    width, height, top = 300, 110, max(values) or 1.0
    step = width / max(len(values) - 1, 1)
    points = " ".join(f"{i * step:.1f},{height - 100 * v / top:.1f}" for i, v in enumerate(values))
    best = values.index(max(values))
    return Markup(
        f'<svg width="{width + 60}" height="{height + 20}"><polyline points="{points}" fill="none" '
        f'stroke="#0969da" stroke-width="2"/><circle cx="{best * step:.1f}" cy="{height - 100 * values[best] / top:.1f}" '
        f'r="4" fill="#1a7f37"><title>best: {values[best]}</title></circle>'
        f'<text x="0" y="{height + 16}">check 1</text><text x="{width}" y="{height + 16}" text-anchor="end">'
        f"check {len(values)}, best {values[best]}</text></svg>"
    )


def histogram(counts: list[int]) -> Markup:
    """Columns over COSINE_BINS, with the axis's ends and middle labelled."""
    width, height, column = 300, 110, 300 / len(counts)
    top = max(counts) or 1
    columns = "".join(
        f'<rect x="{i * column:.1f}" y="{height - 90 * c / top:.1f}" width="{column - 1:.1f}" '
        f'height="{90 * c / top:.1f}" fill="#8250df"><title>{c} texts in '
        f"[{COSINE_BINS[i]}, {COSINE_BINS[i + 1]})</title></rect>"
        for i, c in enumerate(counts)
    )
    labels = "".join(
        f'<text x="{x}" y="{height + 14}" text-anchor="{anchor}">{label}</text>'
        for x, anchor, label in (
            (0, "start", "&le;0.90"),
            (width / 2, "middle", "0.95"),
            (width, "end", "1.00"),
        )
    )
    return Markup(f'<svg width="{width + 10}" height="{height + 20}">{columns}{labels}</svg>')


def rejects_by_reason(path: str) -> list[tuple[str, int]]:
    """The most common reasons in a rejects file, by count (its `reject_reason` column)."""
    if not path or not Path(path).exists():
        return []
    reasons = pq.read_table(path, columns=[REASON])[REASON].to_pylist()
    return Counter(reasons).most_common(TOP_REASONS)


def output_view(name: str, report: OutputReport) -> dict[str, Any]:
    """What the template shows of one output, whatever its kind."""
    computed = report.computed
    validation = report.json()["validation"] or {}
    view = {
        "name": name,
        "kind": report.kind,
        "published": report.published,
        "error": report.error or "",
        "version": report.version,
        "rows": "-" if computed is None else computed.rows,
        "rejects": "-" if computed is None else computed.rejects,
        "reused": "-" if computed is None else computed.reused,
        "computed": "-" if computed is None else computed.computed,
        "deleted": report.deleted_versions,
        "rejects_path": "" if computed is None else computed.rejects_path or "",
        "reasons": rejects_by_reason(computed.rejects_path or "") if computed and computed.rejects else [],
        "gates": [{**GATE_FIELDS, **gate} for gate in ([] if computed is None else computed.gate)],
        "recall": validation.get("recall_at_10"),
        "curve": validation.get("curve", []),
        "models": [],
        "steps": report.steps,
        "seconds": {} if computed is None else computed.seconds,
        "rates": {} if computed is None else computed.rates,
        "rate_unit": "rows/s" if computed is None else computed.rate_unit,
    }
    if models := validation.get("models"):
        view["quality"] = validation
        view["models"] = [
            (f"{validation['published']} (published)" if n == "published" else n, m) for n, m in models.items()
        ]
        view["best_hit_rate"] = max(m["hit_rate"] for m in models.values())
        view["candidates"] = {name: m["ndcg"] for name, m in validation.get("candidates", {}).items()}
        view["curves"] = {name: curve for name, curve in validation.get("curves", {}).items() if curve}
    return view


def render(report: RunReport) -> str:
    environment = Environment(autoescape=True, undefined=StrictUndefined)
    environment.globals.update(bars=bars, bar=bar, histogram=histogram, line=line)
    template = environment.from_string(TEMPLATE)
    outputs = [output_view(name, output) for name, output in report.outputs.items()]
    return template.render(run=report.run, pipeline=report.pipeline, failed=report.failed, outputs=outputs)
