"""The re-ranking trial's identity and tags: its key (what changes its result), its grid
coordinates (``axes``) and the labels they are made of.

Every key here is golden (tests/sweep/test_grid.py and others): results tracked before a
field existed keep their identity, so fields added later are left out where they reproduce
what was before.
"""

from __future__ import annotations

from workloads.core.paths import stable_key
from workloads.kinds.rerank.spec import LossSpec, RerankingSpec, TrialSpec
from workloads.losses import PARAMETERS, loss_parameters, searchable_parameters
from workloads.retrieval.first_stage import FIRST_STAGES
from workloads.retrieval.mining import MINERS
from workloads.text.sentences import SPLITTER_VERSION


def loss_label(loss: LossSpec) -> str:
    """The loss axis: ``ranking[+contrastive][(weighting)][fixed readings]``, never a searched value."""
    label = loss.ranking if loss.contrastive == "none" else f"{loss.ranking}+{loss.contrastive}"
    if loss.weighting != "fixed":
        label += f"({loss.weighting})"
    fixed = set(searchable_parameters(loss)) | {"lambda_"}
    settings = {k: v for k, v in loss.model_dump(exclude_defaults=True).items()
                if k not in fixed and k not in ("ranking", "contrastive", "weighting")}
    if settings:  # two readings of one loss are two systems
        label += "[" + ",".join(f"{k}={v}" for k, v in sorted(settings.items())) + "]"
    return label


def sir_label(sir) -> str:
    """The SIR curriculum's part of the loss axis (``sir@v3[8-4]`` for the loss ``sir``),
    settings other than the defaults after the levels (``@v4[48-16-8,random]``); empty
    without a curriculum."""
    if sir is None:
        return ""
    if sir.variant == "v0":
        return "@v0"
    settings = ["-".join(str(k) for k in sir.levels)]
    settings += [sir.selection] if sir.selection != "top" else []
    settings += [f"cpr={sir.cpr}"] if sir.cpr != "normalized_product" else []
    settings += ["reused-scores"] if not sir.per_level_forward else []
    return f"@{sir.variant}[{','.join(settings)}]"


def rerank_axes(spec: TrialSpec) -> dict[str, str]:
    """A re-ranking trial's grid coordinates (tags): searched hyper-parameters (k_a, lambda, tau,
    ...) are params, never axes."""
    return {
        "model": spec.model.name,
        "loss": loss_label(spec.loss) + sir_label(spec.sir),
        "augmentation": spec.augmentation.method,
        "size": str(spec.training_data.size),
        "seed": str(spec.seed),
        "collection": spec.data.collection,
    }


# Random draws per (epoch, step) or (stage, row) come from hashed seeds since this version (they
# collided past 10,007 steps or rows before): trials whose results depend on such draws key it.
SEEDS_VERSION = "seeds-v2"

# The loss hyper-parameters in every trial key since trials were first keyed (besides ranking,
# contrastive and weighting, which name the losses): always part of the key, at their declared
# keyed_default where the chosen losses do not read them (nca_map: identity, NCA's map before
# it learned one). This set never grows. Every other loss parameter (``Parameter`` in
# ``workloads.losses``) is left out of the key when the chosen losses do not read it or when it
# has its keyed_default, the value that computes what trials computed before it existed: results
# tracked before a parameter existed keep their identity (and are reused), any other value is a
# new experiment, and a new parameter needs no edit here.
_ALWAYS_KEYED_LOSS_PARAMETERS = frozenset({"margin", "lambda_", "tau", "contrastive_margin", "nca_map", "dwa_period"})


def _unkeyed_first_stage_fields(first_stage) -> set[str]:
    """First-stage fields at the value they reproduce, added after trials were first keyed, and
    ``run`` (a kind's trial file: keyed by that trial's identity instead, :func:`rerank_key`)."""
    return first_stage.unread_fields() | {"run"}


