"""SIR: the self-involvement hard-negative curriculum (Pu et al.; docs/guide/sir.md).

A block is one positive and N negatives of a query (``training_data.negatives``,
``optimization.batching: per_query``). Level 1 scores the whole block; level i + 1 keeps
the positive and the K_{i+1} - 1 negatives that level i scored highest (``selection: top``,
ties by position; ``random``: the paper's ablation, seeded per step), and scores them
again. ``sir.levels`` are the sizes of the compressed levels **including the positive**
(SIR: [48, 16] or [48, 16, 8] after a block of 88).

Variants built here (each step runs the levels in sequence, selection not differentiated):

- ``v0``: the same blocks and loss, no compression: the control SIR leaves undefined.
- ``v3``: one shared network, a forward per level (Algorithm 1); loss = L_1 + L_M.
- ``v4``: as v3 with conditional probabilities (eq. 7-9): L_i is the level loss on CPR_i
  over the survivors of level i; loss = sum_i L_i. ``cpr: normalized_product`` (default)
  reads eq. 7 as the normalised product of the survivors' per-level probabilities,
  softmax(sum_l log P_l), which equals eq. 2 at level 1; ``literal`` is eq. 7 as printed,
  softmax(prod_l P_l), nearly uniform since every P_l lies in [0, 1].

``per_level_forward: false`` reuses level 1's scores for the survivors instead of a new
forward: with one network the two differ only by dropout, so it is an approximation that
saves the extra forwards (docs/guide/sir.md).

The level loss is the trial's ranking loss, ``sir`` (eq. 1) or ``listwise``
(``workloads.losses.listwise``), applied to the level's probabilities.

Staged variants (``workloads.training`` runs them as stages of one trial, each checkpointed):

- ``v1``: a compressor per level, each starting from the pretrained model. Stage 1 trains
  C_1 on whole blocks for ``optimization.epochs``; C_1 then scores every training block
  offline (eval mode, no dropout, :func:`compress_blocks`) and keeps the positive and the
  ``levels[0] - 1`` negatives it scores highest (or random ones); stage 2 trains C_2 on
  those, and so on. The last compressor is the model that is validated and tested (docs/guide/sir.md).
- ``v2``: as v1, C_{i+1} starts from C_i's final weights.

Every stage uses the same blocks per step (``batch_size / (1 + negatives)``), so a later
stage's steps hold fewer pairs.
"""

from __future__ import annotations

import torch

from workloads.core.seeds import derived_seed
from workloads.losses.base import PairStructure
from workloads.losses.listwise import blocks, listwise_terms, sir_terms

LEVEL_TERMS = {"sir": sir_terms, "listwise": listwise_terms}


def select_survivors(scores: torch.Tensor, keep: int, selection: str = "top", generator: torch.Generator | None = None) -> torch.Tensor:
    """Positions (within a block, positive at 0) of the positive and ``keep - 1`` negatives,
    in block order: the highest-scoring negatives (ties: the earlier position), or random ones."""
    negatives = scores.shape[0] - 1
    wanted = min(keep - 1, negatives)
    if selection == "top":
        order = torch.sort(scores[1:].detach(), descending=True, stable=True).indices[:wanted]
    elif selection == "random":
        order = torch.randperm(negatives, generator=generator)[:wanted].to(scores.device)
    else:
        raise ValueError(f"unknown selection '{selection}' (top or random)")
    kept = torch.sort(order + 1).values
    return torch.cat([torch.zeros(1, dtype=torch.long, device=scores.device), kept])


def conditional_log_probs(history: list[torch.Tensor], cpr: str = "normalized_product") -> torch.Tensor:
    """log CPR_i over the survivors of level i, from each level's log-probabilities of those
    same survivors (``history[l]``, aligned, positive first)."""
    stacked = torch.stack(history)
    if cpr == "normalized_product":
        return torch.log_softmax(stacked.sum(0), dim=0)
    if cpr == "literal":
        return torch.log_softmax(stacked.exp().prod(0), dim=0)
    raise ValueError(f"unknown cpr '{cpr}' (normalized_product or literal)")


