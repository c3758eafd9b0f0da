"""Expansion sources: ``n`` candidate expansions per query (EAR's first step), cached by content.

``EXPANSION_SOURCES`` is the registry, keyed by ``expansion.source``:

- ``pseudo_relevance``: text drawn from the query's BM25 top ``feedback_docs`` documents, the
  three kinds of context a GAR generator writes (an answer-bearing sentence, a title, a few
  terms): each expansion picks one kind at random, then one sentence, one title, or
  ``terms`` terms sampled by their frequency in those documents (stop words and the query's
  own terms left out). Extractive: it needs no generator, so it runs offline on any
  collection; every draw is a function of (seed, query id, expansion number).
- ``generator``: sampled from a Hugging Face model (``model``: a seq2seq generator such as
  GAR's or T0, or a causal one), ``n`` samples per query at ``temperature``, its input the
  ``prompt`` with the query's text; seeded per (seed, query id), so the same seed samples the
  same expansions on the same machine and library versions;
- ``file``: expansions written elsewhere (a published GAR output, an LLM's samples): a JSONL
  file of ``{"query_id": ..., "expansion": ...}`` lines, the first ``n`` of each query in
  file order.

The first expansion of a query is its "greedy" one (the first a generator writes, the first
a file lists); systems that use one expansion without choosing use it.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np

from workloads.core.errors import InputError
from workloads.core.paths import atomic_path, cache_dir, stable_key
from workloads.core.seeds import derived_seed
from workloads.data.collections import Collection
from workloads.data.identity import remembered_file_hash
from workloads.evaluation.ranking import TIE_ORDER, trec_eval_order
from workloads.retrieval.bm25 import read_trec_run, retrieved_run
from workloads.text.sentences import SPLITTER_VERSION, split_sentences
from workloads.text.tokens import tokenize

Expansions = dict[str, list[str]]  # query id -> its expansions, in draw order (the first is the greedy one)
ExpansionSource = Callable[[Collection, dict[str, str], object], Expansions]

# Lucene's English stop set, which Anserini's analyzer drops from every query: a term sample
# spends none of its terms on them.
STOP_WORDS = frozenset("a an and are as at be but by for if in into is it no not of on or such that the their then "
                       "there these they this to was will with".split())


def pseudo_relevance(collection: Collection, queries: dict[str, str], spec) -> Expansions:
    run = read_trec_run(retrieved_run(collection, queries, k=spec.feedback_docs))
    out: Expansions = {}
    for qid, text in queries.items():
        top = trec_eval_order(run.get(qid, {}))[:spec.feedback_docs]
        documents = [collection.document(doc_id) for doc_id, _ in top]
        titles = [" ".join(d.title.split()) for d in documents if d.title.strip()]
        sentences = [s for d in documents for s in split_sentences(d.text)]
        own = set(tokenize(text))
        counts = Counter(t for d in documents for t in tokenize(d.contents)
                         if t not in STOP_WORDS and t not in own and not t.isdigit() and len(t) > 1)
        terms, weights = list(counts), np.array(list(counts.values()), dtype=float)
        kinds = [kind for kind, available in (("sentence", sentences), ("title", titles), ("terms", terms)) if available]
        if not kinds:  # nothing retrieved for it: the query alone, n times (it still has n candidates)
            out[qid] = [""] * spec.n
            continue
        drawn = []
        for i in range(spec.n):
            rng = np.random.default_rng(derived_seed("pseudo_relevance", spec.seed, qid, i))
            kind = kinds[rng.integers(len(kinds))]
            if kind == "sentence":
                drawn.append(sentences[rng.integers(len(sentences))])
            elif kind == "title":
                drawn.append(titles[rng.integers(len(titles))])
            else:
                size = min(spec.terms, len(terms))
                picked = rng.choice(len(terms), size=size, replace=False, p=weights / weights.sum())
                drawn.append(" ".join(terms[j] for j in sorted(picked)))
        out[qid] = drawn
    return out


def generator(collection: Collection, queries: dict[str, str], spec) -> Expansions:
    # lazy: torch and transformers load only when a generator writes expansions (EAR's specs and
    # the other sources import this module)
    import torch  # noqa: PLC0415
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoTokenizer  # noqa: PLC0415

    from workloads.models.cross_encoder import require_model_available, resolve_model_name  # noqa: PLC0415

    require_model_available(spec.model, field="expansion.model")
    name = resolve_model_name(spec.model)
    seq2seq = AutoConfig.from_pretrained(name).is_encoder_decoder
    tokenizer = AutoTokenizer.from_pretrained(name)
    model = (AutoModelForSeq2SeqLM if seq2seq else AutoModelForCausalLM).from_pretrained(name).eval()
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    out: Expansions = {}
    with torch.inference_mode():
        for qid, text in queries.items():
            encoded = tokenizer(spec.prompt.format(query=text), return_tensors="pt", truncation=True, max_length=256)
            inputs = {k: encoded[k] for k in ("input_ids", "attention_mask")}  # (a BERT tokenizer adds token types)
            torch.manual_seed(derived_seed("generator", spec.seed, qid))  # the query's draws, whatever came before
            generated = model.generate(**inputs, do_sample=True, temperature=spec.temperature, top_k=0,
                                       max_new_tokens=spec.max_new_tokens, num_return_sequences=spec.n,
                                       pad_token_id=pad)
            if not seq2seq:  # a causal model returns the prompt before what it wrote
                generated = generated[:, inputs["input_ids"].shape[1]:]
            out[qid] = [" ".join(t.split()) for t in tokenizer.batch_decode(generated, skip_special_tokens=True)]
    return out


def from_file(collection: Collection, queries: dict[str, str], spec) -> Expansions:
    path = Path(spec.path).expanduser()
    if not path.is_file():
        raise InputError(spec.path, "expansion path: no such file")
    found: Expansions = {}
    unknown: set[str] = set()
    # utf-8-sig: a byte-order mark (what some editors write first) is read past, not refused
    with open(path, encoding="utf-8-sig") as handle:  # one line at a time: only the asked queries' first n are kept
        try:
            for line_no, line in enumerate(handle, 1):
                if line.strip():
                    _add_expansion(found, unknown, line, f"{path}:{line_no}", collection, queries, spec.n)
        except UnicodeDecodeError as exc:  # the decoder reads in blocks: where the bad byte is, read again
            bad = _first_bad_byte(path)
            raise InputError(path, f"not UTF-8 text ({exc.reason}: byte {bad[1]:#x} at offset {bad[0]:,}, line "
                                   f"{bad[2]}): save it as UTF-8") from None
    unknown = sorted(unknown)
    if unknown:
        raise InputError(path, f"{len(unknown)} query ids are not queries of {collection.name} (e.g. '{unknown[0]}')")
    short = sorted(q for q in queries if len(found.get(q, [])) < spec.n)
    if short:
        raise InputError(path, f"{len(short)} of the {len(queries):,} queries have fewer than n={spec.n} expansions "
                               f"(e.g. '{short[0]}': {len(found.get(short[0], []))})")
    return {qid: found[qid] for qid in queries}


def _add_expansion(found: Expansions, unknown: set[str], line: str, where: str, collection: Collection,
                   queries: dict[str, str], n: int) -> None:
    """One line of an expansions file: a query's expansion kept (the first ``n`` of an asked
    query), an id that is no query of the collection noted in ``unknown``."""
    try:
        record = json.loads(line)
        qid, expansion = record["query_id"], record["expansion"]
    except (json.JSONDecodeError, KeyError, TypeError):
        raise InputError(where, 'not a JSON object with "query_id" and "expansion"') from None
    if not isinstance(expansion, str):  # null would be searched as the word "None", a number as its digits
        raise InputError(where, f'"expansion" is {json.dumps(expansion)}, not a string (write "" for no expansion)')
    if not isinstance(qid, str | int) or isinstance(qid, bool):
        raise InputError(where, f'"query_id" is {json.dumps(qid)}, not a string')
    qid = str(qid)
    if qid not in collection.queries:
        unknown.add(qid)
    elif qid in queries and len(found.setdefault(qid, [])) < n:
        found[qid].append(expansion)


def _first_bad_byte(path: Path) -> tuple[int, int, int]:
    """(offset, byte, line number) of the first byte of ``path`` that is not UTF-8."""
    data = path.read_bytes()
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return exc.start, data[exc.start], data.count(b"\n", 0, exc.start) + 1
    return len(data), 0, data.count(b"\n") + 1


EXPANSION_SOURCES: dict[str, ExpansionSource] = {"pseudo_relevance": pseudo_relevance, "generator": generator,
                                                  "file": from_file}


def source_content(spec) -> object:
    """What the settings of ``spec`` (an ExpansionSpec) do not say about its expansions: the
    content of its file, the files of a local generator (either can change in place)."""
    if spec.source == "file" and Path(spec.path).expanduser().is_file():
        return remembered_file_hash(Path(spec.path).expanduser())
    if spec.source == "generator" and Path(spec.model).expanduser().is_dir():
        return sorted((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in Path(spec.model).expanduser().iterdir()
                      if f.is_file())
    return ""


def expansions(collection: Collection, queries: dict[str, str], spec) -> Expansions:
    """The expansions of ``queries`` under ``spec`` (an ExpansionSpec), cached by (corpus, queries,
    spec, the file's content): computed once, read back after."""
    if not queries:
        raise InputError(collection.name, "no queries to expand")
    # pseudo-relevance feedback reads a ranking's top: its expansions move with the order (generated ones keep their keys)
    ordered = (TIE_ORDER,) if spec.source == "pseudo_relevance" else ()
    key = stable_key(collection.fingerprint, sorted(queries.items()), spec.model_dump_json(), source_content(spec),
                     f"sentences-v{SPLITTER_VERSION}", *ordered)
    path = cache_dir() / "expansions" / f"{spec.source}-{key}.json"
    if path.exists():
        return json.loads(path.read_text(encoding="utf-8"))
    made = EXPANSION_SOURCES[spec.source](collection, queries, spec)
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(made), encoding="utf-8")
    return made


__all__ = ["EXPANSION_SOURCES", "Expansions", "expansions", "source_content"]
