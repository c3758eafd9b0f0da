"""The training objective: the encoder and its loss as one module (what data-parallel
training wraps), and GradCache's micro-batched forwards. (SIR's curriculum objective is the
re-ranking kind's: :mod:`workloads.kinds.rerank.curriculum`.)"""

from __future__ import annotations

import torch

from workloads.losses import ModelOutputs, PairLoss
from workloads.losses.base import PairStructure
from workloads.models.cross_encoder import CrossEncoder


class TrainingObjective(torch.nn.Module):
    """The cross-encoder and its loss as one module: what data-parallel training wraps.

    A loss can have parameters of its own (RankingNCA's learned map). Wrapping both in one
    module puts them under DDP, so every worker's copy gets the same averaged gradients and
    stays the same; wrapping the encoder alone let the copies of the map diverge.

    Every forward of the encoder goes through :meth:`pairs`, so a micro-batched step
    (:class:`MicroBatchedPairs`) can stand in for it.
    """

    def __init__(self, model: CrossEncoder, loss_fn: PairLoss, amp_dtype: torch.dtype | None) -> None:
        super().__init__()
        self.model, self.loss_fn, self.amp_dtype = model, loss_fn, amp_dtype
        self.replay: MicroBatchedPairs | None = None  # set for the first pass of a micro-batched step

    def encode_pairs(self, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Scores and phi (fp32) of tokenized pairs, under the objective's autocast."""
        device_type = next(self.model.parameters()).device.type
        with torch.autocast(device_type, dtype=self.amp_dtype, enabled=self.amp_dtype is not None):
            scores, phi = self.model(**inputs)
        return scores.float(), phi.float()

    def pairs(self, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        return self.replay(inputs) if self.replay is not None else self.encode_pairs(inputs)

    def forward(self, inputs: dict[str, torch.Tensor], structure: PairStructure) -> torch.Tensor:
        scores, phi = self.pairs(inputs)
        return self.loss_fn(ModelOutputs(scores, phi), structure)


def _rng_state(device: torch.device):
    return torch.cuda.get_rng_state(device) if device.type == "cuda" else torch.get_rng_state()


def _set_rng_state(device: torch.device, state) -> None:
    if device.type == "cuda":
        torch.cuda.set_rng_state(state, device)
    else:
        torch.set_rng_state(state)


class MicroBatchedPairs:
    """A step's encoder forwards in micro-batches, with the whole step's gradient (GradCache:
    Gao et al., 2021, "Scaling Deep Contrastive Learning Batch Size under Memory Limited
    Setup"). Written here because the losses need every score of a block at once (a softmax
    over 1 + N), which plain gradient accumulation cannot give.

    First pass: every forward the objective asks for runs without gradients, micro-batch by
    micro-batch, and returns leaf tensors; the loss is built on them and backpropagated to
    them (and to the loss's own parameters). Second pass (:meth:`backward`): each micro-batch
    is encoded again with gradients, under the RNG state of its first pass (the same dropout
    masks), and receives its slice of the leaves' gradient. Memory is one micro-batch's
    activations; the cost is about one more forward.
    """

    def __init__(self, objective: TrainingObjective, size: int) -> None:
        self.objective, self.size = objective, size
        self.device = next(objective.model.parameters()).device
        self.recorded: list[tuple[dict[str, torch.Tensor], list, torch.Tensor, torch.Tensor]] = []

    def _chunks(self, inputs: dict[str, torch.Tensor]):
        n = next(iter(inputs.values())).shape[0]
        for start in range(0, n, self.size):
            yield start, {k: v[start:start + self.size] for k, v in inputs.items()}

    def __call__(self, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        states, scores, phis = [], [], []
        with torch.no_grad():
            for _, chunk in self._chunks(inputs):
                states.append(_rng_state(self.device))
                s, p = self.objective.encode_pairs(chunk)
                scores.append(s)
                phis.append(p)
        leaves = torch.cat(scores).requires_grad_(), torch.cat(phis).requires_grad_()
        self.recorded.append((inputs, states, *leaves))
        return leaves

    def backward(self) -> None:
        after = _rng_state(self.device)
        for inputs, states, scores, phi in self.recorded:
            for (start, chunk), state in zip(self._chunks(inputs), states):
                _set_rng_state(self.device, state)
                s, p = self.objective.encode_pairs(chunk)
                outputs, grads = [], []
                for value, leaf in ((s, scores), (p, phi)):
                    if leaf.grad is not None:
                        outputs.append(value)
                        grads.append(leaf.grad[start:start + len(value)])
                if outputs:
                    torch.autograd.backward(outputs, grads)
        _set_rng_state(self.device, after)


def load_loss_state(loss_fn: PairLoss, state: dict) -> None:
    """Restore a loss's parameters and counters; checkpoints written before the counters were
    part of the state (no ``_extra_state``) restore the parameters and start the counters at 0."""
    missing, unexpected = loss_fn.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.endswith("_extra_state")]
    if missing or unexpected:
        raise ValueError(f"loss state does not match the loss: missing {missing}, unexpected {unexpected}")

