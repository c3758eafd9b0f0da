"""A rule-based, deterministic sentence splitter (no model downloads).

Splits after ``.``, ``!`` or ``?`` (optionally followed by closing quotes or brackets)
when whitespace and an upper-case letter, digit or opening quote/bracket follow, except
after common abbreviations ("e.g.", "i.e.", "et al.", "Fig.", "vs.", titles) and single
initials ("J. Smith"). Scientific abstracts (SciFact) and web text split well enough for
sentence selection; exact linguistic boundaries do not matter here.
"""

from __future__ import annotations

import re

# Part of every key computed from sentences: a new splitter makes new data.
# 2: the title is a candidate sentence of its own (1 split the text only)
SPLITTER_VERSION = 2

_ABBREVIATIONS = {
    "e.g", "i.e", "et al", "al", "fig", "figs", "vs", "cf", "etc", "approx", "dr", "mr", "mrs", "ms", "prof",
    "no", "vol", "eq", "eqs", "ref", "refs", "st", "jr", "sr", "inc", "ltd", "co", "ca", "resp", "sp", "spp",
}
_BOUNDARY = re.compile(r"(?<=[.!?])[\"')\]]*\s+(?=[\"'(\[]?[A-Z0-9])")


def split_sentences(text: str) -> list[str]:
    text = " ".join(text.split())
    if not text:
        return []
    sentences: list[str] = []
    start = 0
    for match in _BOUNDARY.finditer(text):
        candidate = text[start:match.start()].strip()
        last_word = candidate.rsplit(" ", 1)[-1].rstrip(".!?\"')]").lower()
        if last_word in _ABBREVIATIONS or (len(last_word) == 1 and last_word.isalpha()):
            continue  # "et al. Smith", "J. Smith": not a boundary
        sentences.append(text[start:match.end()].strip())
        start = match.end()
    tail = text[start:].strip()
    if tail:
        sentences.append(tail)
    return sentences


def document_sentences(document) -> list[str]:
    """A document's candidate sentences (augmentation, selectors): its title (if any, one
    sentence of its own), then its text's sentences. ``document``: anything with ``title`` and
    ``text`` (:class:`workloads.data.collections.Document`)."""
    title = " ".join(document.title.split())
    return ([title] if title else []) + split_sentences(document.text)
