"""The re-ranking trial's typed spec (``TrialSpec``): a cross-encoder fine-tuned on a first
stage's candidates, and its sections (loss, augmentation, optimization, SIR, re-ranking).

Built from the shared blocks of :mod:`workloads.spec`; validated at the edge
(``orchestrator.core.config``). Unknown keys are errors, not ignored.
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, ValidationError, create_model, field_validator, model_validator

from workloads.kinds.rerank.augmentation.spec import AugmentationSpec
from workloads.kinds.rerank.batching import BATCHINGS
from workloads.losses import (
    CONTRASTIVE_LOSSES,
    CONTRASTIVE_PARAMETERS,
    PARAMETERS,
    RANKING_LOSSES,
    RANKING_PARAMETERS,
    WEIGHTING_PARAMETERS,
    loss_parameters,
    needs_augmentation,
    teacher_losses,
)
from workloads.retrieval.first_stage import FIRST_STAGES
from workloads.spec import (
    PERTURBATION_NAMES,
    DataSpec,
    FirstStageSpec,
    ModelSpec,
    ResourcesSpec,
    TrainingDataSpec,
    _Strict,
)

FIXED_SIZES = (100, 1_000, 2_000, 10_000, 100_000)


class RerankingSpec(_Strict):
    """How the cross-encoder's scores become the final ranking (see workloads.evaluation.reranking)."""

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
    """The SIR curriculum (``workloads.kinds.rerank.sir``, docs/guide/sir.md) over blocks of
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
        teacher = teacher_losses(self.loss)
        if teacher and self.training_data.mining is None:
            raise ValueError(f"loss {teacher[0]} regresses on a teacher's scores, which only mined negatives carry: "
                             "set training_data.mining (without it the loss is 0 throughout and nothing is learned)")
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
        refused = FIRST_STAGES[self.first_stage.method].refuses(self)  # what the first stage cannot serve
        if refused:
            raise ValueError(refused)
        return self
