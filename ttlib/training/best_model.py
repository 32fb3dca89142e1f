"""The best model, not the last.

A model trained too long on little data learns its training episodes by heart: the validation loss bottoms out and
climbs again. So a run keeps, beside its last state (which `resume` goes on from), the weights of its best
evaluation, and that is the model a checkpoint hands out unless asked for the last (`which="last"`). A run also
says when its validation loss has climbed well above its best and stayed there (`overfitting`), and can stop early.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

__all__ = ["BestModel", "OVERFIT_EVALS", "OVERFIT_MARGIN", "TIE", "best_line", "overfitting"]


# Which evaluation's model a run keeps, and when it warns. A validation loss is an estimate (eval_batches random
# batches of held-out windows): on the course data it moves by about 1% from one evaluation to the next while the
# model stands still, so losses within TIE of the lowest are a tie, which the later, longer-trained model wins.
TIE = 0.01
OVERFIT_MARGIN = 0.10  # overfitting: the validation loss more than 10% above its lowest ...
OVERFIT_EVALS = 3  # ... for this many evaluations in a row


@dataclass
class BestModel:
    """The model a run keeps: that of the latest evaluation whose validation loss was within TIE of the lowest
    so far (closer than that is the estimate's noise, and a tie goes to the longer-trained model). Which validation
    loss is `on`: the Trajectory GPT's runs compare the action tokens' (what the planner samples), the total is
    kept beside it in the history."""
    step: int | None = None  # the kept evaluation's step (None until one is kept)
    val_loss: float | None = None  # its validation loss (the one named by `on`)
    lowest: float = math.inf  # the lowest validation loss so far
    lowest_step: int | None = None  # the step it was measured at
    behind: int = 0  # evaluations since the kept one, in a row (each more than TIE above the lowest)
    weights: dict | None = field(default=None, repr=False)  # the kept model's state dict (copies on the CPU)
    latest: bool = True  # the kept model is the latest evaluation's (so the last step's is the same)
    on: str = "val_loss"  # the history's column compared: "val_loss" (all tokens) or e.g. "val_action_loss"

    def observe(self, step: int, val_loss: float, on: str = "val_loss") -> bool:
        """Record an evaluation's loss `on` (a history column). True if its model is now the one to keep (then call
        `keep`). A run resumed with another criterion than its checkpoint's starts the comparison again."""
        if on != self.on:  # compared afresh: the lowest so far was another loss
            self.lowest, self.lowest_step, self.behind, self.on = math.inf, None, 0, on
        if val_loss < self.lowest:
            self.lowest, self.lowest_step = val_loss, step
        self.latest = val_loss <= (1 + TIE) * self.lowest
        if self.latest:
            self.step, self.val_loss, self.behind = step, val_loss, 0
        else:
            self.behind += 1
        return self.latest

    def keep(self, model: torch.nn.Module) -> None:
        self.weights = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}

    def summary(self) -> dict:
        """What a checkpoint records of it (beside the weights)."""
        return {"step": self.step, "val_loss": self.val_loss, "lowest": self.lowest, "lowest_step": self.lowest_step,
                "behind": self.behind, "on": self.on}

    @classmethod
    def from_payload(cls, payload: dict) -> BestModel:
        """The best model a checkpoint holds. A checkpoint from before ttlib kept one holds only its last model:
        that one, with its history's last validation loss, is where the comparison starts again."""
        if payload.get("best") is not None:
            return cls(**payload["best"], weights=payload["model"], latest="last_model" not in payload)
        best = cls()
        rows = [row for row in payload.get("history", []) if row.get("val_loss") is not None]
        if rows and rows[-1] is payload["history"][-1]:
            best.observe(rows[-1]["step"], rows[-1]["val_loss"])
            best.weights = payload["model"]
        return best


def overfitting(history: list[dict]) -> str | None:
    """A warning, with what to try, when the last OVERFIT_EVALS validation losses in `history` were all more than
    OVERFIT_MARGIN above the lowest; else None."""
    losses = [(row["step"], row["val_loss"]) for row in history if row.get("val_loss") is not None]
    if not losses:
        return None
    lowest_step, lowest = min(losses, key=lambda x: x[1])
    above = 0  # evaluations in a row, up to the latest, more than the margin above the lowest
    while above < len(losses) and losses[-1 - above][1] > (1 + OVERFIT_MARGIN) * lowest:
        above += 1
    if above < OVERFIT_EVALS:
        return None
    return (f"overfitting: the validation loss has been more than {OVERFIT_MARGIN:.0%} above its lowest "
            f"({lowest:.3f}, step {lowest_step}) for {above} evaluations, now {losses[-1][1]:.3f}; the checkpoint "
            f"keeps the best model. Try fewer --steps, more --dropout, a smaller model (--n-layer, --n-embd), "
            f"more data, or --early-stop {OVERFIT_EVALS}")


def best_line(best: dict | None, history: list[dict]) -> str:
    """One line on which model a run kept, for `ttlib train`'s last words."""
    if best is None or best.get("step") is None:
        return "no validation loss was measured: the checkpoint holds the last step's model"
    last = history[-1]["step"]
    on = best.get("on", "val_loss")
    what = "validation loss" if on == "val_loss" else f"validation loss of the {on[4:-5]} tokens"
    line = f"best model: step {best['step']}, {what} {best['val_loss']:.3f}"
    if best["lowest_step"] != best["step"]:
        line += f" (within {TIE:.0%} of the lowest, {best['lowest']:.3f} at step {best['lowest_step']})"
    if best["step"] == last:
        return line + ", which is also the last step's"
    return line + f" -- what evaluate and --export use; --which last for step {last}'s"

