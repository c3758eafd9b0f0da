import math

import torch

from workloads.losses.base import ModelOutputs, PairLoss, Parameter

LAMBDA = Parameter(field="lambda_", alias="lambda", annotation=float, default=0.5, ge=0, le=1, searchable=True,
                   description="contrastive weight (weighting: fixed)")
DWA_PERIOD = Parameter(field="dwa_period", argument="period", annotation=int, default=100, ge=1,
                       description="F of dynamic weighted aggregation, in steps")
# The weightings, each with the parameters it reads.
WEIGHTINGS: dict[str, tuple[Parameter, ...]] = {"fixed": (LAMBDA,), "equal": (), "dwa": (DWA_PERIOD,)}


class RankingWithContrastive(PairLoss):
    """A ranking loss on scores combined with a contrastive loss on Phi.

    - ``fixed``: L = (1 - lambda) L_rank + lambda L_con (AUG eq. 31);
    - ``equal``: 0.5 L_rank + 0.5 L_con (CFT);
    - ``dwa``: dynamic weighted aggregation (CFT): w1(t) = |sin(2 pi t / F)|, w2 = 1 - w1(t),
      t the optimisation step (counted by training-mode calls), F the period.
    The parts of the last call are kept in ``last_parts`` (0-d tensors) for logging. The step counter is
    in the module's ``state_dict`` (extra state), so a resumed trial continues DWA's cycle
    where its checkpoint left it instead of restarting it at t = 0.
    """

    name = "combined"
    declared_parameters = (LAMBDA, DWA_PERIOD)

    def __init__(self, ranking: PairLoss, contrastive: PairLoss, weighting: str = "fixed",
                 lambda_: float = 0.5, period: int = 100) -> None:
        super().__init__()
        if weighting not in WEIGHTINGS:
            raise ValueError(f"unknown weighting '{weighting}'")
        self.ranking, self.contrastive = ranking, contrastive
        self.weighting, self.lambda_, self.period = weighting, lambda_, period
        self.step = 0

    def get_extra_state(self) -> dict:
        return {"step": self.step}  # degenerate batches live in the two parts' own states

    def set_extra_state(self, state: dict) -> None:
        self.step = int(state.get("step", 0))

    @property
    def config(self) -> dict[str, float | str]:
        return {"lambda": self.lambda_, "period": float(self.period), **self.ranking.config,
                **{f"contrastive_{k}": v for k, v in self.contrastive.config.items()}}

    def weights(self) -> tuple[float, float]:
        if self.weighting == "fixed":
            return 1.0 - self.lambda_, self.lambda_
        if self.weighting == "equal":
            return 0.5, 0.5
        w1 = abs(math.sin(2 * math.pi * self.step / self.period))
        return w1, 1.0 - w1

    @property
    def degenerate_batches(self) -> int:  # type: ignore[override]
        return self.ranking.degenerate_batches + self.contrastive.degenerate_batches

    @degenerate_batches.setter
    def degenerate_batches(self, value: int) -> None:  # set by PairLoss.__init__; the parts count
        pass

    def forward(self, outputs: ModelOutputs, structure) -> torch.Tensor:
        w_rank, w_con = self.weights()
        if self.training:
            self.step += 1
        rank_loss = self.ranking(outputs, structure)
        con_loss = self.contrastive(outputs, structure)
        # kept on the device (read where logged): a float() here would make every step wait for it
        self.last_parts = {"ranking": rank_loss.detach(), "contrastive": con_loss.detach()}
        return w_rank * rank_loss + w_con * con_loss
