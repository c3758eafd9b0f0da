"""GloVe vectors: find the file, read it (text, optionally gzipped). Used by the ``glove``
sentence scorer and by selectors with GloVe embeddings."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np

from workloads.core.errors import InputError
from workloads.core.paths import data_dir


def resolve_glove_path(glove_path: str) -> Path:
    path = Path(glove_path).expanduser()
    if not path.is_absolute() and not path.exists() and data_dir() is not None:
        path = data_dir() / path
    if not path.exists():
        raise InputError(glove_path, "GloVe file not found (relative paths resolve against $ORCHESTRATE_DATA_DIR)")
    return path


def load_glove(path: Path) -> tuple[dict[str, int], np.ndarray]:
    """Read a GloVe text file (``word v1 ... vd`` per line, optionally gzipped)."""
    opener = gzip.open if str(path).endswith(".gz") else open
    words: dict[str, int] = {}
    vectors: list[list[float]] = []
    try:
        with opener(path, "rt", encoding="utf-8") as handle:
            for line_no, line in enumerate(handle, 1):
                fields = line.rstrip().split(" ")
                if len(fields) < 2:
                    continue
                if vectors and len(fields) - 1 != len(vectors[0]):
                    raise InputError(f"{path}:{line_no}", f"expected {len(vectors[0])} values, got {len(fields) - 1}")
                try:
                    vectors.append([float(v) for v in fields[1:]])
                except ValueError:
                    raise InputError(f"{path}:{line_no}", "not a GloVe line (word followed by numbers)") from None
                words[fields[0]] = len(words)
    except OSError as exc:
        raise InputError(path, f"cannot read GloVe vectors ({exc.strerror or exc})") from None
    if not vectors:
        raise InputError(path, "no vectors")
    return words, np.asarray(vectors, dtype=np.float32)
