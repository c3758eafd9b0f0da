"""The dense kind's training objectives: in-batch contrastive (DPR / SimCSE) and DiffCSE's
conditional replaced-token detection (RTD).

``L = L_contrast + rtd_lambda * L_RTD`` (DiffCSE, chapter 2 of Chuang's thesis):

- :func:`gathered`: with several data-parallel workers, every worker's embeddings join the
  in-batch negatives (``dense.gather``, as SimCSE and DiffCSE gather them).
- :func:`in_batch_contrastive`: row i's anchor (a query, or a sentence) against every row's
  positive and every hard negative of the batch, cosine similarity over a temperature, cross
  entropy on the anchor's own positive: SimCSE's loss, and DPR's with hard negatives.
  (Not the registry's ``infonce``: that one contrasts re-ranking pairs with their augmented
  views, and its denominator runs over every other pair of the batch, anchors included:
  SimCLR's NT-Xent, another sum.)
- the training-time pooler (dropped at test time, ``dense.pooler``, :func:`pool_views`):
  ``batchnorm_joint``, DiffCSE's MLP with BatchNorm (:class:`ProjectionPooler`, the authors'
  ``ProjectionMLP``) fed as the authors feed it: every view of the batch (anchors, positives,
  hard negatives) as one batch of ``batch x views`` rows, on the raw (un-normalised) pooled
  embedding; ``batchnorm_per_view``, the same MLP run on each view separately (each its own
  batch statistics) on the L2-normalised embedding ("SimCSE w/ BatchNorm" as this project ran
  it before, kept for the thesis's ablation); ``linear_tanh``, vanilla SimCSE's ``MLPLayer``
  (:class:`LinearTanhPooler`) on the raw embedding; ``none``.
- RTD: a share (``masking_ratio``) of each text's tokens is masked, a frozen generator fills
  them (:mod:`workloads.kinds.dense.generator`), and a discriminator of the encoder's
  architecture predicts for every real token whether it was replaced (:func:`rtd_labels`; a
  token the generator re-produced counts as original), **conditioned on the sentence
  embedding** h: as in the authors' code (voidism/DiffCSE, ``cls_input``), h replaces the
  output of the discriminator's embedding layer at the first position, so L_RTD's gradient
  reaches the encoder through h (:class:`ConditionalDiscriminator`). :func:`rtd_loss` is the
  binary cross entropy averaged as ``dense.rtd_average`` says: ``padded`` (the default) over
  every position of the padded batch, padding labelled 0, as the authors' ``CrossEntropyLoss``
  over ``replaced`` does; ``real_tokens`` over real tokens only, which weighs RTD more by about
  1 / (1 - padding share).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from workloads.losses.contrastive import normalized


def in_batch_contrastive(anchors: torch.Tensor, positives: torch.Tensor, negatives: torch.Tensor | None,
                         temperature: float) -> torch.Tensor:
    """-mean_i log( exp(cos(a_i, p_i)/t) / (sum_j exp(cos(a_i, p_j)/t) + sum_k exp(cos(a_i, n_k)/t)) )."""
    candidates = positives if negatives is None or negatives.numel() == 0 else torch.cat([positives, negatives])
    logits = normalized(anchors) @ normalized(candidates).T / temperature
    return F.cross_entropy(logits, torch.arange(anchors.shape[0], device=anchors.device))


POOLERS = ("batchnorm_joint", "batchnorm_per_view", "linear_tanh", "none")
RAW_INPUT_POOLERS = ("batchnorm_joint", "linear_tanh")  # fed the un-normalised embedding, as the authors'


class ProjectionPooler(nn.Module):
    """DiffCSE's pooler while training: Linear(H, 2H) - BatchNorm - ReLU - Linear(2H, H) -
    BatchNorm without affine parameters (the authors' ``ProjectionMLP``)."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(hidden_size, 2 * hidden_size, bias=False), nn.BatchNorm1d(2 * hidden_size),
                                 nn.ReLU(), nn.Linear(2 * hidden_size, hidden_size, bias=False),
                                 nn.BatchNorm1d(hidden_size, affine=False))

    def forward(self, embeddings: torch.Tensor) -> torch.Tensor:
        return self.net(embeddings.float())


