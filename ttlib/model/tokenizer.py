"""Turn trajectories into tokens and back.

A language model predicts discrete tokens, so every continuous number of a transition is cut into one of
`n_bins` bins, independently per dimension. One transition becomes `transition_dim` tokens laid out as

    [ obs_0 ... obs_{O-1} | act_0 ... act_{A-1} | reward | value ]

Two ways to place the bin edges:
- "uniform": equal-width bins between the data's min and max. Simple, but a few outliers (a crash's -100
  reward) stretch the range so that most data falls into a handful of bins.
- "quantile": every bin holds about the same number of data points, so resolution goes where the data is.

Decoding maps a bin to what it holds in the data: the mean of the fitted values that fell in it (its centre if
none did). A value comes back within its bin, and a dimension that takes few values (a leg contact's 0 and 1, a
flag, a gripper state) comes back exactly: each of its values fills bins of its own. For reward and value, the
model's whole distribution over bins is more useful than one sample: `expectation(probs)` is its mean.
Each dimension has its own slice of the model's vocabulary: token id = bin + dimension * n_bins (`offsets`).
"""

from __future__ import annotations

import json
import warnings

import numpy as np
import torch

from ttlib.errors import TTLibError
from ttlib.files import atomic_path

__all__ = ["ClippingWarning", "NO_MEANS", "NoBinMeansWarning", "STRATEGIES", "TokenizerError", "TokenizerRangeError",
           "TrajectoryTokenizer", "bin_means", "joined"]

STRATEGIES = ("uniform", "quantile")


class TokenizerError(TTLibError, ValueError):
    """Input the tokenizer cannot bin or unbin: a setting out of range, rows of the wrong width or holding NaN."""


class TokenizerRangeError(TokenizerError):
    """Raised (with on_clip="raise") when values fall outside the range the tokenizer was fitted on."""


class ClippingWarning(UserWarning):
    """Values outside the fitted range were clipped to the first or last bin."""


class NoBinMeansWarning(UserWarning):
    """A tokenizer saved before ttlib kept its bins' means: its bins decode to their centres."""


NO_MEANS = ("this tokenizer was saved before ttlib kept what each bin holds (the mean of its data): its bins "
            "decode to their centres, so a binary dimension's 0 may come back as 0.5. Refresh it from the data it "
            "was fitted on: `tokenizer.fit_means(rows)`, or for a checkpoint `python -m tools.refresh_tokenizer "
            "CHECKPOINT` (docs/TRAINING.md)")


