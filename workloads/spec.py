"""The typed trial spec: what the orchestrator hands a workload.

Validated at the edge (``orchestrator.core.config`` loads YAML into these models); inside the
data plane every field is already checked. Unknown keys are errors, not ignored.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, field_validator, model_validator

from workloads.augmentation.scorers import SCORERS, SUPERVISED_METHODS
from workloads.batching import BATCHINGS
from workloads.losses import (
    CONTRASTIVE_LOSSES,
    CONTRASTIVE_PARAMETERS,
    PARAMETERS,
    RANKING_LOSSES,
    RANKING_PARAMETERS,
    WEIGHTING_PARAMETERS,
    loss_parameters,
    needs_augmentation,
)
from workloads.perturbations import PERTURBATIONS
from workloads.selectors.spec import SelectorSpec

PERTURBATION_NAMES = tuple(PERTURBATIONS)

FIXED_SIZES = (100, 1_000, 2_000, 10_000, 100_000)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


RM3_FIELDS = ("fb_terms", "fb_docs", "original_query_weight")  # first_stage fields of method rm3 only


class ExpansionSpec(_Strict):
    """Where a query's expansions come from (EAR's first step; ``workloads.expansion.sources``)."""

    source: Literal["pseudo_relevance", "generator", "file"] = Field(
        default="pseudo_relevance", description="pseudo_relevance: sentences, titles and term samples of the query's "
                                                "BM25 top documents, drawn at random; generator: sampled from a Hugging "
                                                "Face seq2seq or causal model; file: a JSONL of query_id, expansion")
    n: int = Field(default=20, ge=1, le=200, description="expansions per query")
    seed: int = Field(default=0, description="the draws (pseudo_relevance) are a function of it")
    path: str | None = Field(default=None, description="file: the JSONL file ({query_id, expansion} per line)")
    feedback_docs: int = Field(default=10, ge=1, description="pseudo_relevance: BM25's top documents drawn from")
    terms: int = Field(default=10, ge=1, description="pseudo_relevance: terms in one term-sample expansion")
    model: str | None = Field(default=None, description="generator: a Hugging Face model id or directory "
                                                        "(seq2seq, e.g. a GAR generator or T0, or causal)")
    prompt: str = Field(default="{query}", description="generator: its input, {query} replaced by the query's text")
    temperature: float = Field(default=1.0, gt=0, description="generator: the sampling temperature")
    max_new_tokens: int = Field(default=32, ge=1, description="generator: the longest expansion, in tokens")

    @model_validator(mode="after")
    def _source_options(self) -> ExpansionSpec:
        if self.source == "file" and not self.path:
            raise ValueError("source 'file' needs path (a JSONL of query_id, expansion)")
        if self.source != "file" and self.path:
            raise ValueError(f"path has no effect with source '{self.source}'")
        if self.source == "generator" and not self.model:
            raise ValueError("source 'generator' needs model (a Hugging Face id or directory)")
        defaults = {name: field.default for name, field in type(self).model_fields.items()}
        sampling = [f for f in ("model", "prompt", "temperature", "max_new_tokens") if getattr(self, f) != defaults[f]]
        if self.source != "generator" and sampling:
            raise ValueError(f"{', '.join(sampling)} belong to source 'generator', not '{self.source}'")
        if "{query}" not in self.prompt:
            raise ValueError("prompt must contain {query}")
        return self


class FirstStageSpec(_Strict):
    """Where candidates and training negatives come from (``workloads.retrieval.first_stage``)."""

    method: Literal["bm25", "rm3", "given", "run", "scoreddocs", "ear"] = Field(
        default="bm25", description="bm25: Pyserini BM25; rm3: BM25 with RM3 query expansion (Pyserini's set_rm3); "
                                    "given: the collection's own candidate lists (WikiQA); "
                                    "run: a TREC run file (path); scoreddocs: the run an ir_datasets collection ships "
                                    "(MS MARCO document's official top-100); ear: what an EAR trial retrieved with "
                                    "each query's chosen expansion (run: its trial file; trained first if it is not)")
    path: str | None = Field(default=None, description="run: the TREC run file ranking train, validation and test queries")
    run: str | None = Field(default=None, description="ear: the EAR trial file (kind: ear) on the same data")
    k1: float = Field(default=0.9, gt=0)
    b: float = Field(default=0.4, ge=0, le=1)
    index: str = Field(
        default="build", min_length=1,
        description="bm25: build (index the corpus here, once per content), prebuilt (Pyserini's prebuilt index of "
                    "the collection: msmarco-v1-doc for msmarco-document, beir-v1.0.0-<name>.flat for beir/<name>; "
                    "downloaded once), or the name of a Pyserini prebuilt index; rm3: the same (a prebuilt index "
                    "must store document vectors)")
    fb_terms: int = Field(default=10, ge=1, le=1000, description="rm3: expansion terms added to the query (at most 1000: "
                                                                 "Lucene's 1024 clauses per query hold them and the query's own)")
    fb_docs: int = Field(default=10, ge=1, description="rm3: top BM25 documents the relevance model is estimated on")
    original_query_weight: float = Field(default=0.5, ge=0, le=1, description="rm3: the original query's weight")
    train_depth: int = Field(default=100, ge=2, description="top-k of training queries that negatives are drawn from")
    validation_depth: int = Field(default=100, ge=1, description="top-k re-ranked for validation")
    test_depth: int = Field(default=100, ge=1, description="top-k re-ranked for test (100, as the method specifies)")

    @model_validator(mode="after")
    def _method_options(self) -> FirstStageSpec:
        if self.method == "run" and not self.path:
            raise ValueError("method 'run' needs path (a TREC run file)")
        if self.method != "run" and self.path:
            raise ValueError(f"path has no effect with method '{self.method}'")
        if self.method == "ear" and not self.run:
            raise ValueError("method 'ear' needs run (an EAR trial file, kind: ear)")
        if self.method != "ear" and self.run:
            raise ValueError(f"run (an EAR trial file) has no effect with method '{self.method}'")
        defaults = {name: field.default for name, field in type(self).model_fields.items()}
        searches = self.method in ("bm25", "rm3")
        if not searches and (self.k1, self.b) != (defaults["k1"], defaults["b"]):
            raise ValueError(f"k1 and b belong to bm25 and rm3, not to method '{self.method}'")
        if not searches and self.index != "build":
            raise ValueError(f"index belongs to bm25 and rm3, not to method '{self.method}'")
        feedback = [f for f in RM3_FIELDS if getattr(self, f) != defaults[f]]
        if self.method != "rm3" and feedback:
            raise ValueError(f"{', '.join(feedback)} belong to rm3, not to method '{self.method}'")
        if "/" in self.index:  # a path would key runs by its name only, whatever it holds
            raise ValueError(f"index '{self.index}': give build, prebuilt or a Pyserini prebuilt index's name, not a path")
        return self


class DataSpec(_Strict):
    collection: str = Field(description="collection reference: beir/<name>, a directory, or an ir_datasets id")
    train_split: str = "train"
    validation_split: str | None = Field(
        default=None, description="a split of the collection; None carves validation queries from train_split"
    )
    validation_queries: int = Field(default=50, ge=5, description="queries carved from train_split when no validation split")
    validation_cap: int | None = Field(
        default=None, ge=5, description="validate on at most this many queries of validation_split, drawn with a fixed "
                                        "seed (the same queries in every trial): validation re-ranks every query's "
                                        "candidates after every epoch, so a large dev set (MS MARCO's 5,193) costs most "
                                        "of a trial; default: the whole split")
    test_split: str = "test"
    test_collection: str | None = Field(default=None, description="test on another collection (zero-shot); default: the same")
    test_first_stage: FirstStageSpec | None = Field(
        default=None, description="the test collection's own first stage (default: first_stage), e.g. bm25 for a "
                                  "zero-shot collection without given lists")
    test_perturbation: Literal[PERTURBATION_NAMES] | None = Field(  # type: ignore[valid-type]
        default=None, description="test on the test queries perturbed this way, those that have a variant (CFT); "
                                  "set per evaluation target by `robustness`")

    @model_validator(mode="after")
    def _splits_apart(self) -> DataSpec:
        """Training or choosing on the test split would report a number measured on seen data."""
        if self.validation_cap is not None and self.validation_split is None:
            raise ValueError("validation_cap caps a validation_split: without one, validation_queries says how many "
                             "training queries are carved")
        if self.validation_split is not None and self.validation_split == self.train_split:
            raise ValueError(f"validation_split and train_split are both '{self.train_split}': validation must be held out "
                             "(leave validation_split unset to carve validation queries from train)")
        if self.test_collection in (None, self.collection):
            if self.train_split == self.test_split:
                raise ValueError(f"train_split and test_split are both '{self.test_split}' on one collection")
            if self.validation_split == self.test_split:
                raise ValueError(f"validation_split and test_split are both '{self.test_split}' on one collection: "
                                 "the model would be chosen on its test queries")
        return self


class RerankingSpec(_Strict):
    """How the cross-encoder's scores become the final ranking (see workloads.reranking)."""

    interpolation: Literal["none", "tuned"] | float = Field(
        default="none",
        description="none: the cross-encoder's order (the method's); tuned: w * CE + (1 - w) * first stage, "
                    "w chosen per epoch on validation; a number: that fixed w",
    )

    @field_validator("interpolation", mode="before")
    @classmethod
    def _setting(cls, value: object) -> object:
        if value in ("none", "tuned"):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value <= 1:
            return float(value)
        raise ValueError(f"must be 'none', 'tuned' or a weight in [0, 1], got {value!r}")