class LinearTanhPooler(nn.Module):
    """Vanilla SimCSE's pooler while training: Linear(H, H) then tanh (the authors' ``MLPLayer``)."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.dense = nn.Linear(hidden_size, hidden_size)

    def forward(self, embeddings: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.dense(embeddings.float()))


def build_pooler(name: str, hidden_size: int) -> nn.Module | None:
    """The training-time pooler ``name`` of :data:`POOLERS` (None for ``none``)."""
    if name not in POOLERS:
        raise ValueError(f"unknown pooler '{name}' (choose from {', '.join(POOLERS)})")
    if name == "none":
        return None
    return LinearTanhPooler(hidden_size) if name == "linear_tanh" else ProjectionPooler(hidden_size)


def pool_views(pooler: nn.Module | None, joint: bool, views: list[torch.Tensor | None]) -> list[torch.Tensor | None]:
    """The pooler on each view ([rows, H] each; None passes through): ``joint``, every view's rows as one
    batch (BatchNorm's statistics over all of them, as DiffCSE's ``cl_forward``), else view by view."""
    if pooler is None:
        return list(views)
    if not joint:
        return [None if v is None else pooler(v) for v in views]
    present = [v for v in views if v is not None]
    pooled = iter(pooler(torch.cat(present)).split([v.shape[0] for v in present]))
    return [None if v is None else next(pooled) for v in views]


def gathered(rows: torch.Tensor) -> torch.Tensor:
    """Every data-parallel worker's ``rows`` [n_r, H], in rank order, this worker's with their gradient.

    SimCSE's and DiffCSE's ``cl_forward`` under ``dist.is_initialized()``: ``all_gather`` returns
    copies without gradient, so the local shard is put back; each worker's loss is then the
    whole batch's, and the gradient reaching each worker's shard is that loss's. DDP averages
    the workers' gradients, so the step's gradient is 1 / world size of one process's over the
    whole batch (the authors' scale; AdamW is nearly invariant to it). Shards of unequal row
    counts (hard negatives a row lacks) are padded for the gather and cut back.
    """
    world, rank = dist.get_world_size(), dist.get_rank()
    count = torch.tensor([rows.shape[0]], device=rows.device)
    counts = [torch.zeros_like(count) for _ in range(world)]
    dist.all_gather(counts, count)
    longest = int(max(counts).item())
    padded = rows.detach().new_zeros((longest, *rows.shape[1:]))
    padded[:rows.shape[0]] = rows.detach()
    shards = [torch.zeros_like(padded) for _ in range(world)]
    dist.all_gather(shards, padded.contiguous())
    shards = [shard[:int(n.item())] for shard, n in zip(shards, counts)]
    shards[rank] = rows
    return torch.cat(shards)


def maskable(input_ids: torch.Tensor, attention_mask: torch.Tensor, special_ids: list[int]) -> torch.Tensor:
    """Real tokens that are not special ([CLS], [SEP], padding): what may be masked and replaced."""
    special = torch.isin(input_ids, torch.tensor(special_ids, dtype=input_ids.dtype, device=input_ids.device))
    return attention_mask.bool() & ~special


def draw_mask(allowed: torch.Tensor, ratio: float, generator: torch.Generator | None = None) -> torch.Tensor:
    """Each allowed position masked with probability ``ratio`` (ELECTRA's and BERT's draw)."""
    draws = torch.rand(allowed.shape, generator=generator, device="cpu").to(allowed.device)
    return allowed & (draws < ratio)


def rtd_labels(original: torch.Tensor, corrupted: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """1.0 where the corrupted text's token differs from the original's, on real tokens; a masked
    token the generator filled with the original counts as original (0)."""
    return ((corrupted != original) & attention_mask.bool()).float()


RTD_AVERAGES = ("padded", "real_tokens")


def rtd_loss(logits: torch.Tensor, labels: torch.Tensor, attention_mask: torch.Tensor,
             average: str = "padded") -> torch.Tensor:
    """Binary cross entropy of the discriminator's logits [B, T] against ``labels``.

    ``padded``: the mean over all B x T positions, padding labelled 0 (``labels`` are 0 there),
    as the authors' ``CrossEntropyLoss`` over the padded batch: with it, the thesis's lambda
    (0.005 for STS) is lambda as reported. ``real_tokens``: the mean over real tokens only; the
    same weight then takes lambda x (1 - padding share), e.g. 0.0035 for 0.005 at 30% padding.
    """
    if average == "padded":
        return F.binary_cross_entropy_with_logits(logits.float(), labels * attention_mask.to(labels.dtype))
    if average != "real_tokens":
        raise ValueError(f"unknown RTD average '{average}' (choose from {', '.join(RTD_AVERAGES)})")
    real = attention_mask.bool()
    return F.binary_cross_entropy_with_logits(logits.float()[real], labels[real])


class ConditionalDiscriminator(nn.Module):
    """D(x'' | h): a Hugging Face encoder of the bi-encoder's architecture whose embedding layer's
    output at position 0 is replaced by the sentence embedding h, and a linear head giving one
    "replaced" logit per token."""

    def __init__(self, encoder: nn.Module) -> None:
        super().__init__()
        self.encoder = encoder
        self.head = nn.Linear(int(encoder.config.hidden_size), 1)
        embeddings = getattr(encoder, "embeddings", None)
        if embeddings is None:
            raise ValueError(f"{type(encoder).__name__} has no embedding layer to condition on (BERT-style encoders do)")
        self._condition: torch.Tensor | None = None
        embeddings.register_forward_hook(self._conditioned)

    def _conditioned(self, module, inputs, output):
        if self._condition is None:
            return output
        return torch.cat([self._condition.to(output.dtype).unsqueeze(1), output[:, 1:]], dim=1)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, condition: torch.Tensor) -> torch.Tensor:
        self._condition = condition
        try:
            hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        finally:
            self._condition = None
        return self.head(hidden).squeeze(-1)


@dataclass
class RTDOutcome:
    loss: torch.Tensor
    replaced: torch.Tensor   # share of real tokens replaced (the labels' mean)
    accuracy: torch.Tensor   # the discriminator's accuracy on real tokens


def replaced_token_detection(discriminator: ConditionalDiscriminator, generator, inputs: dict[str, torch.Tensor],
                             condition: torch.Tensor, ratio: float, special_ids: list[int],
                             draws: torch.Generator | None = None, average: str = "padded") -> RTDOutcome:
    """L_RTD of one tokenized batch conditioned on its embeddings ``condition`` [B, H]."""
    input_ids, attention_mask = inputs["input_ids"], inputs["attention_mask"]
    masked = draw_mask(maskable(input_ids, attention_mask, special_ids), ratio, draws)
    with torch.no_grad():
        corrupted = generator.fill(input_ids, attention_mask, masked, draws)
    labels = rtd_labels(input_ids, corrupted, attention_mask)
    logits = discriminator(corrupted, attention_mask, condition)
    real = attention_mask.bool()
    with torch.no_grad():
        accuracy = ((logits[real] > 0).float() == labels[real]).float().mean()
    return RTDOutcome(rtd_loss(logits, labels, attention_mask, average), labels[real].mean(), accuracy)


__all__ = ["POOLERS", "RAW_INPUT_POOLERS", "RTD_AVERAGES", "ConditionalDiscriminator", "LinearTanhPooler",
           "ProjectionPooler", "RTDOutcome", "build_pooler", "gathered", "pool_views", "draw_mask", "in_batch_contrastive", "maskable",
           "replaced_token_detection", "rtd_labels", "rtd_loss"]
