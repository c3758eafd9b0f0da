"""EAR's first stage (``first_stage: {method: ear, run: <EAR trial file>}``): what an EAR trial
retrieved with each query's chosen expansion, query reranking then document re-ranking. The
EAR trial is a requirement of the re-ranking trial that reads it, trained first; the reading
trial keys the EAR trial's identity, not its file's path (a moved file is the same trial,
an edited one another). Registered with the EAR kind (:data:`workloads.kinds.TRIAL_KINDS`).
"""

from __future__ import annotations

import functools
from pathlib import Path

from workloads.core.errors import InputError, RequirementNotTrained
from workloads.core.logs import get_logger
from workloads.data.collections import Collection
from workloads.data.identity import remembered_file_hash, same_collection
from workloads.data.resolve import resolve_collection
from workloads.kinds.ear.spec import RUN_FILE, ear_dir, ear_key, load_ear_trial, trained_ear
from workloads.retrieval.bm25 import read_trec_run
from workloads.retrieval.first_stage import FirstStageMethod, Run, cached_run, top_k


class EarNotTrained(RequirementNotTrained):
    """A re-ranking trial's first stage is an EAR trial that has not finished yet."""


def ear(collection: Collection, split: str, queries: dict[str, str], k: int, spec) -> Path:
    trial = load_ear_trial(spec.run)
    if resolve_collection(trial.data.collection).fingerprint != collection.fingerprint:
        raise InputError(spec.run, f"EAR trial {trial.name} ranks {trial.data.collection}, not {collection.name}: an EAR "
                                   "first stage serves its own collection's trials")
    kept = trained_ear(trial)
    if kept is None:
        raise EarNotTrained(spec.run, f"EAR trial {trial.name} is not trained yet ({ear_dir(trial)}): `orchestrate run` "
                                      "and `orchestrate sweep` train it first")
    path = kept / RUN_FILE

    def make() -> Run:
        ranked = top_k(read_trec_run(path), queries, k)
        if not ranked:
            raise InputError(spec.run, f"EAR trial {trial.name} ranked none of the {len(queries):,} queries of "
                                       f"{collection.name} {split}: give both trials the same data")
        if len(ranked) < len(queries):
            get_logger("first-stage").warning(f"EAR trial {trial.name} ranks {len(ranked):,} of {len(queries):,} queries "
                                              f"of {collection.name} {split}; the others have no candidates")
        return ranked

    return cached_run(make, "ear", remembered_file_hash(path), sorted(queries), k)


def _same_data(first_stage, collection: str, split: str, where: str) -> None:
    """An EAR first stage serves trials on the EAR trial's own collection and splits."""
    ear_data = load_ear_trial(first_stage.run).data
    ranked = list(dict.fromkeys(s for s in (ear_data.train_split, ear_data.validation_split, ear_data.test_split) if s))
    if not same_collection(collection, ear_data.collection) or split not in ranked:
        raise InputError(f"{where}.run {first_stage.run}",
                         f"the EAR trial ranks {ear_data.collection} ({', '.join(ranked)}), not {collection} "
                         f"{split}: an EAR first stage serves trials on its own data")


def _refuses(trial) -> str | None:
    """What a re-ranking trial cannot combine with an EAR first stage."""
    if trial.augmentation.selector is not None:  # a selector would read EAR's run before EAR is trained
        return ("a supervised selector (augmentation linear or attention) on an EAR first stage is not "
                "supported: augment with random, bm25 or glove, or re-rank BM25's candidates")
    if trial.robustness:
        return ("robustness re-ranks each perturbed query's own candidates, and an EAR trial chose "
                "expansions for the clean queries only: test robustness on a searching first stage")
    return _trained_on_held_out(trial)


def _trained_on_held_out(trial) -> str | None:
    """A leak: the EAR trial trained on queries this trial tests or validates on (refused); an EAR
    trial validated otherwise, without overlap, is one warning line."""
    try:
        ear = load_ear_trial(trial.first_stage.run).data
    except InputError:  # an EAR trial file that cannot be read: the first stage's check says so
        return None
    data = trial.data
    if not same_collection(data.collection, ear.collection):
        return None  # (the first stage's check refuses other data)
    if data.test_collection is None and data.test_split == ear.train_split:
        return f"the EAR trial trained on {ear.train_split}, the split this trial tests on: a test must be held out"
    if data.validation_split is None:  # carved from train_split, as the EAR trial's when it carves
        trained_on_all = ear.validation_split is not None and ear.train_split == data.train_split
        carved_otherwise = ear.validation_split is None and (ear.train_split, ear.validation_queries) != (
            data.train_split, data.validation_queries)
        if trained_on_all or carved_otherwise:
            theirs = (f"validates on {ear.validation_split}" if ear.validation_split
                      else f"carves {ear.validation_queries} validation queries from {ear.train_split}")
            return (f"the EAR trial {theirs} and trained on the rest, and this trial carves {data.validation_queries} "
                    f"from {data.train_split}: it would validate on queries the EAR first stage trained on (give both "
                    "the same data.validation_queries)")
        return None
    if data.validation_split == ear.train_split:
        return f"the EAR trial trained on {ear.train_split}, the split this trial validates on: validation must be held out"
    if (ear.validation_split, ear.validation_cap) != (data.validation_split, data.validation_cap):
        theirs = (f"{ear.validation_split}" + (f" capped at {ear.validation_cap}" if ear.validation_cap else "")
                  if ear.validation_split else f"carved from {ear.train_split}")
        _warn_once(f"EAR first stage {trial.first_stage.run} was validated on other queries than this trial's "
                   f"({theirs}): its candidates are not chosen on this trial's validation")
    return None


@functools.cache
def _warn_once(message: str) -> None:  # a spec is validated again for every sampled variant of a cell
    get_logger("first-stage").warning(message)


EAR_FIRST_STAGE = FirstStageMethod(
    "ear", ear, "EAR", fields={"run": "an EAR trial file"}, needs={"run": "an EAR trial file, kind: ear"},
    requires=lambda first_stage: [load_ear_trial(first_stage.run)],
    identity=lambda first_stage: f"ear-{ear_key(load_ear_trial(first_stage.run))}",
    check=_same_data, refuses=_refuses)

__all__ = ["EAR_FIRST_STAGE", "EarNotTrained", "ear"]
