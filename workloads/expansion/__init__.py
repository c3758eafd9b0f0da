"""Query expansion for EAR (expand, rerank the expansions, retrieve): where expansions come from
(:mod:`~workloads.expansion.sources`), BM25 with each of them and the labels EAR learns from
(:mod:`~workloads.expansion.retrieval`), and its loss (:mod:`~workloads.expansion.loss`)."""
