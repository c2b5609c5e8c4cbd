"""Build the demo corpus from Debian's archive metadata.

Why Debian: its package descriptions are real, human-written English prose of the
length a product corpus has (about 100 tokens), each with a curated label (the
archive Section) and real relations (maintainers, source packages) for the
recommendations demo. Everything comes from the Debian package registry through
apt itself; nothing else is downloaded.

    python data/build_corpus.py --out data/demo/corpus.parquet --docs 5000

The Packages index gives Section, Maintainer and Source; the long descriptions
live in the Translation-en index, joined on (Package, Description-md5).
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from debian.deb822 import Deb822

APT_HELPER = "/usr/lib/apt/apt-helper"
SUITE_FILE = "deb.debian.org_debian_dists_bookworm_main"


def fetch_indexes(lists_dir: Path) -> None:
    """Download the Packages and Translation-en indexes into a private lists dir."""
    (lists_dir / "partial").mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [
            "apt-get",
            "-q",
            "-o",
            "Acquire::Languages=en",
            "-o",
            f"Dir::State::Lists={lists_dir}",
            "update",
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )


def read_index(path: Path) -> list[Deb822]:
    """Decompress an apt index with apt's own helper and parse its paragraphs."""
    text = subprocess.run(
        [APT_HELPER, "cat-file", str(path)], check=True, capture_output=True, text=True
    ).stdout
    return list(Deb822.iter_paragraphs(text.splitlines(keepends=True)))


def long_description(field: str) -> tuple[str, str]:
    """Split a Description-en field into (synopsis, body); ' .' lines are paragraph breaks."""
    synopsis, _, rest = field.partition("\n")
    lines = [line.strip() for line in rest.splitlines()]
    body = "\n".join("" if line == "." else line for line in lines).strip()
    return synopsis.strip(), body


def build(lists_dir: Path, docs: int, min_chars: int) -> pa.Table:
    packages = read_index(next(lists_dir.glob(f"{SUITE_FILE}_binary-amd64_Packages*")))
    translations = {
        (p["Package"], p["Description-md5"]): p["Description-en"]
        for p in read_index(next(lists_dir.glob(f"{SUITE_FILE}_i18n_Translation-en*")))
    }
    rows = []
    for pkg in packages:
        description = translations.get((pkg["Package"], pkg.get("Description-md5", "")))
        section = pkg.get("Section", "")
        if description is None or "/" in section:  # no long text, or not in main
            continue
        title, body = long_description(description)
        if len(body) < min_chars:
            continue
        rows.append(
            {
                "id": pkg["Package"],
                "title": title,
                "text": f"{title}. {body}",
                "section": section,
                "source": pkg.get("Source", pkg["Package"]).split(" ")[0],
                # Pseudonymous: the demo needs who-maintains-what, not anyone's address.
                "maintainer": "m-" + hashlib.sha256(pkg.get("Maintainer", "").encode()).hexdigest()[:12],
            }
        )
    # A stable pseudo-random sample: the same packages on every rebuild of the same archive.
    rows.sort(key=lambda r: hashlib.sha256(r["id"].encode()).hexdigest())
    return pa.Table.from_pylist(rows[:docs])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("data/demo/corpus.parquet"))
    parser.add_argument("--docs", type=int, default=5000)
    parser.add_argument("--min-chars", type=int, default=120, help="shortest long description kept")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        fetch_indexes(Path(tmp))
        table = build(Path(tmp), args.docs, args.min_chars)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, args.out, compression="zstd", compression_level=19)
    print(f"{table.num_rows} documents, {args.out.stat().st_size / 1e6:.2f} MB -> {args.out}")


if __name__ == "__main__":
    main()
