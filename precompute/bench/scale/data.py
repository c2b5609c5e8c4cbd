"""Deterministic inputs of any size for `precompute bench scale`, recombined from the demo's real ones.

A corpus row's text is the title and a sentence of one demo document (whose Debian section
it keeps, so the labels head has something real to learn) and a sentence of one or two
others: real prose of realistic length, and rows made from the same document share words,
as related products do. Interactions follow the shapes real ones have: item popularity is
Zipf (a few items in most users' lists, most items in one or two), the number of
interactions per user is long-tailed (log-normal), and half of a user's picks are items
made from the user's "taste" document, so content predicts something, as it does in real
data. The interactions are a log's files, to which a rerun adds a day's. Everything is vectorised (numpy, pyarrow compute): 1M rows take seconds.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from precompute.demo_data import DEMO_CORPUS

ZIPF_EXPONENT = 1.0
"""Item popularity ∝ 1 / rank^s; s = 1 is the classic long tail of catalogue sales."""
TASTE_SHARE = 0.5
"""Share of a user's interactions drawn from items made from one document they like."""
USERS_PER_ITEM = 0.1
ROW_GROUP_ROWS = 65_536
"""Rows per Parquet row group (about 20 MB of corpus), as a data lake's writers cut them. A read
task holds a whole row group: pyarrow's default (1M rows) made every Ray worker that read the
1M-row corpus hold 300 MB of it at once, so per-process memory grew with the input."""
FILE_ROWS = 10_000
"""Rows per corpus file (and interactions file): the corpus is a folder of files, as a data lake's table is (100 files at
1M rows), so that a night's validation reads again only the files that moved."""
NEWEST_FILES = 2
"""A rerun's changed texts fall in the newest files, NEWEST_FILES x `share` of them (at least one):
a catalogue's edits concentrate on its recent items, and a lake writes them as rewritten
partitions. At 1M rows, 1% of the texts changed are half the rows of 2 of the 100 files."""
SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def ids(prefix: str, count: int) -> pa.Array:
    """prefix-0000042: unique, sortable, built without a Python loop."""
    digits = pc.utf8_lpad(pc.cast(pa.array(np.arange(count)), pa.string()), max(7, len(str(count))), "0")
    return pc.binary_join_element_wise(pa.scalar(prefix), digits, "-")


class Sentences:
    """The demo corpus split once into sentences: a flat array plus each document's range."""

    def __init__(self, corpus: Path = DEMO_CORPUS) -> None:
        demo = pq.read_table(corpus, columns=["title", "text", "section"])
        bodies = [SENTENCE_END.split(" ".join(text.split())) for text in demo["text"].to_pylist()]
        self.titles = demo["title"]
        self.sections = demo["section"]
        self.sentences = pa.array([s for body in bodies for s in body])
        counts = np.array([len(body) for body in bodies])
        self.starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
        self.counts = counts
        self.documents = len(bodies)

    def pick(self, documents: np.ndarray, rng: np.random.Generator) -> pa.Array:
        """One random sentence of each given document."""
        within = (rng.random(len(documents)) * self.counts[documents]).astype(np.int64)
        return self.sentences.take(pa.array(self.starts[documents] + within))


def texts(sentences: Sentences, source: np.ndarray, rng: np.random.Generator) -> pa.Array:
    """Title and a sentence of each `source` document, then a sentence of one or two others."""
    n = len(source)
    second = sentences.pick(rng.integers(0, sentences.documents, n), rng)
    third = sentences.pick(rng.integers(0, sentences.documents, n), rng)
    third = pc.if_else(pa.array(rng.random(n) < 0.5), third, pa.scalar(None, pa.string()))
    title = pc.binary_join_element_wise(sentences.titles.take(pa.array(source)), pa.scalar(""), ".")
    parts = (title, sentences.pick(source, rng), second, third)
    return pc.binary_join_element_wise(*parts, " ", null_handling="skip")


def corpus(rows: int, seed: int = 0, sentences: Sentences | None = None) -> pa.Table:
    """id, text, section, source (the demo document the row's section and first sentence came from)."""
    sentences = sentences or Sentences()
    rng = np.random.default_rng(seed)
    source = rng.integers(0, sentences.documents, rows)
    return pa.table(
        {
            "id": ids("doc", rows),
            "text": texts(sentences, source, rng),
            "section": sentences.sections.take(pa.array(source)),
            "source": pa.array(source.astype(np.int32)),
        }
    )


def changed_corpus(table: pa.Table, share: float, seed: int) -> tuple[pa.Table, int]:
    """The corpus with `share` of its rows given a new text (same id, section, source), drawn
    from its newest files' rows (NEWEST_FILES): (table, changed)."""
    rng = np.random.default_rng(seed)
    files = math.ceil(table.num_rows / FILE_ROWS)
    newest = min(table.num_rows, max(1, round(NEWEST_FILES * share * files)) * FILE_ROWS)
    changed = np.zeros(table.num_rows, bool)
    changed[table.num_rows - newest :] = rng.random(newest) < share * table.num_rows / newest
    source = table["source"].to_numpy()
    fresh = texts(Sentences(), source, rng)
    text = pc.if_else(pa.array(changed), fresh, table["text"])
    return table.set_column(table.schema.get_field_index("text"), "text", text), int(changed.sum())