class TrainingDataSpec(_Strict):
    # declared first so that size's check can read it (a default 1 is left out of trial keys)
    negatives: int = Field(default=1, ge=1, description="negatives per positive, drawn without replacement from the query's "
                                                        "first-stage list (a query with fewer gives all it has)")
    size: int | Literal["full"] = Field(
        default=1_000, description="query-document pairs: N/2 triples (AUG section 6.3); N/(1 + negatives) rows")
    seed: int = 13
    queries: Literal["all", "as_needed"] = Field(
        default="all", description="all: every training query with a judged-relevant document is retrieved and their triples "
                                   "shuffled together (every earlier set); as_needed: those queries in a seeded order, retrieved "
                                   "in chunks (256 doubling to 16,384) until the set is full (far fewer on MS MARCO; other rows "
                                   "than all's)")

    @field_validator("size")
    @classmethod
    def _whole_rows(cls, size: int | str, info) -> int | str:
        negatives = info.data.get("negatives", 1)
        per_row = 1 + negatives
        if size != "full" and (size < per_row or size % per_row):
            if per_row == 2:
                raise ValueError(f"size must be an even number of pairs >= 2 or 'full', got {size}")
            raise ValueError(f"size must be a multiple of {per_row} pairs (1 positive + {negatives} negatives per row) "
                             f"or 'full', got {size}")
        return size


