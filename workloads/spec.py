"""The typed specs' shared building blocks: what every trial kind's spec is made of.

Validated at the edge (``orchestrator.core.config`` loads YAML into the kinds' specs, which
are built from these); inside the data plane every field is already checked. Unknown keys
are errors, not ignored. Each kind's own spec lives in its package
(``workloads.kinds.rerank.spec.TrialSpec``, ``workloads.kinds.selector.spec``,
``workloads.kinds.ear.spec``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_serializer, model_validator
from pydantic_core import PydanticCustomError

from workloads.core.errors import InputError
from workloads.core.paths import resolve_paths
from workloads.retrieval.first_stage import FIRST_STAGES
from workloads.retrieval.mining import MINERS
from workloads.text.perturbations import PERTURBATIONS

PERTURBATION_NAMES = tuple(PERTURBATIONS)


def registered_name(value: Any, registry: dict) -> Any:
    """``value`` if it names an entry of ``registry``; else the error a ``Literal`` of its names
    would give (a registry filled at import, so a field cannot be a ``Literal`` of it)."""
    if not isinstance(value, str) or value not in registry:
        names = [repr(name) for name in registry]
        expected = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"
        raise PydanticCustomError("literal_error", "Input should be {expected}", {"expected": expected})
    return value


def one_line(exc: ValidationError) -> str:
    """A validation error as the CLI prints it: the first problem, where it is."""
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first["loc"])
    message = first["msg"].removeprefix("Value error, ")
    return f"{where}: {message}" if where else message


def load_trial_file(path: str, spec: type[BaseModel], kind: str, named: str, said_as: str = "") -> Any:
    """The trial of a one-trial file of ``kind`` that another trial reads (a first stage's or a
    miner's ``run``), validated as ``spec``; one line naming the file on error. ``named``: the
    kind in messages ("an EAR", "a dense"); ``said_as``: what the messages start with."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise InputError(path, f"{said_as}no such {named.split(' ', 1)[1]} trial file")
    try:
        data = yaml.safe_load(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(path, f"cannot read ({getattr(exc, 'strerror', None) or exc})") from None
    except yaml.YAMLError as exc:
        raise InputError(path, f"not valid YAML ({str(exc).splitlines()[0]})") from None
    base = data.get("base") if isinstance(data, dict) else None
    if isinstance(data, dict) and "trials" in data and kind in (data.get("kind"), isinstance(base, dict) and base.get("kind")):
        raise InputError(path, f"{said_as}a file of several {named.split(' ', 1)[1]} trials; name a file of one")
    if not isinstance(data, dict) or data.get("kind") != kind:
        raise InputError(path, f"{said_as}not {named} trial file (it needs kind: {kind})")
    try:  # its relative paths as `orchestrate run` reads them: against the file's directory
        return spec.model_validate(resolve_paths(data, file.resolve().parent))
    except ValidationError as exc:
        raise InputError(path, one_line(exc)) from None


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


RM3_FIELDS = ("fb_terms", "fb_docs", "original_query_weight")  # first_stage fields of method rm3 only
# first_stage fields in every trial key since trials were first keyed; the others are keyed
# only where the method reads them (FirstStageSpec.unread_fields)
FIRST_KEYED_FIELDS = ("method", "k1", "b", "train_depth", "validation_depth", "test_depth")


class ExpansionSpec(_Strict):
    """Where a query's expansions come from (EAR's first step; ``workloads.kinds.ear.sources``)."""

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

    method: str = Field(
        default="bm25", description="bm25: Pyserini BM25; rm3: BM25 with RM3 query expansion (Pyserini's set_rm3); "
                                    "given: the collection's own candidate lists (WikiQA); "
                                    "run: a TREC run file (path); scoreddocs: the run an ir_datasets collection ships "
                                    "(MS MARCO document's official top-100); and the first stages trial kinds serve "
                                    "(``workloads.retrieval.first_stage.FIRST_STAGES``): ear, what an EAR trial "
                                    "retrieved with each query's chosen expansion (run: its trial file; trained first "
                                    "if it is not)")
    path: str | None = Field(default=None, description="run: the TREC run file ranking train, validation and test queries")
    run: str | None = Field(default=None, description="a kind's first stage (ear): the trial file of that kind on the "
                                                      "same data, trained first if it is not")
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
    model: str | None = Field(default=None, description="dense, hybrid: an off-the-shelf encoder (a Hugging Face id, a "
                                                        "local path or an alias such as minilm-l6) instead of run")
    dense_index: Literal["auto", "flat", "hnsw"] = Field(
        default="auto", description="dense, hybrid: exact faiss flat inner product, or HNSW; auto: HNSW above "
                                    "hnsw_threshold documents")
    hnsw_threshold: int = Field(default=1_000_000, ge=1, description="dense, hybrid: documents above which auto is HNSW")
    fusion: Literal["rrf", "interpolation"] = Field(default="rrf", description="hybrid: reciprocal rank fusion or a "
                                                                               "tuned interpolation of the scores")
    fusion_weight: float | None = Field(default=None, ge=0, le=1, description="hybrid interpolation: the dense run's "
                                                                              "weight; default: tuned on training queries")
    rrf_k: int = Field(default=60, ge=1, description="hybrid rrf: RRF's constant")
    train_depth: int = Field(default=100, ge=2, description="top-k of training queries that negatives are drawn from")
    validation_depth: int = Field(default=100, ge=1, description="top-k re-ranked for validation")
    test_depth: int = Field(default=100, ge=1, description="top-k re-ranked for test (100, as the method specifies)")

    @field_validator("method", mode="before")
    @classmethod
    def _registered(cls, value: Any) -> Any:
        """A name of the first-stage registry (the kinds' own included)."""
        return registered_name(value, FIRST_STAGES)

    @model_validator(mode="after")
    def _method_options(self) -> FirstStageSpec:
        """Every field the method needs is set, and no field it does not read is (defaults pass,
        so a dumped spec validates again); the fields' owners are the registry's entries."""
        method = FIRST_STAGES[self.method]
        defaults = {name: info.default for name, info in type(self).model_fields.items()}
        for group, says in _FIELD_GROUPS:
            for name in group:
                if name in method.needs and not getattr(self, name):
                    raise ValueError(f"method '{self.method}' needs {name} ({method.needs[name]})")
            unread = [name for name in group if name not in method.fields and _changed(getattr(self, name), defaults[name])]
            if unread:
                owners = [m for m in FIRST_STAGES.values() if any(name in m.fields for name in group)]
                raise ValueError(says(self.method, group, unread, owners))
        if self.fusion == "rrf" and self.fusion_weight is not None:  # (a method without fusion said so above)
            raise ValueError("fusion_weight weighs an interpolation of the scores: it has no effect with fusion rrf "
                             "(set fusion: interpolation, or leave fusion_weight out)")
        if self.fusion == "interpolation" and self.rrf_k != defaults["rrf_k"]:
            raise ValueError("rrf_k is reciprocal rank fusion's constant: it has no effect with fusion interpolation")
        if "/" in self.index:  # a path would key runs by its name only, whatever it holds
            raise ValueError(f"index '{self.index}': give build, prebuilt or a Pyserini prebuilt index's name, not a path")
        return self

    def unread_fields(self) -> set[str]:
        """Fields added after trials were first keyed that this method does not read (they are at
        their defaults: validation says so), and ``index`` at ``build``: keys leave them out, so
        trials keyed before a field existed keep their identity."""
        method = FIRST_STAGES[self.method]
        unread = {name for name in type(self).model_fields if name not in FIRST_KEYED_FIELDS and name not in method.fields}
        return unread | ({"index"} if self.index == "build" else set())


def _changed(value: Any, default: Any) -> bool:
    return bool(value) if default is None else value != default


def _no_effect(method: str, group: tuple, unread: list, owners: list) -> str:
    served = " or ".join(dict.fromkeys(o.fields[group[0]] for o in owners))
    return f"{group[0]}{f' ({served})' if served and group[0] == 'run' else ''} has no effect with method '{method}'"


def _belong(method: str, group: tuple, unread: list, owners: list) -> str:
    if not owners:
        return f"{', '.join(unread)} has no effect with method '{method}'"
    shown = " and ".join(group) if len(group) == 2 else ", ".join(unread)
    verb = "belongs" if len(unread) == 1 and len(group) == 1 else "belong"
    names = [o.name for o in owners]
    owned_by = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
    return f"{shown} {verb} to {owned_by}, not to method '{method}'"


# FirstStageSpec's optional fields in the order they are checked, each group with its message;
# a field added since (a kind's first stage's) is a group of its own
_FIELD_GROUPS = ((("path",), _no_effect), (("run",), _no_effect), (("k1", "b"), _belong), (("index",), _belong),
                 (RM3_FIELDS, _belong))
_FIELD_GROUPS += tuple(((name,), _belong) for name in FirstStageSpec.model_fields
                       if name not in FIRST_KEYED_FIELDS and not any(name in group for group, _ in _FIELD_GROUPS))


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


class MiningSpec(_Strict):
    """Negatives mined by a trained model, its scores kept for distillation (``workloads.kinds.dense.mining``)."""

    method: str = Field(
        description="a miner of the registry (``workloads.retrieval.mining.MINERS``, registered by the trial kinds): "
                    "dense: a dense encoder's top documents (run: a dense trial file, or model: an encoder); cross_encoder: "
                    "the first stage's top depth re-scored by a kept cross-encoder (model: its checkpoint directory)")
    run: str | None = Field(default=None, description="dense: the dense trial file whose kept encoder mines (trained first)")
    model: str | None = Field(default=None, description="dense: an encoder (Hugging Face id, local path, minilm-l6); "
                                                        "cross_encoder: a kept cross-encoder's checkpoint directory")
    depth: int = Field(default=100, ge=1, description="the miner's top documents negatives are chosen from")
    skip_top: int = Field(default=0, ge=0, description="skip the first candidates left by the margin filters (likely "
                                                       "unjudged positives; sentence-transformers' range_min)")
    absolute_margin: float | None = Field(default=None, description="drop a candidate scored above the hardest positive's "
                                                                    "score minus this")
    relative_margin: float | None = Field(default=None, ge=0, le=1, description="drop a candidate scored above p - |p| x "
                                                                                "this (p: the hardest positive's score)")
    sampling: Literal["random", "top"] = Field(default="random", description="random: drawn with the training seed; top: "
                                                                             "the highest scored")

    @field_validator("method", mode="before")
    @classmethod
    def _registered(cls, value: Any) -> Any:
        """A name of the miner registry (the kinds register theirs)."""
        return registered_name(value, MINERS)

    @model_validator(mode="after")
    def _source(self) -> MiningSpec:
        problem = MINERS[self.method].check(self)
        if problem:
            raise ValueError(f"mining method '{self.method}' {problem}")
        if self.skip_top >= self.depth:
            raise ValueError(f"skip_top {self.skip_top} leaves no candidate of depth {self.depth}")
        return self


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
    mining: MiningSpec | None = Field(default=None, description="negatives mined by a trained model instead of drawn from "
                                                                 "the first stage, its scores kept (workloads.kinds.dense.mining)")

    @model_serializer(mode="wrap")
    def _unmined_as_before(self, handler):
        """Without mining, the dump (and every key hashing it) is the one before mining existed."""
        data = handler(self)
        if self.mining is None and isinstance(data, dict):
            data.pop("mining", None)
        return data

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


class ResourcesSpec(_Strict):
    workers: int = Field(default=1, ge=1, description="Ray Train workers (data-parallel)")
    cpus_per_worker: float = Field(default=1, gt=0)
    use_gpu: bool | Literal["auto"] = "auto"
    # 3: a spot node can go more than once in a long trial; a restart resumes from the newest saved state
    max_failures: int = Field(default=3, ge=0, description="worker-group restarts from the last checkpoint (a lost node, "
                                                           "a worker Ray's memory monitor killed)")