def curriculum_loss(score: callable, first_scores: torch.Tensor, structure: PairStructure, sir, ranking: str,
                    generator: torch.Generator | None = None) -> torch.Tensor:
    """The SIR loss of one batch of blocks.

    ``score(indices)`` re-scores the batch's pairs at ``indices`` (a forward with gradients);
    ``first_scores`` are level 1's scores of every pair. Returns the mean over blocks.
    """
    terms = LEVEL_TERMS[ranking]
    found = blocks(structure)
    if not found:
        raise ValueError("a SIR batch holds no block with a positive and a negative")
    sizes = [0, *sir.levels] if sir.variant != "v0" else [0]
    last = len(sizes) - 1
    current = found                                    # per block: pair indices of the level's survivors
    history: list[list[torch.Tensor]] = [[] for _ in found]  # per block: log P_l of the current survivors
    losses = [torch.zeros((), device=first_scores.device) for _ in found]
    scores = first_scores
    for level in range(len(sizes)):
        if level > 0:
            if sir.per_level_forward:
                flat = torch.cat(current)
                rescored = score(flat)
                scores = torch.zeros_like(first_scores).index_put((flat,), rescored)  # only survivors are read
            else:
                scores = first_scores
        for b, index in enumerate(current):
            log_p = torch.log_softmax(scores[index], dim=0)
            history[b].append(log_p)
            if sir.variant == "v4":
                losses[b] = losses[b] + terms(conditional_log_probs(history[b], sir.cpr))
            elif level in (0, last):  # v3: L_1 + L_M; v0: L_1 alone
                losses[b] = losses[b] + terms(log_p)
        if level < last:
            keep = [select_survivors(scores[index], sizes[level + 1], sir.selection, generator) for index in current]
            history = [[h[k] for h in hist] for hist, k in zip(history, keep)]
            current = [index[k] for index, k in zip(current, keep)]
    return torch.stack(losses).mean()


def compress_blocks(score: callable, rows: list[dict], kept: list[list[int]], keep: int, selection: str,
                    seed: int, stage: int, row_numbers: list[int] | None = None) -> list[list[int]]:
    """Offline selection for the next stage: per row, the positions (into the row's original
    ``negative_ids``) of the ``keep - 1`` negatives that survive, in block order.

    ``kept[r]`` are row r's current negatives (positions into its original list);
    ``score(queries, documents)`` scores pairs in eval mode. Random selection is seeded by
    (seed, stage, row number in the whole training set: ``row_numbers``, default 0, 1, ...),
    so it does not depend on how rows are split across workers.
    """
    row_numbers = list(range(len(rows))) if row_numbers is None else row_numbers
    queries, documents, owners = [], [], []
    for row, current in zip(rows, kept):
        texts = [row["positive"], *(row["negatives"][i] for i in current)]
        queries += [row["query"]] * len(texts)
        documents += texts
        owners.append(len(texts))
    scores = torch.tensor(score(queries, documents)) if queries else torch.zeros(0)
    survivors, start = [], 0
    for number, current, size in zip(row_numbers, kept, owners):
        generator = (torch.Generator().manual_seed(derived_seed("sir-selection", seed, stage, number))
                     if selection == "random" else None)
        positions = select_survivors(scores[start:start + size], keep, selection, generator)
        survivors.append([current[int(p) - 1] for p in positions[1:]])
        start += size
    return survivors


def compressed_rows(rows: list[dict], kept: list[list[int]] | None) -> list[dict]:
    """The training rows of a stage: each row's negatives restricted to ``kept`` (all when None)."""
    if kept is None:
        return rows
    return [{**row, "negative_ids": [row["negative_ids"][i] for i in k], "negatives": [row["negatives"][i] for i in k]}
            for row, k in zip(rows, kept)]


__all__ = ["select_survivors", "conditional_log_probs", "curriculum_loss", "compress_blocks", "compressed_rows",
           "LEVEL_TERMS"]
