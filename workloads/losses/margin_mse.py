import torch

from workloads.losses.base import ModelOutputs, PairLoss


class MarginMSE(PairLoss):
    """Margin-MSE distillation (Hofstätter et al., *Improving Efficient Neural Ranking Models with
    Cross-Architecture Knowledge Distillation*, 2020): the student's score margin regressed on a
    teacher's, mean of ((s+ - s-) - (t+ - t-))^2 over the (positive, negative) pairs of a triple
    (per-query lists: the positive against each of its negatives).

    The teacher's scores come with the training rows (``positive_score`` / ``negative_score``:
    what the miner that chose the negatives scored them, a kept cross-encoder or a dense
    encoder, :mod:`workloads.kinds.dense.mining`) as ``structure.teacher``; pairs without one
    (NaN, e.g. augmented pairs) take no part. A batch with no scored pair is a degenerate batch.
    """

    name = "margin_mse"
    needs_teacher = True  # without training_data.mining no row has a score: the loss would be 0 throughout

    def forward(self, outputs: ModelOutputs, structure) -> torch.Tensor:
        teacher = getattr(structure, "teacher", None)
        if teacher is None:
            return self._nothing_to_compare(outputs)
        s = outputs.scores
        positive = structure.labels > 0.5
        scored = ~torch.isnan(teacher)
        compared = ((structure.triple_ids[:, None] == structure.triple_ids[None, :]) & (positive & scored)[:, None]
                    & (~positive & scored)[None, :])
        if not compared.any():
            return self._nothing_to_compare(outputs)
        t = torch.nan_to_num(teacher.to(s.dtype))
        student_margin = s[:, None] - s[None, :]
        teacher_margin = t[:, None] - t[None, :]
        return ((student_margin - teacher_margin)[compared] ** 2).mean()