class ModelSpec(_Strict):
    name: str = Field(description="a Hugging Face id, a local path, or an alias such as minilm-l6")
    max_length: int = Field(default=512, ge=16, le=8192, description="tokens of [CLS] q [SEP] d [SEP]; documents truncated (FirstP)")
    pooling: Literal["cls", "mean"] = Field(default="cls", description="Phi: the first token (the method's) or the mean over tokens")


RankingName = Literal[tuple(RANKING_LOSSES)]  # type: ignore[valid-type]  # the registry's names
ContrastiveName = Literal[("none", *CONTRASTIVE_LOSSES)]  # type: ignore[valid-type]
WeightingName = Literal[tuple(WEIGHTING_PARAMETERS)]  # type: ignore[valid-type]

# LossSpec's fields: the names of the losses and of their combination, each followed by the
# hyper-parameters it brings, generated from the losses' declarations (``workloads.losses``,
# ``Parameter``). The order is the one trial keys have hashed since trials were first keyed:
# lambda (the fixed weighting's, AUG eq. 31) right after contrastive, the other weightings'
# parameters after weighting.
_LOSS_NAMES = {"ranking": (RankingName, "pointwise"), "contrastive": (ContrastiveName, "none"),
               "weighting": (WeightingName, "fixed")}
_LOSS_LAYOUT = ("ranking", *RANKING_PARAMETERS, "contrastive", *WEIGHTING_PARAMETERS["fixed"], *CONTRASTIVE_PARAMETERS,
                "weighting", *(f for weighting, fields in WEIGHTING_PARAMETERS.items() if weighting != "fixed" for f in fields))
_LossFields = create_model(  # type: ignore[call-overload]
    "_LossFields", __base__=_Strict, __module__=__name__,
    **{name: _LOSS_NAMES.get(name) or (PARAMETERS[name].annotation, Field(
        default=PARAMETERS[name].default, alias=PARAMETERS[name].alias, description=PARAMETERS[name].description,
        **PARAMETERS[name].bounds)) for name in dict.fromkeys(_LOSS_LAYOUT)})


