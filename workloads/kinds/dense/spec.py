"""The dense trial: its typed spec, its searched parameters, its identity, where a trained one is kept.

A dense trial (``kind: dense`` in a trial file) trains a bi-encoder
(:class:`workloads.kinds.dense.encoder.BiEncoder`) with an in-batch contrastive loss
(temperature; BM25 hard negatives from the first stage, or in-batch negatives only) and,
with ``objective: diffcse``, DiffCSE's conditional replaced-token detection (``rtd_lambda``,
``masking_ratio``, a frozen ``generator``). ``objective: contrastive`` is DPR with queries and
SimCSE with ``unsupervised: true`` (sentences of the corpus, dropout positives). Its test is
retrieval: exact search over the encoded test corpus (nDCG@10, R@100), against BM25 on the
same queries. Its kept result, in ``<cache>/dense/<key>/`` (:func:`dense_dir`), is the chosen
encoder (the training-time pooler and discriminator dropped), what a dense first stage loads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from workloads.core.paths import cache_dir, stable_key
from workloads.losses.base import Parameter
from workloads.spec import DataSpec, FirstStageSpec, ResourcesSpec, TrainingDataSpec, load_trial_file, one_line

KIND = "dense"
COMPLETE_MARKER = "dense_result.json"  # written last: a directory without it is not a trained dense trial
MODEL_DIR = "model"                    # the kept encoder (BiEncoder.save), inside dense_dir
OBJECTIVES = ("contrastive", "diffcse")
NEGATIVES = ("bm25", "in_batch")
FREQUENCY_GENERATOR = "frequency"
POOLERS = ("batchnorm_joint", "batchnorm_per_view", "linear_tanh", "none")  # objectives.POOLERS (no torch import here)
# DiffCSE's pooler as its authors feed it for diffcse; contrastive trials keep the pooler they had (and their keys)
DEFAULT_POOLERS = {"diffcse": "batchnorm_joint", "contrastive": "batchnorm_per_view"}
LATER_FIELDS = ("rtd_average", "gather")  # DenseSpec fields added after the first keys (keyed by dense_key apart)
FORMER_PER_VIEW_NAME = "mlp"  # batchnorm_per_view's name before issue 57: still read, and what the key writes for it

# The searched parameters, declared once (as the losses' are): the DenseSpec fields below are
# made from them, and a sweep's search space reads them (searchable: True).
LEARNING_RATE = Parameter(field="learning_rate", annotation=float, default=2e-5, gt=0, lt=1, searchable=True,
                          description="AdamW's peak learning rate (DiffCSE: 7e-6 for BERT-base on STS)")
TEMPERATURE = Parameter(field="temperature", annotation=float, default=0.05, gt=0, searchable=True,
                        description="tau of the in-batch contrastive loss over cosine similarities (SimCSE, DiffCSE: 0.05)")
RTD_LAMBDA = Parameter(field="rtd_lambda", annotation=float, default=0.005, ge=0, searchable=True,
                       description="diffcse: weight of the replaced-token-detection loss (0: plain contrastive; "
                                   "DiffCSE: 0.005 for STS)")
MASKING_RATIO = Parameter(field="masking_ratio", annotation=float, default=0.3, gt=0, lt=1, searchable=True,
                          description="diffcse: share of each text's tokens masked for the generator to fill (DiffCSE: 0.3)")
SEARCHED_PARAMETERS = (LEARNING_RATE, TEMPERATURE, RTD_LAMBDA, MASKING_RATIO)
RTD_PARAMETERS = ("rtd_lambda", "masking_ratio")  # read by objective diffcse only


def _field(parameter: Parameter):
    return Field(default=parameter.default, description=parameter.description, **parameter.bounds)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DenseModelSpec(_Strict):
    """The bi-encoder: any Hugging Face encoder, one shared tower or two."""

    name: str = Field(description="a Hugging Face id, a local path, or an alias such as minilm-l6")
    towers: Literal["shared", "separate"] = Field(
        default="shared", description="shared: queries and documents through one encoder (DiffCSE's DPR); separate: two "
                                      "towers started from the same weights (DPR)")
    pooling: Literal["cls", "mean"] | None = Field(
        default=None, description="the embedding: the first token or the mean over tokens; default: what a "
                                  "sentence-transformers checkpoint declares, else cls")
    query_max_length: int = Field(default=64, ge=8, le=8192, description="query tokens (truncated)")
    max_length: int = Field(default=256, ge=16, le=8192, description="document tokens (truncated: FirstP)")


class DenseSpec(_Strict):
    """How the bi-encoder is trained (DPR, SimCSE, DiffCSE)."""

    objective: Literal[OBJECTIVES] = Field(  # type: ignore[valid-type]
        default="contrastive", description="contrastive: in-batch InfoNCE (DPR; SimCSE when unsupervised); diffcse: plus "
                                           "rtd_lambda x conditional replaced-token detection")
    unsupervised: bool = Field(default=False, description="sentences of the corpus, each its own positive under another "
                                                          "dropout mask (SimCSE / DiffCSE sentence embeddings); no queries")
    negatives: Literal[NEGATIVES] | None = Field(  # type: ignore[valid-type]
        default=None, description="bm25: each query's training_data.negatives BM25 hard negatives join the in-batch "
                                  "ones; in_batch: the other rows' positives only; default: bm25 with queries, in_batch "
                                  "unsupervised")
    learning_rate: float = _field(LEARNING_RATE)
    temperature: float = _field(TEMPERATURE)
    rtd_lambda: float = _field(RTD_LAMBDA)
    masking_ratio: float = _field(MASKING_RATIO)
    generator: str = Field(
        default=FREQUENCY_GENERATOR, description="diffcse: who fills the masked tokens. 'frequency': a token drawn from the "
                                                 "training texts' token frequencies (offline; an ablation of an MLM); else a "
                                                 "masked-LM id or path (distilbert-base-uncased, the thesis's), frozen, argmax")
    pooler: Literal[POOLERS] = Field(  # type: ignore[valid-type]
        default="batchnorm_per_view",
        description="the training-time pooler, dropped at test: batchnorm_joint (DiffCSE's MLP with BatchNorm over every "
                    "view of the batch as one batch, on the raw embedding: the authors'; the default with objective "
                    "diffcse), batchnorm_per_view (the same MLP on each view separately, on the normalised embedding: "
                    "'SimCSE w/ BatchNorm' as run before; the default otherwise; 'mlp' is its former name), "
                    "linear_tanh (vanilla SimCSE's Linear + tanh on the raw embedding), none")
    rtd_average: Literal["padded", "real_tokens"] = Field(
        default="padded", description="diffcse: the RTD cross entropy's mean: padded, over every position of the padded "
                                      "batch, padding labelled 0 (the authors'; lambda as the thesis reports it); "
                                      "real_tokens, over real tokens only (the same weight takes lambda x (1 - padding "
                                      "share))")
    gather: bool = Field(default=True, description="with more than one worker (resources.workers), every worker's "
                                                    "embeddings join the in-batch negatives (SimCSE's all-gather, with "
                                                    "gradients for the local shard); false: each worker's own only")
    epochs: int = Field(default=1, ge=1)
    batch_size: int = Field(default=32, ge=2, description="rows (query or sentence) per step: the in-batch negatives")
    weight_decay: float = Field(default=0.01, ge=0)
    warmup_ratio: float = Field(default=0.1, ge=0, lt=1)
    max_grad_norm: float = Field(default=1.0, gt=0)
    patience: int | None = Field(default=None, ge=1, description="epochs without a better validation nDCG@10 before stopping")
    eval_batch_size: int = Field(default=64, ge=1)
    sentences_per_document: int = Field(default=3, ge=1, description="unsupervised: sentences taken from each drawn document")

    @model_validator(mode="before")
    @classmethod
    def _pooler_of_the_objective(cls, data):
        """An unset pooler is the objective's (:data:`DEFAULT_POOLERS`); ``mlp`` is ``batchnorm_per_view``'s former name."""
        if isinstance(data, dict):
            pooler = data.get("pooler")
            if pooler is None:
                objective = data.get("objective", "contrastive")
                data = {**data, "pooler": DEFAULT_POOLERS.get(objective, "batchnorm_per_view") if isinstance(objective, str)
                        else "batchnorm_per_view"}
            elif pooler == FORMER_PER_VIEW_NAME:
                data = {**data, "pooler": "batchnorm_per_view"}
        return data

    @model_validator(mode="after")
    def _coherent(self) -> DenseSpec:
        if self.objective != "diffcse":  # compared with the defaults, not the fields given: a dumped spec validates again
            fields = type(self).model_fields
            changed = [f for f in (*RTD_PARAMETERS, "generator", "rtd_average") if getattr(self, f) != fields[f].default]
            if changed:
                raise ValueError(f"{', '.join(changed)}: read by objective diffcse only (objective is {self.objective})")
        if self.unsupervised and self.negatives == "bm25":
            raise ValueError("unsupervised training has no queries, so no BM25 negatives: negatives must be in_batch")
        return self

    @property
    def hard_negatives(self) -> bool:
        return not self.unsupervised and self.negatives != "in_batch"


class DenseTrialSpec(_Strict):
    kind: Literal["dense"] = Field(default="dense", description="what the file is: a dense (bi-encoder) trial")
    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    seed: int = 13
    data: DataSpec
    first_stage: FirstStageSpec = Field(
        default=FirstStageSpec(), description="BM25: the hard negatives (train_depth), the validation candidates the "
                                              "encoder re-scores each epoch (validation_depth), the test baseline")
    training_data: TrainingDataSpec = Field(
        default=TrainingDataSpec(), description="supervised: size pairs of (query, positive, negatives) as a re-ranking "
                                                "trial draws them; unsupervised: size sentences of the corpus")
    model: DenseModelSpec
    dense: DenseSpec = DenseSpec()
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    resources: ResourcesSpec = ResourcesSpec()

    @model_validator(mode="after")
    def _supported(self) -> DenseTrialSpec:
        if self.first_stage.method not in ("bm25", "rm3", "run", "given", "scoreddocs"):
            raise ValueError(f"first_stage.method '{self.first_stage.method}': a dense trial draws its negatives and "
                             "validation candidates from a lexical or given first stage")
        if self.data.test_perturbation is not None or self.data.test_first_stage is not None:
            raise ValueError("a dense trial retrieves its test queries itself: data.test_perturbation and "
                             "data.test_first_stage belong to re-ranking trials")
        if self.training_data.size == "full" and self.dense.unsupervised:
            raise ValueError("unsupervised training draws training_data.size sentences: give a number")
        return self


def dense_key(spec: DenseTrialSpec) -> str:
    """What changes the kept encoder: everything but the name, the resources and the scoring batch."""
    keyed = spec
    if spec.dense.pooler == "batchnorm_per_view":  # under its former name: trials that train as before keep their keys
        keyed = spec.model_copy(update={"dense": spec.dense.model_copy(update={"pooler": FORMER_PER_VIEW_NAME})})
    # fields added after the first keys are keyed apart, and only where they are read: the others keep theirs
    payload = keyed.model_dump_json(exclude={"name": True, "resources": True, "dense": {"eval_batch_size", *LATER_FIELDS}},
                                    warnings=False)
    later = [f"rtd_average={spec.dense.rtd_average}"] if spec.dense.objective == "diffcse" else []
    if spec.resources.workers > 1 and spec.dense.gather:  # one worker: nothing to gather
        later.append("gather")
    return stable_key(KIND, payload, *later)


def dense_dir(spec: DenseTrialSpec) -> Path:
    return cache_dir() / "dense" / f"{spec.dense.objective}-{dense_key(spec)}"


def trained_dense(spec: DenseTrialSpec) -> Path | None:
    """The kept result's directory, or None when the trial has not finished."""
    path = dense_dir(spec)
    return path if (path / COMPLETE_MARKER).exists() else None


def load_dense_trial(path: str) -> DenseTrialSpec:
    """The dense trial of a one-trial file (a dense first stage's ``run``), one line on error."""
    return load_trial_file(path, DenseTrialSpec, KIND, "a dense")


__all__ = ["COMPLETE_MARKER", "MODEL_DIR", "SEARCHED_PARAMETERS", "DenseModelSpec", "DenseSpec", "DenseTrialSpec",
           "dense_dir", "dense_key", "load_dense_trial", "one_line", "trained_dense"]
