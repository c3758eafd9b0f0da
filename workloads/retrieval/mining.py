"""Hard negatives mined by a trained model, with the miner's scores kept for distillation.

The selection steps and the miners' registry: a kind registers its miners (the dense kind:
``dense`` and ``cross_encoder``, :mod:`workloads.kinds.dense.mining`) and a training set asks
the registry by ``training_data.mining.method``, so the re-ranking kind never imports a miner's kind.

A training row's negatives are usually drawn uniformly from the first stage's (BM25's) top
list. A miner scores candidates with a stronger model instead, as sentence-transformers'
``mine_hard_negatives`` does, and the selection follows its steps:

1. candidates: the miner's top ``depth`` documents of the query that are not judged relevant
   (``method: dense``: a dense run, ``run`` a dense trial file or ``model`` an encoder;
   ``method: cross_encoder``: the first stage's top ``depth`` re-scored by a kept cross-encoder,
   ``model`` its checkpoint directory);
2. margin filters against the query's hardest (lowest-scored) positive p: a candidate is
   dropped when score + ``absolute_margin`` > p, or score > p - |p| * ``relative_margin``
   (likely unjudged positives). sentence-transformers drops it when score > p * (1 -
   ``relative_margin``): the same for p >= 0, but for a negative p (a cross-encoder's logits
   often are) its threshold lies *above* p, so it keeps candidates scored as high as the
   positive or higher, the very ones the margin is there to drop. With |p| the threshold is
   below p whatever p's sign: a kept negative scores at least ``relative_margin`` x |p|
   below the positive;
3. the first ``skip_top`` of the remaining candidates are skipped (sentence-transformers'
   ``range_min``, after the filters as there);
4. each positive takes ``training_data.negatives`` of the rest: the highest scored
   (``sampling: top``) or drawn uniformly with the training set's seed (``random``).

The positives are those the un-mined set has (judged relevant and in the first stage's top
``train_depth``), so a mined set and a BM25 set of one size and seed differ only in their
negatives. Every row keeps the miner's scores of its positive and negatives
(``positive_score``, ``negative_score``, ``negative_scores``): the teacher margins of
:class:`workloads.losses.margin_mse.MarginMSE`.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from workloads.core.errors import InputError
from workloads.evaluation.ranking import trec_eval_order

Run = dict[str, dict[str, float]]
SAMPLINGS = ("random", "top")


@dataclass(frozen=True)
class MiningOptions:
    depth: int = 100
    skip_top: int = 0
    absolute_margin: float | None = None
    relative_margin: float | None = None
    sampling: str = "random"

    def __post_init__(self) -> None:
        if self.depth < 1 or self.skip_top < 0:
            raise ValueError(f"mining needs depth >= 1 and skip_top >= 0, got {self.depth} and {self.skip_top}")
        if self.sampling not in SAMPLINGS:
            raise ValueError(f"unknown sampling '{self.sampling}' (choose from {', '.join(SAMPLINGS)})")

    @classmethod
    def of(cls, spec) -> MiningOptions:
        """The options of a ``training_data.mining`` spec."""
        return cls(spec.depth, spec.skip_top, spec.absolute_margin, spec.relative_margin, spec.sampling)


def negative_pool(candidates: dict[str, float], positive_scores: dict[str, float], relevant: set[str],
                  options: MiningOptions) -> list[tuple[str, float]]:
    """The (document, score) a query's negatives are chosen from, best first (steps 1-3 of the module doc)."""
    ranked = [(d, s) for d, s in trec_eval_order(candidates) if d not in relevant]
    pool = ranked[:options.depth]
    if positive_scores and (options.absolute_margin is not None or options.relative_margin is not None):
        hardest = min(positive_scores.values())
        if options.absolute_margin is not None:
            pool = [(d, s) for d, s in pool if s + options.absolute_margin <= hardest]
        if options.relative_margin is not None:  # |p|, not sentence-transformers' p (1 - r): see step 2 above
            pool = [(d, s) for d, s in pool if s <= hardest - abs(hardest) * options.relative_margin]
    return pool[options.skip_top:]


def choose_negatives(pool: list[tuple[str, float]], count: int, sampling: str, rng: random.Random) -> list[tuple[str, float]]:
    """``count`` of the pool (all when it has fewer): its head, or a uniform draw (in drawn order)."""
    if sampling == "top":
        return pool[:count]
    if count == 1:  # one negative: rng.choice, as un-mined training sets draw it
        return [rng.choice(pool)] if pool else []
    return rng.sample(pool, min(count, len(pool)))


class Miner(Protocol):
    """Scores a chunk of training queries' candidates and positives."""

    key: str  # its identity, keyed into the training set's

    def score(self, queries: dict[str, str], rankings: Run, positives: dict[str, list[str]]) -> dict[str, tuple[dict, dict]]:
        """query id -> (candidate doc -> score, positive doc -> score)."""
        ...


@dataclass(frozen=True)
class MinerMethod:
    """One ``training_data.mining.method``: how its miner is built and the trials it reads first."""

    name: str
    build: Callable[[Any, Any, MiningOptions], Miner]  # (mining spec, collection, options) -> a Miner
    requires: Callable[[Any], list] = lambda spec: []   # trial specs (of any kind) that must be finished first
    # what is wrong with a mining spec's run / model for this method (None: nothing), said at validation
    check: Callable[[Any], str | None] = lambda spec: None
    # what a reading trial's key holds in place of the file in ``run`` (a moved file is the same
    # trial, an edited one another); None: nothing
    identity: Callable[[Any], str | None] = lambda spec: None
    # raises the InputError of what would stop its miner, found offline (the dry run lists it)
    preflight: Callable[[Any], None] = lambda spec: None


MINERS: dict[str, MinerMethod] = {}


def register_miner(method: MinerMethod) -> None:
    MINERS[method.name] = method


def build_miner(spec, collection) -> Miner:
    """The miner of a ``training_data.mining`` spec (``method``, ``run``/``model`` and the options)."""
    method = MINERS.get(spec.method)
    if method is None:
        raise InputError("training_data.mining.method", f"unknown method '{spec.method}' (choose from {', '.join(sorted(MINERS))})")
    return method.build(spec, collection, MiningOptions.of(spec))


def mining_requires(spec) -> list:
    """The trials a mining spec reads (trained first), if any."""
    return [] if spec is None or spec.method not in MINERS else MINERS[spec.method].requires(spec)


__all__ = ["MINERS", "Miner", "MinerMethod", "MiningOptions", "SAMPLINGS", "build_miner", "choose_negatives",
           "mining_requires", "negative_pool", "register_miner"]