class LossSpec(_LossFields):  # type: ignore[misc, valid-type]
    """L = (1 - lambda) L_rank + lambda L_con (AUG eq. 31), or CFT's equal / DWA weights.

    The hyper-parameter fields are generated from the losses' own declarations
    (``workloads.losses``): a new loss's parameters appear here with their types, defaults,
    bounds and descriptions. A non-default value of a field the chosen losses do not read is
    an error.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @model_validator(mode="after")
    def _coherent(self) -> LossSpec:
        if self.weighting != "fixed" and self.contrastive == "none":
            raise ValueError(f"weighting '{self.weighting}' combines two losses: set a contrastive loss")
        allowed = set(loss_parameters(self))
        for name in LOSS_HYPERPARAMETERS:
            # A non-default value that nothing reads is a mistake in the config; defaults pass,
            # so a dumped spec validates again.
            if name not in allowed and getattr(self, name) != type(self).model_fields[name].default:
                shown = PARAMETERS[name].shown
                raise ValueError(f"'{shown}' has no effect with ranking '{self.ranking}', contrastive "
                                 f"'{self.contrastive}' and weighting '{self.weighting}'")
        return self


# Every hyper-parameter field of LossSpec (the rest name the losses and their combination).
LOSS_HYPERPARAMETERS = tuple(f for f in LossSpec.model_fields if f not in ("ranking", "contrastive", "weighting"))


AugmentationMethod = Literal[("none", *SCORERS)]  # type: ignore[valid-type]  # the scorer registry's names


class AugmentationSpec(_Strict):
    """AUG Algorithm 1: each (q, d+, d-) gains (q, d+_a, d-_a); the batch doubles."""

    method: AugmentationMethod = "none"
    k: int = Field(default=3, ge=1, description="k_a: sentences kept from d+, ordered by score")
    seed: int = 13
    glove_path: str | None = Field(
        default=None, description="GloVe text file (.txt or .txt.gz); relative paths resolve against $ORCHESTRATE_DATA_DIR")
    redraw: Literal["epoch", "once"] = Field(
        default="epoch",
        description="epoch: d-_a (and the random scorer's sentences) drawn anew every epoch, seeded (AUG Algorithm 1 "
                    "draws per batch); once: one draw for all epochs")

    selector: SelectorSpec | None = Field(
        default=None, description="linear/attention: the selector and its training (defaults when left out)")

    @model_validator(mode="before")
    @classmethod
    def _supervised_default(cls, data: object) -> object:
        if isinstance(data, dict) and data.get("method") in SUPERVISED_METHODS and data.get("selector") is None:
            return {**data, "selector": {}}
        return data

    @model_validator(mode="after")
    def _glove_needs_vectors(self) -> AugmentationSpec:
        if self.selector is not None and self.method not in SUPERVISED_METHODS:
            raise ValueError(f"selector has no effect with method '{self.method}' (only {', '.join(SUPERVISED_METHODS)})")
        if self.method == "glove" and not self.glove_path:
            raise ValueError("method 'glove' needs glove_path (e.g. glove/glove.6B.50d.top100k.txt.gz)")
        if self.method != "glove" and self.glove_path:
            raise ValueError(f"glove_path has no effect with method '{self.method}'")
        return self


class CheckpointEvery(_Strict):
    """How often a trial saves its state inside an epoch: ``{steps: 500}`` or ``{minutes: 15}``."""

    steps: int | None = Field(default=None, ge=1, description="optimizer steps between checkpoints")
    minutes: float | None = Field(default=None, gt=0, description="minutes of training between checkpoints")

    @model_validator(mode="after")
    def _one_of(self) -> CheckpointEvery:
        if (self.steps is None) == (self.minutes is None):
            raise ValueError("give one of steps or minutes, e.g. {steps: 500} or {minutes: 15}")
        return self


COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")  # torch.compile modes that record CUDA graphs


class CompileSpec(_Strict):
    """``optimization.compile`` as a mapping: how ``torch.compile`` builds the encoder
    (``workloads.models.cross_encoder.compile_encoder``). ``{}`` is ``compile: true``."""

    mode: Literal[COMPILE_MODES] = Field(  # type: ignore[valid-type]
        default="default", description="torch.compile's mode: reduce-overhead records CUDA graphs (one replay per step "
                                       "instead of a launch per kernel; needs dynamic: false)")
    dynamic: bool = Field(
        default=True, description="true: one graph for every batch length (each batch padded to its longest pair); false: "
                                  "fixed shapes: every batch padded to model.max_length, and a batch whose pairs all fill it "
                                  "runs without an attention mask (SDPA keeps its flash kernels); dropout then draws from "
                                  "the compiled code's own stream, so the numbers differ from eager by more than rounding")

    @model_validator(mode="after")
    def _graphs_need_fixed_shapes(self) -> CompileSpec:
        if self.mode in CUDA_GRAPH_MODES and self.dynamic:
            raise ValueError(f"mode {self.mode} records CUDA graphs, which need fixed shapes: set dynamic: false")
        return self


class OptimizationSpec(_Strict):
    epochs: int = Field(default=1, ge=1)
    batching: Literal[BATCHINGS] = Field(  # type: ignore[valid-type]
        default="triples", description="triples (AUG); per_query: whole lists of 1 positive + n negatives (MHL, listwise); "
                                       "cft: one list + positives of other queries (CFT's contrastive batches)")
    batch_size: int = Field(default=16, ge=2, description="query-document pairs per step, before augmentation")
    learning_rate: float = Field(default=1e-4, gt=0, lt=1)
    weight_decay: float = Field(default=0.01, ge=0)
    warmup_ratio: float = Field(default=0.1, ge=0, lt=1)
    max_grad_norm: float = Field(default=1.0, gt=0)
    precision: Literal["auto", "fp32", "bf16", "fp16"] = Field(
        default="auto", description="auto: bf16 on GPUs that have it, else fp16 on GPU; on CPU bf16 where the CPU has "
                                    "native bf16 (AVX512-BF16, AMX, Arm BF16), else fp32"
    )
    eval_batch_size: int = Field(default=64, ge=1)
    cft_positives: int = Field(default=16, ge=2, description="cft: positives per batch, of distinct queries (CFT: 16)")
    gradient_checkpointing: bool = Field(default=False, description="recompute activations in backward: less memory for "
                                                                    "large blocks, more compute")
    length_bucketing: bool = Field(default=False, description="batches of rows of similar length (sorted within "
                                                               "windows of 50 batches, batches shuffled): less padding; "
                                                               "every row once per epoch, seeded")
    early_stopping_patience: int | None = Field(
        default=None, ge=1, description="stop after this many epochs without a better validation nDCG@10 (the chosen "
                                        "epoch is still the best one); default: every epoch runs")
    compile: bool | CompileSpec = Field(
        default=False, description="torch.compile the encoder (inductor) for training and validation; true: dynamic "
                                   "shapes, same numbers as eager up to rounding; {mode: reduce-overhead, dynamic: false}: "
                                   "fixed shapes and CUDA graphs (see CompileSpec); compiling adds 20-75 s per trial, "
                                   "and on a 2-core CPU steps ran slower than eager: meant for GPUs")
    gradient_accumulation: int = Field(
        default=1, ge=1, description="batches per optimizer step: their gradients add up (each loss divided by their "
                                     "number), so k batches of batch_size make one step of k x batch_size pairs where "
                                     "the loss is a mean; the schedule, clipping and steps count optimizer steps (CFT: 8)")
    checkpoint_every: CheckpointEvery | None = Field(
        default=None, description="also save the training state inside an epoch, every so many optimizer steps or "
                                  "minutes, with the data position: a trial whose node goes (a preempted spot node) "
                                  "resumes at the next batch instead of the epoch's start; resumed from either, it ends "
                                  "with the weights an uninterrupted trial has (bit for bit on CPU). Default: a "
                                  "checkpoint per epoch, and an in-epoch save when AWS announces a spot interruption")
    micro_batch_size: int | None = Field(
        default=None, ge=1, description="pairs per forward within a step (GradCache: scores first without gradients, "
                                        "then each micro-batch again with the loss's gradient): a block of any size fits, "
                                        "for about one more forward; the step's gradient is unchanged (dropout masks are "
                                        "drawn per micro-batch)")

    @field_validator("compile", mode="before")
    @classmethod
    def _compile_mapping(cls, value: object) -> object:
        if isinstance(value, str):
            raise ValueError(f"give true, false or a mapping such as {{mode: reduce-overhead, dynamic: false}}, not '{value}'")
        if not isinstance(value, dict):
            return value
        try:  # the mapping's own message, not the union's "should be a valid boolean"
            chosen = CompileSpec.model_validate(value)
        except ValidationError as exc:
            error = exc.errors()[0]
            where = ".".join(str(part) for part in error["loc"])
            raise ValueError(f"{where + ': ' if where else ''}{error['msg'].removeprefix('Value error, ')}") from None
        # {} is compile: true (and keys as it: a trial compiled before the mapping existed keeps its identity)
        return True if chosen == CompileSpec() else chosen

    @property
    def compile_options(self) -> dict | None:
        """``compile_encoder``'s keywords (mode, dynamic), or None when not compiled."""
        if not self.compile:
            return None
        chosen = self.compile if isinstance(self.compile, CompileSpec) else CompileSpec()
        return {"mode": chosen.mode, "dynamic": chosen.dynamic}

    @model_validator(mode="after")
    def _cft_positives_where_read(self) -> OptimizationSpec:
        # a non-default value nothing reads is a mistake; defaults pass, so a dumped spec validates again
        if self.batching != "cft" and self.cft_positives != type(self).model_fields["cft_positives"].default:
            raise ValueError(f"cft_positives has no effect with batching '{self.batching}'")
        if self.batching == "cft" and self.length_bucketing:
            raise ValueError("length_bucketing does not apply to cft batches (their positives come from other queries)")
        return self

    @field_validator("batch_size")
    @classmethod
    def _even_for_triples(cls, batch_size: int, info) -> int:
        if info.data.get("batching", "triples") == "triples" and batch_size % 2:
            raise ValueError(f"batch_size counts pairs and holds whole (positive, negative) triples: must be even, got {batch_size}")
        return batch_size

    def check_batch(self, negatives: int) -> None:
        """batch_size holds whole rows of the chosen batching (``negatives`` per positive)."""
        if self.batching == "triples":
            if negatives != 1:
                raise ValueError(f"training_data.negatives {negatives} needs batching per_query or cft (triples hold one)")
        elif self.batching == "per_query" and self.batch_size % (1 + negatives):
            raise ValueError(f"batching per_query: batch_size {self.batch_size} must be a multiple of 1 + {negatives} "
                             "(whole lists of 1 positive + training_data.negatives)")
        elif self.batching == "cft" and self.batch_size != self.cft_positives + negatives:
            raise ValueError(f"batching cft: batch_size must be cft_positives + training_data.negatives = "
                             f"{self.cft_positives + negatives}, got {self.batch_size}")