class TrajectoryTokenizer:
    """Per-dimension binning of (observation, action, reward, value) transitions."""

    def __init__(self, edges: np.ndarray, obs_dim: int, act_dim: int, strategy: str = "quantile",
                 means: np.ndarray | None = None):
        edges = np.asarray(edges, dtype=np.float64)
        if edges.ndim != 2 or edges.shape[0] != obs_dim + act_dim + 2:
            raise TokenizerError(f"edges must be (obs_dim + act_dim + 2, n_bins + 1), got {edges.shape}")
        self.edges = edges  # (transition_dim, n_bins + 1): bin i of dim d is [edges[d, i], edges[d, i+1])
        self.obs_dim = obs_dim
        self.act_dim = act_dim
        self.strategy = strategy
        self.centers = (edges[:, :-1] + edges[:, 1:]) / 2  # (transition_dim, n_bins): each bin's middle
        self.has_means = means is not None  # False: fitted before ttlib kept means; bins decode to centres
        means = self.centers if means is None else np.asarray(means, dtype=np.float64)
        if means.shape != self.centers.shape:
            raise TokenizerError(f"means must be (transition_dim, n_bins) = {self.centers.shape}, got {means.shape}")
        self.means = means  # (transition_dim, n_bins): what a bin decodes to, the mean of the data in it

    # ---- layout -------------------------------------------------------------------------------------------
    @property
    def n_bins(self) -> int:
        return self.edges.shape[1] - 1

    @property
    def transition_dim(self) -> int:
        return self.obs_dim + self.act_dim + 2

    @property
    def reward_dim(self) -> int:
        """Index of the reward inside a transition."""
        return self.obs_dim + self.act_dim

    @property
    def value_dim(self) -> int:
        """Index of the value inside a transition (always the last)."""
        return self.obs_dim + self.act_dim + 1

    @property
    def offsets(self) -> np.ndarray:
        """(transition_dim,) token id offset of every dimension: the model's vocabulary is transition_dim * n_bins."""
        return np.arange(self.transition_dim) * self.n_bins

    @property
    def bin_widths(self) -> np.ndarray:
        return np.diff(self.edges, axis=1)  # (transition_dim, n_bins)

    # ---- fitting ------------------------------------------------------------------------------------------
    @classmethod
    def fit(cls, transitions: np.ndarray, obs_dim: int, act_dim: int, n_bins: int = 100,
            strategy: str = "quantile") -> TrajectoryTokenizer:
        """Fit bin edges on (N, transition_dim) rows [obs, act, reward, value] (see `joined`)."""
        transitions = np.asarray(transitions, dtype=np.float64)
        if strategy not in STRATEGIES:
            raise TokenizerError(f"unknown strategy {strategy!r}; choose one of {STRATEGIES}")
        if transitions.ndim != 2 or transitions.shape[1] != obs_dim + act_dim + 2:
            raise TokenizerError(f"expected (N, {obs_dim + act_dim + 2}) transitions, got {transitions.shape}")
        if n_bins < 2:
            raise TokenizerError("n_bins must be at least 2")
        finite = np.isfinite(transitions).all(axis=0)  # (transition_dim,) a NaN would make every edge NaN
        if not finite.all():
            raise TokenizerError(f"cannot fit bins: dimension {int(np.flatnonzero(~finite)[0])} of the transitions "
                                 "holds NaN or inf; drop or repair those transitions first")
        if strategy == "uniform":
            lo, hi = transitions.min(axis=0), transitions.max(axis=0)  # (transition_dim,)
            hi = np.where(hi > lo, hi, lo + 1e-6)  # a constant dimension still gets a (tiny) range
            edges = lo[:, None] + (hi - lo)[:, None] * np.linspace(0, 1, n_bins + 1)[None, :]
            edges[:, 0], edges[:, -1] = lo, hi  # exactly the data's range, whatever the rounding
        else:
            edges = np.quantile(transitions, np.linspace(0, 1, n_bins + 1), axis=0).T  # (transition_dim, n_bins+1)
            edges = np.maximum.accumulate(edges, axis=1)  # guard against rounding making edges non-monotone
        return cls(edges, obs_dim, act_dim, strategy).fit_means(transitions)

    @classmethod
    def fit_dataset(cls, data, n_bins: int = 100, strategy: str = "quantile") -> TrajectoryTokenizer:
        """Fit on every transition of a `ttlib.data.trajectories.OfflineDataset`."""
        t = data.transitions()
        rows = joined(t["observations"], t["actions"], t["rewards"], t["values"])
        return cls.fit(rows, data.obs_dim, data.act_dim, n_bins, strategy)

    def fit_means(self, transitions: np.ndarray) -> TrajectoryTokenizer:
        """Keep what every bin holds: the mean of the (N, transition_dim) rows' values that fall in it, its centre
        where none does. Call it with the rows the edges were fitted on (`fit` does). Returns self."""
        transitions = np.asarray(transitions, dtype=np.float64)
        if transitions.ndim != 2 or transitions.shape[1] != self.transition_dim:
            raise TokenizerError(f"expected (N, {self.transition_dim}) transitions, got {transitions.shape}")
        self.means = bin_means(transitions, self.encode(transitions, on_clip="ignore"), self.centers)
        self.has_means = True
        return self

    # ---- encode / decode ----------------------------------------------------------------------------------
    def _dims(self, dims) -> np.ndarray:
        return np.arange(self.transition_dim)[dims if dims is not None else slice(None)]

    def out_of_range(self, values: np.ndarray, dims=None) -> int:
        """How many entries of `values` (..., len(dims)) lie outside the fitted range."""
        edges = self.edges[self._dims(dims)]
        values = np.asarray(values)
        return int(((values < edges[:, 0]) | (values > edges[:, -1])).sum())

    def encode(self, values, dims=None, on_clip: str = "warn") -> np.ndarray:
        """Values (..., len(dims)) -> bins (..., len(dims)) int64 in [0, n_bins).

        `dims` picks which dimensions the last axis holds (default: a whole transition), e.g.
        slice(0, obs_dim) for observations. Values outside the fitted range are clipped to the first or last
        bin; on_clip says how the caller hears of it: "warn" (a ClippingWarning with the count), "raise"
        (TokenizerRangeError), or "ignore" (count them yourself with `out_of_range`).
        """
        values = np.asarray(values, dtype=np.float64)
        dims = self._dims(dims)
        if values.shape[-1] != len(dims):
            raise TokenizerError(f"last axis has {values.shape[-1]} values but {len(dims)} dimensions were asked for")
        n_out = self.out_of_range(values, dims)
        if n_out and on_clip != "ignore":
            message = (f"{n_out} of {values.size} values lie outside the tokenizer's fitted range and were "
                       f"clipped to the edge bins")
            if on_clip == "raise":
                raise TokenizerRangeError(message)
            warnings.warn(message, ClippingWarning, stacklevel=2)
        bins = np.empty(values.shape, dtype=np.int64)
        for j, d in enumerate(dims):
            # interior edges only: below the first -> bin 0, at/above the last -> bin n_bins-1 (clipping)
            bins[..., j] = np.searchsorted(self.edges[d, 1:-1], values[..., j], side="right")
        return bins

    def decode(self, bins, dims=None) -> np.ndarray:
        """Bins (..., len(dims)) -> what they hold, (..., len(dims)) float64: each bin's mean (see `means`)."""
        bins = np.asarray(bins)
        dims = self._dims(dims)
        if bins.min(initial=0) < 0 or bins.max(initial=0) >= self.n_bins:
            raise TokenizerError(f"bins must lie in [0, {self.n_bins})")
        return self.means[dims, bins]  # fancy indexing broadcasts dims over the leading axes

    def expectation(self, probs: torch.Tensor, dim: int) -> torch.Tensor:
        """Mean of the distribution `probs` (..., n_bins) over what dimension `dim`'s bins hold -> (...)."""
        means = torch.as_tensor(self.means[dim], dtype=probs.dtype, device=probs.device)
        return probs @ means

    def encode_transitions(self, observations, actions, rewards, values, on_clip: str = "warn") -> np.ndarray:
        """(..., obs), (..., act), (...), (...) -> (..., transition_dim) bins."""
        return self.encode(joined(observations, actions, rewards, values), on_clip=on_clip)

    # ---- persistence --------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Plain JSON: the edges, the layout and (once fitted) every bin's mean."""
        state = {"edges": self.edges.tolist(), "obs_dim": self.obs_dim, "act_dim": self.act_dim,
                 "strategy": self.strategy}
        return {**state, "means": self.means.tolist()} if self.has_means else state

    @classmethod
    def from_state_dict(cls, state: dict) -> TrajectoryTokenizer:
        """A saved tokenizer. One saved without means (older ttlib) decodes to its bins' centres, and says so once
        (NoBinMeansWarning, with how to refresh it)."""
        means = state.get("means")
        if means is None:
            warnings.warn(NO_MEANS, NoBinMeansWarning, stacklevel=2)
        return cls(np.asarray(state["edges"]), state["obs_dim"], state["act_dim"], state["strategy"],
                   None if means is None else np.asarray(means))

    def save(self, path: str) -> None:
        """Write JSON atomically (temporary file + rename): a crash never leaves half a file."""
        with atomic_path(path) as tmp, open(tmp, "w") as f:
            json.dump(self.state_dict(), f)

    @classmethod
    def load(cls, path: str) -> TrajectoryTokenizer:
        with open(path) as f:
            return cls.from_state_dict(json.load(f))

    def __repr__(self) -> str:
        return (f"TrajectoryTokenizer(obs_dim={self.obs_dim}, act_dim={self.act_dim}, n_bins={self.n_bins}, "
                f"strategy={self.strategy!r})")


def joined(observations, actions, rewards, values) -> np.ndarray:
    """Stack the parts of transitions side by side: (..., obs), (..., act), (...), (...) -> (..., obs+act+2)."""
    return np.concatenate([np.asarray(observations, dtype=np.float64), np.asarray(actions, dtype=np.float64),
                           np.asarray(rewards, dtype=np.float64)[..., None],
                           np.asarray(values, dtype=np.float64)[..., None]], axis=-1)


def bin_means(values: np.ndarray, bins: np.ndarray, empty: np.ndarray) -> np.ndarray:
    """values (N, D) and their bins (N, D) -> (D, K): the mean of the values in every bin; `empty` (D, K) where a
    bin holds none."""
    D, K = empty.shape
    flat = (bins + np.arange(D) * K).ravel()  # (N*D,) one index per (dimension, bin)
    sums = np.bincount(flat, weights=values.ravel(), minlength=D * K).reshape(D, K)
    counts = np.bincount(flat, minlength=D * K).reshape(D, K)
    return np.where(counts > 0, sums / np.maximum(counts, 1), empty)
