"""Query expansion for EAR (expand, rerank the expansions, retrieve): where expansions come from
(:mod:`~workloads.kinds.ear.sources`), BM25 with each of them and the labels EAR learns from
(:mod:`~workloads.kinds.ear.retrieval`), and its loss (:mod:`~workloads.kinds.ear.loss`)."""
