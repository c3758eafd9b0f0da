"""Seeds derived from a tuple of parts by SHA-256, the same in every process and on every machine.

Arithmetic seeds such as ``seed * 1_000_003 + epoch * 10_007 + step`` collide once a count
passes the multiplier (MS MARCO document: 367k training rows, ~91k steps per epoch): two
(epoch, step) pairs would draw the same randomness. A hash of the whole tuple does not.
"""

from __future__ import annotations

import hashlib


def derived_seed(*parts: object) -> int:
    """A 63-bit seed of ``parts`` (their ``repr``s, in order): for ``torch.Generator`` and ``random.Random``."""
    digest = hashlib.sha256("\x1f".join(repr(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


__all__ = ["derived_seed"]
