"""Parquet files written as a stream of row chunks: a file's rows never sit in memory at once."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from itertools import islice
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

CHUNK_ROWS = 4096


def write_rows(path: Path, schema: pa.Schema, rows: Iterable[dict], chunk_rows: int = CHUNK_ROWS) -> int:
    """Write ``rows`` (dicts of ``schema``'s columns) to a Parquet file at ``path``, ``chunk_rows`` at
    a time (one row group each); the number of rows. An empty ``rows`` gives an empty table."""
    iterator: Iterator[dict] = iter(rows)
    written = 0
    with pq.ParquetWriter(str(path), schema) as writer:
        while chunk := list(islice(iterator, chunk_rows)):
            writer.write_table(pa.Table.from_pylist(chunk, schema=schema))
            written += len(chunk)
        if not written:
            writer.write_table(schema.empty_table())
    return written


__all__ = ["write_rows", "CHUNK_ROWS"]
