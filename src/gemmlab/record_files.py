"""Reading the project's JSON-line record files, plain or gzipped (no torch, no other gemmlab module).

The large append-only files under ``benchmarks/results`` are kept as ``X.jsonl.gz``, each run appended as one
more gzip member; the others are plain ``X.jsonl``. ``gemmlab.bench`` writes records, ``gemmlab.reports``
(``gemmlab plot``) and the benchmark scripts read them through this module.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path


def read_record_text(path: str | Path) -> str:
    """The text of a JSON-line record file, plain or gzip. The large append-only files are kept as
    ``X.jsonl.gz``, each run appended as one more gzip member (``gzip -c run.jsonl >> X.jsonl.gz``; the
    members decompress as one stream). Asked for ``X.jsonl`` where only ``X.jsonl.gz`` exists, this reads
    that, so a reader keeps the name it always used. Gzip is told by its magic bytes, not by the name."""
    path = Path(path)
    gz = path.with_name(path.name + ".gz")
    if not path.exists() and gz.exists():
        path = gz
    data = path.read_bytes()
    return (gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data).decode()


def load_records(path: str | Path) -> list[dict]:
    """The JSON objects of a record file (``X.jsonl`` or ``X.jsonl.gz``: ``read_record_text``), one per
    non-blank line, in file order."""
    return [json.loads(line) for line in read_record_text(path).splitlines() if line.strip()]
