import torch

from workloads.core.logs import get_logger
from workloads.losses.base import ModelOutputs, PairLoss

COSINE_BOUND = 1.0 + 1e-4  # a cosine teacher's scores lie in [-1, 1], so its margins within 2


class MarginMSE(PairLoss):
    """Margin-MSE distillation (Hofstätter et al., *Improving Efficient Neural Ranking Models with
    Cross-Architecture Knowledge Distillation*, 2020): the student's score margin regressed on a
    teacher's, mean of ((s+ - s-) - (t+ - t-))^2 over the (positive, negative) pairs of a triple
    (per-query lists: the positive against each of its negatives).

    The teacher's scores come with the training rows (``positive_score`` / ``negative_score``:
    what the miner that chose the negatives scored them, a kept cross-encoder or a dense
    encoder, :mod:`workloads.kinds.dense.mining`) as ``structure.teacher``; pairs without one
    (NaN, e.g. augmented pairs) take no part. A batch with no scored pair is a degenerate batch.

    The teacher should score on the student's scale: Hofstätter's teachers are cross-encoders
    (logits), so is the re-ranking student. A dense miner's scores are cosines (margins at most
    2), which a logit student cannot match without shrinking its own margins: the first batch
    whose teacher scores all lie in [-1, 1] logs one warning (``training_data.mining.method:
    cross_encoder`` gives logits).
    """

    name = "margin_mse"
    needs_teacher = True  # without training_data.mining no row has a score: the loss would be 0 throughout

    def __init__(self) -> None:
        super().__init__()
        self.scale_checked = False

    def _check_teacher_scale(self, scores: torch.Tensor) -> None:
        self.scale_checked = True
        if bool((scores.abs() <= COSINE_BOUND).all()):
            get_logger("losses").warning(
                "margin_mse: the teacher's scores all lie in [-1, 1] (cosines of a dense miner?), so its margins are at "
                "most 2 while the student scores logits; distil from a cross-encoder (training_data.mining.method: "
                "cross_encoder) or expect the student's margins to shrink to the teacher's")

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
        if not self.scale_checked:
            self._check_teacher_scale(teacher[scored])
        t = torch.nan_to_num(teacher.to(s.dtype))
        student_margin = s[:, None] - s[None, :]
        teacher_margin = t[:, None] - t[None, :]
        return ((student_margin - teacher_margin)[compared] ** 2).mean()
