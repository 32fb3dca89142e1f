"""Is a dataset fit to train on? Checks that turn silent garbage into one clear line.

Any Minari dataset loads, but not every one can be learned from. A NaN in the data does not crash anything: the
tokenizer's bin edges become NaN (every value then falls into bin 0) and a Decision Transformer's weights turn
to NaN, and both still save a checkpoint. A dataset of one episode leaves nothing to validate on. So training
checks the data first, here, and says what is wrong and what to do.
"""

from __future__ import annotations

import numpy as np

from ttlib.data.trajectories import DatasetError, OfflineDataset

__all__ = ["action_bounds", "check_finite", "check_trainable"]


def check_finite(data: OfflineDataset) -> None:
    """Every observation, action and reward must be a finite number (no NaN, no inf), else DatasetError."""
    for name in ("observations", "actions", "rewards"):
        episodes = getattr(data, name)
        for i, x in enumerate(episodes):
            finite = np.isfinite(x).reshape(len(x), -1).all(axis=1)  # (T,) one flag per step
            if not finite.all():
                total = sum(int((~np.isfinite(e)).sum()) for e in episodes)
                raise DatasetError(
                    f"dataset {data.dataset_id} has {total} non-finite values (NaN or inf) in its {name}, the "
                    f"first at episode {i}, step {int(np.flatnonzero(~finite)[0])}; a model cannot learn from "
                    "them: repair or drop those episodes and write the dataset again")


def check_trainable(data: OfflineDataset) -> None:
    """Enough finite data to train on and hold out whole episodes for validation, else DatasetError."""
    if data.n_episodes < 2:
        raise DatasetError(
            f"dataset {data.dataset_id} has {data.n_episodes} episode(s) ({data.n_steps} steps): training holds "
            "out whole episodes for validation, so it needs at least 2; collect more episodes")
    check_finite(data)


def action_bounds(data: OfflineDataset) -> tuple[list[float], list[float]] | None:
    """The action space's (low, high) that a tanh head must be scaled to; None when it is [-1, 1] already.

    A dataset that names no action space (one made in memory) must keep its actions in [-1, 1]; an unbounded
    action space cannot be reached by a tanh at all. Both are refused rather than learned wrong.
    """
    if data.action_low is None or data.action_high is None:
        largest = max(float(np.abs(a).max(initial=0.0)) for a in data.actions)
        if largest > 1.0:
            raise DatasetError(f"dataset {data.dataset_id} names no action space and its actions reach "
                               f"{largest:.3g}, outside the Decision Transformer's tanh range [-1, 1]; "
                               "give the dataset an action space (Minari's action_space)")
        return None
    low, high = np.asarray(data.action_low, np.float64), np.asarray(data.action_high, np.float64)
    if not (np.isfinite(low).all() and np.isfinite(high).all()):
        raise DatasetError(f"dataset {data.dataset_id} has an unbounded action space ({low} to {high}); the "
                           "Decision Transformer's tanh head needs finite action bounds")
    if (low == -1).all() and (high == 1).all():
        return None  # tanh's own range: no scaling, so checkpoints of such data act exactly as before
    return low.tolist(), high.tolist()