STAGED_VARIANTS = ("v1", "v2")  # a compressor per level, trained stage by stage


class SIRSpec(_Strict):
    """The SIR curriculum (``workloads.sir``, docs/guide/sir.md) over blocks of
    ``training_data.negatives`` + 1 (``optimization.batching: per_query``)."""

    variant: Literal["v0", "v1", "v2", "v3", "v4"] = Field(
        description="v0: no compression (the control); v1: a compressor per level trained in stages, each from the "
                    "pretrained model, level i selecting offline for level i + 1; v2: as v1, level i + 1 starting from "
                    "level i's weights; v3: one network, a forward per level, L_1 + L_M; "
                    "v4: as v3 with conditional probabilities, sum of L_i")
    levels: list[int] = Field(default_factory=lambda: [48, 16], min_length=1,
                              description="sizes of the compressed levels, positive included (SIR: [48, 16] or [48, 16, 8])")
    selection: Literal["top", "random"] = Field(default="top", description="top: the hardest negatives (ties by position); "
                                                                           "random: the paper's ablation, seeded")
    cpr: Literal["normalized_product", "literal"] = Field(
        default="normalized_product", description="v4: softmax(sum_l log P_l) (= eq. 2 at level 1), or eq. 7 as printed")
    per_level_forward: bool = Field(default=True, description="re-score survivors at every level (Algorithm 1); false "
                                                              "reuses level 1's scores (an approximation)")

    @model_validator(mode="after")
    def _shrinking(self) -> SIRSpec:
        if any(b >= a for a, b in zip(self.levels, self.levels[1:])) or min(self.levels) < 2:
            raise ValueError(f"levels must shrink and keep at least the positive and one negative, got {self.levels}")
        if self.variant != "v4" and self.cpr != "normalized_product":
            raise ValueError(f"cpr has no effect with variant '{self.variant}' (only v4)")
        if self.variant in STAGED_VARIANTS and not self.per_level_forward:
            raise ValueError(f"per_level_forward has no effect with variant '{self.variant}' (stages select offline)")
        return self

    @property
    def stages(self) -> int:
        """Trained stages: one per level for v1/v2 (level 1 plus each compressed level), else one."""
        return len(self.levels) + 1 if self.variant in STAGED_VARIANTS else 1


