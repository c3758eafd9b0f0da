"""WikiQA (Yang, Yih, Meek, EMNLP 2015) from its official files: an answer-selection set whose
candidate lists come with it (``Collection.given``)."""

from __future__ import annotations

from pathlib import Path

from workloads.core.errors import InputError
from workloads.data.collections import Collection, Qrels
from workloads.data.document import Document
from workloads.data.readers import first_existing, numbered_lines


def _given_run(lists: dict[str, list[str]]) -> dict[str, dict[str, float]]:
    """Candidate lists as a run whose scores keep the given order (first = highest)."""
    return {q: {d: float(len(docs) - i) for i, d in enumerate(docs)} for q, docs in lists.items()}


WIKIQA_TEST_FILE = "WikiQA-test.tsv"
UNFILTERED = "-unfiltered"
ANSWERED = "-answered"  # every question with a correct candidate: CFT's test set (243; dev 126)


def _read_wikiqa_ref(path: Path) -> list[tuple[str, str, int]]:
    """``question_index 0 sentence_index label`` rows, in file order."""
    rows = []
    for line_no, line in numbered_lines(path):
        fields = line.split()
        if not fields:
            continue
        if len(fields) != 4 or not fields[3].lstrip("-").isdigit():
            raise InputError(f"{path}:{line_no}", "expected 'question_index 0 sentence_index label'")
        rows.append((fields[0], fields[2], int(fields[3])))
    return rows


def _read_wikiqa_split(path: Path, split: str) -> tuple[list[tuple[str, str, str, str, int]], dict[str, str]]:
    """(question index, question id, question, sentence id, label) rows and the sentence texts,
    from the official TSV (dev, test) or, for train, the tokenised ``.txt[.gz]``; both aligned
    row by row with ``.ref``."""
    stem = f"WikiQA-{split}"
    ref = _read_wikiqa_ref(path / f"{stem}.ref")
    tsv = path / f"{stem}.tsv"
    source = tsv if tsv.exists() else first_existing(path / f"{stem}.txt", path / f"{stem}.txt.gz")
    if source is None:
        raise InputError(path, f"no {stem}.tsv or {stem}.txt[.gz]")
    records = [(n, line.rstrip("\n")) for n, line in numbered_lines(source) if line.strip()]
    if source == tsv:
        expected = ["QuestionID", "Question", "DocumentID", "DocumentTitle", "SentenceID", "Sentence", "Label"]
        if not records or records[0][1].split("\t") != expected:
            raise InputError(tsv, f"expected the header {' '.join(expected)}")
        records = records[1:]
    columns = 7 if source == tsv else 3
    if len(records) != len(ref):
        raise InputError(source, f"{len(records)} rows but {stem}.ref has {len(ref)}: the files must align")
    rows: list[tuple[str, str, str, str, int]] = []
    texts: dict[str, str] = {}
    for (line_no, line), (q_index, s_index, label) in zip(records, ref):
        fields = line.split("\t")
        if len(fields) != columns:
            raise InputError(f"{source}:{line_no}", f"expected {columns} tab-separated columns, got {len(fields)}")
        if source == tsv:
            question_id, question, _, _, sentence_id, sentence, text_label = fields
        else:  # train: no ids in the shipped files; the .ref indices name question and sentence
            question, sentence, text_label = fields
            question_id, sentence_id = f"T{q_index}", f"T{q_index}-{s_index}"
        if text_label.strip() != str(label):
            raise InputError(f"{source}:{line_no}", f"label {text_label.strip()} disagrees with {stem}.ref ({label})")
        rows.append((q_index, question_id, question, sentence_id, label))
        texts[sentence_id] = sentence
    return rows, texts


def load_wikiqa_directory(path: Path, name: str | None = None) -> Collection:
    """WikiQA (Yang, Yih, Meek, EMNLP 2015) from its official files (``$ORCHESTRATE_DATA_DIR/wikiqa``).

    Splits ``train``, ``dev``, ``test``: ``dev`` and ``test`` are the standard filtered sets
    (``WikiQA-*-filtered.ref``: questions with at least one correct and one incorrect
    candidate: 122 and 237 questions), ``dev-answered`` and ``test-answered`` every question
    with at least one correct candidate (126 and 243: the sets CFT's P@1 implies, those whose
    candidates are all correct included), ``dev-unfiltered`` and ``test-unfiltered`` every
    question (296 and 633); ``train`` is every training question (2,118; 873 have an
    answer). A document is one candidate sentence (dev/test: its ``SentenceID``; train,
    shipped without ids: ``T<question>-<sentence>`` from the ``.ref`` indices), a query id
    the ``QuestionID`` (train: ``T<question index>``). Each split's candidate lists, in the
    official order, are its ``given`` run.
    """
    path = Path(path)
    corpus: dict[str, Document] = {}
    queries: dict[str, str] = {}
    qrels: dict[str, Qrels] = {}
    given: dict[str, dict[str, dict[str, float]]] = {}
    for split in ("train", "dev", "test"):
        rows, texts = _read_wikiqa_split(path, split)
        corpus.update({d: Document(d, "", t) for d, t in texts.items()})
        lists: dict[str, list[str]] = {}
        judged: Qrels = {}
        index_to_id: dict[str, str] = {}
        for q_index, question_id, question, sentence_id, label in rows:
            queries[question_id] = question
            index_to_id[q_index] = question_id
            lists.setdefault(question_id, []).append(sentence_id)
            judged.setdefault(question_id, {})[sentence_id] = label
        filtered_file = path / f"WikiQA-{split}-filtered.ref"
        if split == "train" or not filtered_file.exists():
            names = {split: set(lists)}
        else:
            kept = {index_to_id[q] for q, _, _ in _read_wikiqa_ref(filtered_file) if q in index_to_id}
            answered = {q for q, grades in judged.items() if any(g > 0 for g in grades.values())}
            names = {split: kept, f"{split}{UNFILTERED}": set(lists), f"{split}{ANSWERED}": answered}
        for split_name, ids in names.items():
            qrels[split_name] = {q: judged[q] for q in sorted(ids)}
            given[split_name] = _given_run({q: lists[q] for q in sorted(ids)})
    return Collection(name=name or path.name, corpus=corpus, queries=queries, qrels=qrels, given=given)
