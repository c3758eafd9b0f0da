"""Supervised sentence selectors (AUG's ``linear`` and ``attention``; docs/guide/augmentation.md).

``SELECTORS`` is the registry (method name -> module scoring every sentence of a document
for a query). A selector is trained as its own trial kind with a cross-encoder ranker
(:mod:`workloads.kinds.selector.train`, select-and-rank) and then scores sentences for
augmentation (``workloads.kinds.rerank.augmentation.scorers``).
"""

from workloads.kinds.selector.attention import AttentionSelector
from workloads.kinds.selector.linear import LinearSelector
from workloads.kinds.selector.subset import relaxed_topk, topk_mask

SELECTORS = {LinearSelector.name: LinearSelector, AttentionSelector.name: AttentionSelector}

__all__ = ["SELECTORS", "LinearSelector", "AttentionSelector", "relaxed_topk", "topk_mask"]
