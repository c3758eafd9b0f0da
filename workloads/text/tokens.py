"""Tokenisation shared by the lexical scorers: lower-cased alphanumeric runs.

No stemming and no stop-word list, on purpose: GloVe's vocabulary is unstemmed, and the
same tokens for BM25 keep the two scorers comparable.
"""

import re

_TOKEN = re.compile(r"[a-z0-9]+")


def tokenize(text: str) -> list[str]:
    return _TOKEN.findall(text.lower())
