"""Build the demo interactions from Debian's package relations.

Why these: a package that declares another in Depends, Recommends or Suggests is a
real, curated "user of" signal with a real popularity curve (a few helpers are
needed by hundreds of packages, most by one or two), which a synthetic generator
would have to invent. Users are the binary packages of the archive; items are the
corpus packages they declare; the relation's strength is the weight.

    python data/build_interactions.py --out data/demo/interactions.parquet

Like build_corpus.py, it reads apt's own Packages index, fetched into a private
directory; nothing else is downloaded.
"""

from __future__ import annotations

import argparse
import re
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from build_corpus import SUITE_FILE, fetch_indexes, read_index

WEIGHTS = {"Depends": 1.0, "Recommends": 0.5, "Suggests": 0.25}
"""A hard dependency says more about a package than a suggestion does."""

# "foo:any (>= 1.2) [amd64] <!nocheck>" -> "foo"
PACKAGE_NAME = re.compile(r"^\s*([a-z0-9][a-z0-9+.-]*)")


def declared(field: str) -> list[str]:
    """Package names of a relation field: the first alternative of each `|` group, bare."""
    names = []
    for group in field.split(","):
        match = PACKAGE_NAME.match(group.split("|")[0])
        if match:
            names.append(match.group(1))
    return names


def build(lists_dir: Path, items: set[str], min_items: int) -> pa.Table:
    packages = read_index(next(lists_dir.glob(f"{SUITE_FILE}_binary-amd64_Packages*")))
    edges: dict[tuple[str, str], float] = {}
    for pkg in packages:
        user = pkg["Package"]
        for field, weight in WEIGHTS.items():
            for item in declared(pkg.get(field, "")):
                if item in items and item != user:
                    # A package that both depends on and suggests an item: the stronger tie counts.
                    edges[user, item] = max(weight, edges.get((user, item), 0.0))
    per_user: dict[str, int] = {}
    for user, _ in edges:
        per_user[user] = per_user.get(user, 0) + 1
    rows = sorted((u, i, w) for (u, i), w in edges.items() if per_user[u] >= min_items)
    users, item_ids, weights = zip(*rows, strict=True)
    return pa.table(
        {
            "user_id": pa.array(users, pa.string()),
            "item_id": pa.array(item_ids, pa.string()),
            "weight": pa.array(weights, pa.float32()),
        }
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, default=Path("data/demo/corpus.parquet"))
    parser.add_argument("--out", type=Path, default=Path("data/demo/interactions.parquet"))
    parser.add_argument("--min-items", type=int, default=2, help="fewest corpus items a user must declare")
    args = parser.parse_args()
    items = set(pq.read_table(args.corpus, columns=["id"])["id"].to_pylist())
    with tempfile.TemporaryDirectory() as tmp:
        fetch_indexes(Path(tmp))
        table = build(Path(tmp), items, args.min_items)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, args.out, compression="zstd", compression_level=19)
    users = len(set(table["user_id"].to_pylist()))
    distinct = len(set(table["item_id"].to_pylist()))
    print(
        f"{users} users, {table.num_rows} interactions, {distinct} items, "
        f"{args.out.stat().st_size / 1e6:.2f} MB -> {args.out}"
    )


if __name__ == "__main__":
    main()