def rerank_key(spec: TrialSpec) -> str:
    """Identity of a trial's result: everything that changes it (its name and resources do not).

    A section or field at the value that reproduces earlier behaviour is left out when it
    was added after trials were first keyed (``reranking``, ``first_stage.path`` and ``index``,
    ``data.test_perturbation``, ``test_first_stage`` and ``validation_cap``, ``robustness``, ``training_data.negatives``,
    ``training_data.queries``, ``optimization.batching``, ``cft_positives``, ``micro_batch_size``, ``length_bucketing``,
    ``early_stopping_patience`` and ``compile``, ``sir``, a loss parameter outside ``_ALWAYS_KEYED_LOSS_PARAMETERS``,
    ``augmentation.redraw`` where it changes nothing), so results tracked before it existed
    keep their identity; ``optimization.gradient_checkpointing`` changes memory, not results,
    and ``optimization.checkpoint_every`` when state is saved, not results: neither is ever
    part of it. Augmented trials also key the sentence splitter's version: a new splitter makes
    new training data.
    """
    loss = spec.loss
    active = set(loss_parameters(loss))
    unread = {f: PARAMETERS[f].keyed_default for f in _ALWAYS_KEYED_LOSS_PARAMETERS if f not in active}
    if any(getattr(loss, f) != value for f, value in unread.items()):
        spec = spec.model_copy(update={"loss": loss.model_copy(update=unread)})
    exclude: dict = {"name": True, "resources": True}
    exclude["first_stage"] = _unkeyed_first_stage_fields(spec.first_stage)
    exclude["data"] = {f: True for f in ("test_perturbation", "test_first_stage", "validation_cap")
                       if getattr(spec.data, f) is None}  # added later
    if spec.data.test_first_stage is not None:  # (its path was keyed from the start)
        added = _unkeyed_first_stage_fields(spec.data.test_first_stage) - {"path"}
        if added:
            exclude["data"]["test_first_stage"] = {f: True for f in added}
    if not spec.robustness:
        exclude["robustness"] = True
    exclude["training_data"] = {name: True for name in (  # added with lists; added with training queries drawn as needed
        ({"negatives"} if spec.training_data.negatives == 1 else set()) | ({"queries"} if spec.training_data.queries == "all" else set()))}
    miner = _miner_identity(spec)
    if miner:
        exclude["training_data"]["mining"] = {"run": True}  # keyed by the mining trial's identity instead
    # gradient checkpointing changes memory, not results; in-epoch checkpoints when state is saved
    exclude["optimization"] = {"gradient_checkpointing", "checkpoint_every"}
    if spec.optimization.micro_batch_size is None:
        exclude["optimization"].add("micro_batch_size")  # added with micro-batched steps
    if spec.optimization.gradient_accumulation == 1:
        exclude["optimization"].add("gradient_accumulation")  # added with accumulated steps
    if not spec.optimization.length_bucketing:
        exclude["optimization"].add("length_bucketing")  # added with length-bucketed batches
    if spec.optimization.early_stopping_patience is None:
        exclude["optimization"].add("early_stopping_patience")  # added with early stopping
    if not spec.optimization.compile:
        exclude["optimization"].add("compile")  # added with torch.compile
    if spec.optimization.batching == "triples":
        exclude["optimization"] |= {"batching", "cft_positives"}
    elif spec.optimization.batching != "cft":
        exclude["optimization"] |= {"cft_positives"}
    if spec.sir is None:
        exclude["sir"] = True
    if spec.reranking == RerankingSpec():
        exclude["reranking"] = True
    exclude["loss"] = {f for f, p in PARAMETERS.items() if f not in _ALWAYS_KEYED_LOSS_PARAMETERS
                       and (f not in active or getattr(loss, f) == p.keyed_default)}
    augmented = spec.augmentation.method != "none"
    exclude["augmentation"] = set() if spec.augmentation.selector is not None else {"selector"}  # added with selectors
    if not augmented or spec.augmentation.redraw == "once" or spec.optimization.epochs == 1:
        exclude["augmentation"].add("redraw")  # one draw, as before per-epoch draws existed
    payload = spec.model_dump_json(exclude=exclude)
    versions = [f"sentences-v{SPLITTER_VERSION}"] if augmented else []
    if spec.sir is not None and spec.sir.variant != "v0" and spec.sir.selection == "random":
        versions.append(SEEDS_VERSION)  # random selection draws from hashed seeds since then (other draws)
    versions += _first_stage_identities(spec)
    if miner:
        versions.append(miner)
    return stable_key(payload, *versions)


def _miner_identity(spec: TrialSpec) -> str | None:
    """The identity of the kept trial whose model mines the training negatives, if it is one."""
    mining = spec.training_data.mining
    return MINERS[mining.method].identity(mining) if mining is not None else None


def _first_stage_identities(spec: TrialSpec) -> list[str]:
    """The identity of each kept trial the first stages read (not its file's path: a moved file
    is the same trial, an edited one another)."""
    found = [FIRST_STAGES[fs.method].identity(fs) for fs in (spec.first_stage, spec.data.test_first_stage) if fs is not None]
    return [identity for identity in found if identity]
