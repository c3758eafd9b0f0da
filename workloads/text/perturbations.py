"""Query perturbations for robustness evaluation (CFT section 4.2; docs/guide/robustness.md).

CFT made one perturbed version of every test query per type with CheckList (Ribeiro et al.,
ACL 2020). CheckList is unmaintained and its punctuation rule needs a spaCy model that
cannot be downloaded here, so its rules are re-implemented (by hand, for that reason), each
deterministic: a perturbation that draws (``typo``, the choice between expanding and
contracting) uses one RNG per query, seeded from the perturbation's name, the query id and
the seed through SHA-256, so a perturbed set is the same in every process and on every
machine and never changes when other queries are added.

- ``punctuation``: strip the trailing punctuation if there is any (with the space before
  it, as in WikiQA's tokenised "formed ?"), else append ".".
- ``typo``: one swap of two adjacent characters at a position drawn uniformly among those
  whose two characters differ (swapping equal characters would change nothing; CheckList
  draws over every position). A query with no such position gets no variant.
- ``contraction``: expand contractions ("what's" -> "what is") or contract expansions
  ("what is" -> "what's"), case-insensitively, keeping the case of the matched text. When
  both are possible the query's RNG picks one; a query with nothing to change gets no
  variant, so this set is a strict subset of the queries. The expansion table is CheckList's
  (lower-cased; its "how'd'y" and "ma'am" left out). The contraction table is **not**
  CheckList's: it is the inverse of the expansion table (where several contractions share an
  expansion, "is not" contracts to "isn't"). CheckList contracts with a shorter hand-written
  table that has no "have" or "will" forms of pronouns ("could have", "he will", "you have"
  stay as they are there), so this rule contracts more queries than CheckList would.

``PERTURBATIONS`` is the registry: a name -> a function ``(query, rng) -> str | None``
(None: no variant). A variant equal to its original is never produced.
"""

from __future__ import annotations

import hashlib
import random
import re
import string
from collections.abc import Callable

Perturbation = Callable[[str, random.Random], str | None]

# CheckList's expansion table (checklist/perturb.py), lower case; its inverse contracts (not CheckList's own, see above).
CONTRACTIONS: dict[str, str] = {
    "ain't": "is not", "aren't": "are not", "can't": "cannot", "can't've": "cannot have", "could've": "could have",
    "couldn't": "could not", "didn't": "did not", "doesn't": "does not", "don't": "do not", "hadn't": "had not",
    "hasn't": "has not", "haven't": "have not", "he'd": "he would", "he'd've": "he would have", "he'll": "he will",
    "he's": "he is", "how'd": "how did", "how'll": "how will", "how's": "how is", "i'd": "i would", "i'll": "i will",
    "i'm": "i am", "i've": "i have", "isn't": "is not", "it'd": "it would", "it'll": "it will", "it's": "it is",
    "might've": "might have", "mightn't": "might not", "must've": "must have", "mustn't": "must not",
    "needn't": "need not", "oughtn't": "ought not", "shan't": "shall not", "she'd": "she would", "she'll": "she will",
    "she's": "she is", "should've": "should have", "shouldn't": "should not", "that'd": "that would",
    "that's": "that is", "there'd": "there would", "there's": "there is", "they'd": "they would",
    "they'll": "they will", "they're": "they are", "they've": "they have", "wasn't": "was not", "we'd": "we would",
    "we'll": "we will", "we're": "we are", "we've": "we have", "weren't": "were not", "what're": "what are",
    "what's": "what is", "when's": "when is", "where'd": "where did", "where's": "where is",
    "where've": "where have", "who'll": "who will", "who's": "who is", "who've": "who have", "why's": "why is",
    "won't": "will not", "would've": "would have", "wouldn't": "would not", "you'd": "you would",
    "you'd've": "you would have", "you'll": "you will", "you're": "you are", "you've": "you have",
}
# Expansions that several contractions share ("is not": ain't, isn't) contract to the common one.
_PREFERRED = {"is not": "isn't"}
EXPANSIONS: dict[str, str] = {**{v: k for k, v in CONTRACTIONS.items() if v not in _PREFERRED}, **_PREFERRED}


def _table_pattern(table: dict[str, str]) -> re.Pattern:
    # longest first, so "can't've" wins over "can't"; word boundaries on both sides
    keys = sorted(table, key=len, reverse=True)
    return re.compile(r"(?<![\w'])(" + "|".join(re.escape(k) for k in keys) + r")(?![\w'])", re.IGNORECASE)


_CONTRACTED = _table_pattern(CONTRACTIONS)
_EXPANDED = _table_pattern(EXPANSIONS)


def _same_case(source: str, replacement: str) -> str:
    if source.isupper() and any(c.isalpha() for c in source):
        return replacement.upper()
    if source[:1].isupper():
        return replacement[:1].upper() + replacement[1:]
    return replacement


def _replace(query: str, pattern: re.Pattern, table: dict[str, str]) -> str:
    return pattern.sub(lambda m: _same_case(m.group(0), table[m.group(0).lower()]), query)


def punctuation(query: str, rng: random.Random) -> str | None:
    stripped = query.rstrip()
    bare = stripped.rstrip(string.punctuation).rstrip()
    if bare and bare != stripped:
        return bare
    return stripped + "." if stripped else None


def typo(query: str, rng: random.Random) -> str | None:
    positions = [i for i in range(len(query) - 1) if query[i] != query[i + 1]]
    if not positions:
        return None
    i = rng.choice(positions)
    return query[:i] + query[i + 1] + query[i] + query[i + 2:]


def contraction(query: str, rng: random.Random) -> str | None:
    variants = [v for v in (_replace(query, _CONTRACTED, CONTRACTIONS), _replace(query, _EXPANDED, EXPANSIONS)) if v != query]
    if not variants:
        return None
    return variants[0] if len(variants) == 1 else rng.choice(variants)


PERTURBATIONS: dict[str, Perturbation] = {"punctuation": punctuation, "typo": typo, "contraction": contraction}


def query_rng(perturbation: str, query_id: str, seed: int = 0) -> random.Random:
    """The one RNG of a (perturbation, query): the same in every process (SHA-256, not hash())."""
    digest = hashlib.sha256(f"{perturbation}\x1f{query_id}\x1f{seed}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def perturb_queries(queries: dict[str, str], perturbation: str, seed: int = 0) -> dict[str, str]:
    """The perturbed version of every query that has one (query id -> text)."""
    if perturbation not in PERTURBATIONS:
        raise ValueError(f"unknown perturbation '{perturbation}' (known: {', '.join(PERTURBATIONS)})")
    rule = PERTURBATIONS[perturbation]
    perturbed = {}
    for query_id, text in queries.items():
        variant = rule(text, query_rng(perturbation, query_id, seed))
        if variant is not None and variant != text:
            perturbed[query_id] = variant
    return perturbed


__all__ = ["PERTURBATIONS", "CONTRACTIONS", "EXPANSIONS", "punctuation", "typo", "contraction", "query_rng", "perturb_queries"]
