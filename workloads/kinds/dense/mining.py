"""The dense kind's miners: a dense encoder's top documents, or a kept cross-encoder's scores of the
first stage's (the selection steps and the registry: :mod:`workloads.retrieval.mining`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from workloads.core.errors import InputError
from workloads.evaluation.ranking import trec_eval_order
from workloads.retrieval.mining import MinerMethod, MiningOptions, Run, choose_negatives, negative_pool

NORMALISED_FOR_MINING = "mined-l2"  # keyed where an encoder that does not normalise mines


class DenseMiner:
    """Candidates: the encoder's own top ``depth`` over the corpus; positives scored by the same encoder.

    Scores are cosines: an encoder that does not normalise by its own declaration (a plain Hugging
    Face checkpoint, without a sentence-transformers ``Normalize`` module) is normalised for mining,
    as sentence-transformers' ``mine_hard_negatives`` always does, and keyed apart (``mined-l2``) from
    its raw inner products (what a dense first stage over it searches), as are the trials reading the set."""

    def __init__(self, collection, source: str, identity: str, options: MiningOptions, index: str = "auto"):
        from workloads.kinds.dense.encoder import declared_normalization

        self.collection, self.source, self.options, self.index = collection, source, options, index
        self.key = f"dense-{identity}" if declared_normalization(source) else f"dense-{identity}-{NORMALISED_FOR_MINING}"
        self._encoder = None

    @property
    def encoder(self):
        if self._encoder is None:
            from workloads.kinds.dense.encoder import BiEncoder
            from workloads.kinds.dense.first_stage import inference_device

            self._encoder = BiEncoder.from_pretrained(self.source, normalize=True).to(inference_device())
        return self._encoder

    def score(self, queries: dict[str, str], rankings: Run, positives: dict[str, list[str]]) -> dict[str, tuple[dict, dict]]:
        from workloads.kinds.dense.first_stage import PRECISION, retrieve_dense
        from workloads.retrieval.bm25 import read_trec_run

        identity = self.key.removeprefix("dense-")
        depth = self.options.depth + max((len(p) for p in positives.values()), default=0)  # room for the positives
        run = read_trec_run(retrieve_dense(self.collection, queries, depth, self.source, identity, self.index,
                                           encoder=self.encoder))
        with_positives = [q for q in queries if positives.get(q)]
        docs = [d for q in with_positives for d in positives[q]]
        embedded_queries = self.encoder.encode_queries([queries[q] for q in with_positives], precision=PRECISION)
        embedded_docs = self.encoder.encode_documents([self.collection.document(d).contents for d in docs], precision=PRECISION)
        positive_scores: dict[str, dict[str, float]] = {}
        row = 0
        for query_row, qid in enumerate(with_positives):
            for doc in positives[qid]:
                positive_scores.setdefault(qid, {})[doc] = float(embedded_docs[row] @ embedded_queries[query_row])
                row += 1
        return {qid: (run.get(qid, {}), positive_scores.get(qid, {})) for qid in queries}


class CrossEncoderMiner:
    """Candidates: the first stage's top ``depth``, re-scored (with the positives) by a kept cross-encoder."""

    def __init__(self, collection, checkpoint: str, identity: str, options: MiningOptions, batch_size: int = 64):
        self.collection, self.checkpoint, self.options, self.batch_size = collection, checkpoint, options, batch_size
        self.key = f"cross-encoder-{identity}"
        self._model = None

    def score(self, queries: dict[str, str], rankings: Run, positives: dict[str, list[str]]) -> dict[str, tuple[dict, dict]]:
        from workloads.kinds.dense.first_stage import inference_device
        from workloads.models.cross_encoder import CrossEncoder, score_pairs

        if self._model is None:
            self._model = CrossEncoder.from_pretrained(self.checkpoint).to(inference_device())
        pairs: list[tuple[str, str, bool]] = []
        for qid in queries:
            top = trec_eval_order(rankings.get(qid, {}))[:self.options.depth]
            pairs += [(qid, d, False) for d, _ in top] + [(qid, d, True) for d in positives.get(qid, [])]
        scores = score_pairs(self._model, [queries[q] for q, _, _ in pairs],
                             [self.collection.document(d).contents for _, d, _ in pairs], batch_size=self.batch_size,
                             precision="fp32")
        out: dict[str, tuple[dict, dict]] = {qid: ({}, {}) for qid in queries}
        for (qid, doc, is_positive), score in zip(pairs, scores):
            out[qid][1 if is_positive else 0][doc] = float(score)
        return out


@dataclass(frozen=True)
class _EncoderChoice:  # what encoder_source reads of a first stage
    run: str | None
    model: str | None
    method: str = "dense"


def _dense_miner(spec, collection, options: MiningOptions) -> DenseMiner:
    from workloads.kinds.dense.first_stage import encoder_source  # noqa: PLC0415  (first_stage imports faiss lazily too)

    source, identity = encoder_source(_EncoderChoice(spec.run, spec.model))
    return DenseMiner(collection, source, identity, options)


def _cross_encoder_miner(spec, collection, options: MiningOptions) -> CrossEncoderMiner:
    from workloads.kinds.dense.first_stage import model_files_identity  # noqa: PLC0415  (as above)

    _cross_encoder_checkpoint(spec)
    return CrossEncoderMiner(collection, str(Path(spec.model).expanduser()), model_files_identity(spec.model), options)


def _cross_encoder_checkpoint(spec) -> None:
    if not spec.model or not Path(spec.model).expanduser().is_dir():
        raise InputError("training_data.mining.model", f"'{spec.model}': give a kept cross-encoder's checkpoint directory")


def _dense_requires(spec) -> list:
    """The dense trial whose kept encoder mines (trained first), if the spec names one."""
    if not spec.run:
        return []
    from workloads.kinds.dense.spec import load_dense_trial  # noqa: PLC0415  (as above)

    return [load_dense_trial(spec.run)]


def _dense_check(spec) -> str | None:
    return "needs one of run (a dense trial file) or model (an encoder)" if bool(spec.run) == bool(spec.model) else None


def _cross_encoder_check(spec) -> str | None:
    return "needs model (a kept cross-encoder's checkpoint directory), not run" if spec.run or not spec.model else None


def _dense_identity(spec) -> str | None:
    """The mining dense trial's key in place of its file's path (as the dense first stage's); for an
    encoder that declares no normalisation, that it is mined by cosine since issue 57 (so the reading
    trials' keys move with their negatives); else nothing (their keys stay)."""
    from workloads.kinds.dense.encoder import declared_normalization  # noqa: PLC0415  (as above)
    from workloads.kinds.dense.first_stage import dense_identity  # noqa: PLC0415  (as above)

    if spec.run:
        return dense_identity(_EncoderChoice(spec.run, spec.model))
    return None if not spec.model or declared_normalization(spec.model) else NORMALISED_FOR_MINING


DENSE_MINER = MinerMethod("dense", build=_dense_miner, requires=_dense_requires, check=_dense_check, identity=_dense_identity)
CROSS_ENCODER_MINER = MinerMethod("cross_encoder", build=_cross_encoder_miner, check=_cross_encoder_check,
                                  preflight=_cross_encoder_checkpoint)

__all__ = ["CROSS_ENCODER_MINER", "CrossEncoderMiner", "DENSE_MINER", "DenseMiner", "MiningOptions", "choose_negatives",
           "negative_pool"]
