import torch
import torch.nn.functional as F

from workloads.losses.base import ModelOutputs, PairLoss


class PointwiseBCE(PairLoss):
    """Pointwise ranking loss: binary cross-entropy on sigmoid(score) with labels {0, 1}.

    AUG eq. 3: L = -(1/B) sum_i [y_i log sigma(y^_i) + (1 - y_i) log(1 - sigma(y^_i))].
    """

    name = "pointwise"

    def forward(self, outputs: ModelOutputs, structure) -> "torch.Tensor":
        return F.binary_cross_entropy_with_logits(outputs.scores, structure.labels.to(outputs.scores.dtype))
