"""Semantic textual similarity: Spearman's rank correlation between an encoder's cosine
similarities and human scores, as SimCSE and DiffCSE report STS (x100 in their tables).

Files are tab-separated, one sentence pair a line, in any of the layouts the data ships in:

- three columns ``score, sentence 1, sentence 2`` (no header);
- STS-benchmark's own CSV files (``sts-dev.csv``: genre, file, year, id, score, sentence 1,
  sentence 2, sometimes followed by source columns; no header);
- a header naming the columns: GLUE's STS-B (``sentence1``, ``sentence2``, ``score``; the test
  file has no score and is refused) or SICK (``sentence_A``, ``sentence_B``, ``relatedness_score``).

No quoting: sentences hold quote characters as text. A malformed line is one error naming the
file and line.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy import stats

from workloads.core.errors import InputError

HEADERS = {  # header names of (sentence 1, sentence 2, score)
    "glue": ("sentence1", "sentence2", "score"),
    "sick": ("sentence_a", "sentence_b", "relatedness_score"),
}
STS_BENCHMARK_COLUMNS = 7  # genre, file, year, id, score, sentence 1, sentence 2


@dataclass(frozen=True)
class STSPairs:
    first: list[str]
    second: list[str]
    scores: np.ndarray  # float64 gold similarity


def _score(value: str, path: Path, line: int) -> float:
    try:
        score = float(value)
    except ValueError:
        raise InputError(f"{path}:{line}", f"score '{value[:40]}' is not a number") from None
    if not np.isfinite(score):
        raise InputError(f"{path}:{line}", f"score '{value}' is not finite")
    return score


def read_sts(path: str | Path) -> STSPairs:
    """The sentence pairs and gold scores of an STS-B / SICK file (see the module doc)."""
    path = Path(path).expanduser()
    if path.is_dir():
        raise InputError(path, "a directory, not an STS file (name the file of sentence pairs in it)")
    if not path.is_file():
        raise InputError(path, "no such STS file")
    try:
        with open(path, encoding="utf-8", newline="") as handle:
            reader = csv.reader(handle, delimiter="\t", quoting=csv.QUOTE_NONE)
            # (physical line, row): blank lines are skipped, yet errors name the line an editor shows
            numbered = [(reader.line_num, row) for row in reader if row and any(row)]
    except UnicodeDecodeError as exc:
        raise InputError(path, f"not UTF-8 text (byte offset {exc.start})") from None
    if not numbered:
        raise InputError(path, "no sentence pairs")
    header = [cell.strip().lower() for cell in numbered[0][1]]
    columns, start = None, 0
    for names in HEADERS.values():
        if all(name in header for name in names[:2]):
            if names[2] not in header:
                raise InputError(path, f"the header has no '{names[2]}' column (a test file without scores?)")
            columns, start = tuple(header.index(name) for name in names), 1
    first, second, scores = [], [], []
    for number, row in numbered[start:]:
        if columns is not None:
            if len(row) <= max(columns):
                raise InputError(f"{path}:{number}", f"{len(row)} columns, the header names {len(header)}")
            a, b, score = row[columns[0]], row[columns[1]], row[columns[2]]
        elif len(row) == 3:
            score, a, b = row
        elif len(row) >= STS_BENCHMARK_COLUMNS:
            score, a, b = row[4], row[5], row[6]
        else:
            raise InputError(f"{path}:{number}", f"{len(row)} tab-separated columns: expected score, sentence 1, sentence 2 "
                                                 "(or STS-benchmark's 7, or a GLUE/SICK header)")
        first.append(a)
        second.append(b)
        scores.append(_score(score, path, number))
    return STSPairs(first, second, np.asarray(scores, dtype=np.float64))


def cosine_similarities(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    a = first / np.maximum(np.linalg.norm(first, axis=1, keepdims=True), 1e-12)
    b = second / np.maximum(np.linalg.norm(second, axis=1, keepdims=True), 1e-12)
    return np.sum(a * b, axis=1, dtype=np.float64)


def spearman(predicted: np.ndarray, gold: np.ndarray) -> float:
    """Spearman's rho (ties share their mean rank), NaN-free: constant predictions give 0."""
    if len(gold) < 2:
        raise ValueError("Spearman's correlation needs at least two pairs")
    if np.ptp(predicted) == 0 or np.ptp(gold) == 0:
        return 0.0
    return float(stats.spearmanr(predicted, gold).statistic)


def evaluate_sts(encoder, path: str | Path, batch_size: int = 64) -> dict[str, float]:
    """{"spearman": rho, "pairs": n} of ``encoder`` (a BiEncoder: both sentences through the
    document tower, as sentence embeddings are) on the STS file at ``path``."""
    pairs = read_sts(path)
    if len(pairs.scores) < 2:
        raise InputError(path, "needs at least two sentence pairs")
    first = encoder.encode_documents(pairs.first, batch_size=batch_size)
    second = encoder.encode_documents(pairs.second, batch_size=batch_size)
    return {"spearman": spearman(cosine_similarities(first, second), pairs.scores), "pairs": float(len(pairs.scores))}


__all__ = ["STSPairs", "cosine_similarities", "evaluate_sts", "read_sts", "spearman"]