def zipf_items(count: int, items: int, rng: np.random.Generator) -> np.ndarray:
    """`count` item positions with P(rank r) ∝ 1/r^s over a random order of the items."""
    cdf = np.cumsum(1.0 / np.arange(1, items + 1) ** ZIPF_EXPONENT)
    ranks = np.searchsorted(cdf, rng.random(count) * cdf[-1])
    return rng.permutation(items)[np.minimum(ranks, items - 1)]


def interactions(table: pa.Table, seed: int = 0) -> pa.Table:
    """user_id, item_id, weight for about rows/10 users; every item id is a corpus id."""
    rng = np.random.default_rng(seed)
    items = table.num_rows
    users = max(2, int(items * USERS_PER_ITEM))
    per_user = np.minimum(np.ceil(rng.lognormal(1.0, 1.0, users)), 500).astype(np.int64)
    user = np.repeat(np.arange(users), per_user)
    item = zipf_items(len(user), items, rng)
    # Taste: items built from the user's favourite demo document (they share its title and a sentence).
    source = table["source"].to_numpy()
    by_source = np.argsort(source, kind="stable")
    starts = np.searchsorted(source[by_source], np.arange(int(source.max()) + 2))
    taste = source[rng.integers(0, items, users)][user]
    size = starts[taste + 1] - starts[taste]
    liked = by_source[starts[taste] + (rng.random(len(user)) * size).astype(np.int64)]
    item = np.where(rng.random(len(user)) < TASTE_SHARE, liked, item)
    pairs = np.unique(user * items + item)  # one interaction per (user, item), sorted by user
    user, item = pairs // items, pairs % items
    weight = rng.choice(np.array([1.0, 0.5, 0.25], np.float32), len(pairs), p=[0.6, 0.25, 0.15])
    return pa.table(
        {
            "user_id": ids("user", users).take(pa.array(user)),
            "item_id": table["id"].take(pa.array(item)),
            "weight": pa.array(weight),
        }
    )


def new_interactions(table: pa.Table, corpus_table: pa.Table, share: float, seed: int) -> tuple[pa.Table, int]:
    """A day's interactions: `share` of the users interact again (drawn like the originals), with
    items they do not hold yet: (the new rows, users who got some)."""
    fresh = interactions(corpus_table, seed)
    users = pc.unique(table["user_id"])
    rng = np.random.default_rng(seed)
    chosen = users.filter(pa.array(rng.random(len(users)) < share))
    new = fresh.filter(pc.is_in(fresh["user_id"], chosen))
    held = pc.binary_join_element_wise(table["user_id"], table["item_id"], "\x00")
    pairs = pc.binary_join_element_wise(new["user_id"], new["item_id"], "\x00")
    new = new.filter(pc.invert(pc.is_in(pairs, held)))
    return new, len(pc.unique(new["user_id"]))


def write_corpus(folder: Path, table: pa.Table, before: pa.Table | None = None) -> None:
    """The corpus as files of FILE_ROWS rows in `folder`, in id order; with `before`, only the
    files whose rows moved are written again (a lake rewrites the partitions that changed)."""
    folder.mkdir(parents=True, exist_ok=True)
    for start in range(0, table.num_rows, FILE_ROWS):
        part = table.slice(start, FILE_ROWS)
        if before is None or not part.equals(before.slice(start, FILE_ROWS)):
            pq.write_table(part, folder / f"part-{start // FILE_ROWS:05d}.parquet", row_group_size=ROW_GROUP_ROWS)


def write_interactions(folder: Path, table: pa.Table) -> None:
    """The interactions as a log's files of FILE_ROWS rows in `folder`, in user order."""
    folder.mkdir(parents=True, exist_ok=True)
    for start in range(0, max(table.num_rows, 1), FILE_ROWS):
        name = f"part-{start // FILE_ROWS:05d}.parquet"
        pq.write_table(table.slice(start, FILE_ROWS), folder / name, row_group_size=ROW_GROUP_ROWS)


def write_inputs(directory: Path, rows: int, seed: int = 0) -> tuple[Path, Path]:
    """The corpus/ folder (write_corpus) and the interactions/ folder (write_interactions) of
    `rows` rows under `directory` (kept if already there)."""
    directory.mkdir(parents=True, exist_ok=True)
    corpus_path, interactions_path = directory / "corpus", directory / "interactions"
    if not (corpus_path.exists() and interactions_path.exists()):
        table = corpus(rows, seed)
        write_corpus(corpus_path, table)
        write_interactions(interactions_path, interactions(table, seed))
    return corpus_path, interactions_path


def change_inputs(directory: Path, share: float, seed: int = 1) -> dict[str, int]:
    """Give `share` of the corpus texts (in its newest files) new values in place, and `share`
    of the users new interactions, in a file added to the log (an event log's new day: its
    older files do not move)."""
    corpus_path, interactions_path = directory / "corpus", directory / "interactions"
    before = pq.read_table(corpus_path)
    table, texts_changed = changed_corpus(before, share, seed)
    write_corpus(corpus_path, table, before)
    new, users_changed = new_interactions(pq.read_table(interactions_path), table, share, seed)
    day = len(list(interactions_path.glob("*.parquet")))
    pq.write_table(new, interactions_path / f"part-{day:05d}.parquet", row_group_size=ROW_GROUP_ROWS)
    return {"texts_changed": texts_changed, "users_changed": users_changed}