class ResourcesSpec(_Strict):
    workers: int = Field(default=1, ge=1, description="Ray Train workers (data-parallel)")
    cpus_per_worker: float = Field(default=1, gt=0)
    use_gpu: bool | Literal["auto"] = "auto"
    # 3: a spot node can go more than once in a long trial; a restart resumes from the newest saved state
    max_failures: int = Field(default=3, ge=0, description="worker-group restarts from the last checkpoint (a lost node, "
                                                           "a worker Ray's memory monitor killed)")


class TrialSpec(_Strict):
    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    seed: int = 13
    data: DataSpec
    first_stage: FirstStageSpec = FirstStageSpec()
    reranking: RerankingSpec = RerankingSpec()
    training_data: TrainingDataSpec = TrainingDataSpec()
    model: ModelSpec
    loss: LossSpec = LossSpec()
    augmentation: AugmentationSpec = AugmentationSpec()
    optimization: OptimizationSpec = OptimizationSpec()
    resources: ResourcesSpec = ResourcesSpec()
    sir: SIRSpec | None = Field(default=None, description="the SIR hard-negative curriculum over blocks")
    robustness: list[Literal[PERTURBATION_NAMES]] = Field(  # type: ignore[valid-type]
        default_factory=list, description="perturbed copies of the test queries, each an evaluation target of the chosen "
                                          "model (CFT: punctuation, typo, contraction)")

    def _check_sir(self, sir: SIRSpec) -> None:
        if self.optimization.batching != "per_query":
            raise ValueError("sir trains on blocks: set optimization.batching per_query")
        if self.loss.ranking not in ("sir", "listwise"):
            raise ValueError(f"sir's level loss is the ranking loss sir or listwise, not '{self.loss.ranking}'")
        if sir.variant != "v0" and self.loss.contrastive != "none":
            raise ValueError(f"sir variant {sir.variant} combines its levels' losses alone: contrastive must be none")
        block = 1 + self.training_data.negatives
        if sir.variant != "v0" and sir.levels[0] >= block:
            raise ValueError(f"sir.levels {sir.levels} must start below the block size 1 + training_data.negatives = {block}")
        if sir.stages > 1 and self.optimization.early_stopping_patience is not None:
            raise ValueError(f"early_stopping_patience does not apply to sir {sir.variant}: every stage trains its epochs")
        if sir.variant != "v0" and self.augmentation.method != "none":
            raise ValueError(f"sir variant {sir.variant} compresses blocks of judged documents: augmentation must be none")

    @model_validator(mode="after")
    def _coherent(self) -> TrialSpec:
        if needs_augmentation(self.loss) and self.augmentation.method == "none":
            raise ValueError(f"contrastive '{self.loss.contrastive}' contrasts a relevant pair with its augmented view: "
                             "set augmentation.method")
        self.optimization.check_batch(self.training_data.negatives)
        if self.optimization.batching != "triples" and self.augmentation.method != "none":
            raise ValueError(f"augmentation pairs each triple with its augmented copy: it needs batching triples, "
                             f"not '{self.optimization.batching}'")
        if self.sir is not None:
            self._check_sir(self.sir)
        if len(set(self.robustness)) != len(self.robustness):
            raise ValueError(f"robustness lists a perturbation twice: {self.robustness}")
        if self.robustness and self.data.test_perturbation:
            raise ValueError("robustness perturbs the clean test queries: leave data.test_perturbation unset")
        if self.first_stage.method == "ear":
            if self.augmentation.selector is not None:  # a selector would read EAR's run before EAR is trained
                raise ValueError("a supervised selector (augmentation linear or attention) on an EAR first stage is not "
                                 "supported: augment with random, bm25 or glove, or re-rank BM25's candidates")
            if self.robustness:
                raise ValueError("robustness re-ranks each perturbed query's own candidates, and an EAR trial chose "
                                 "expansions for the clean queries only: test robustness on a searching first stage")
        return self
