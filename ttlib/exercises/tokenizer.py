"""Notebook 02's exercises: uniform edges and encoding, quantile edges, what a bin holds and decoding to it.

The trials are tables like LunarLander's transitions: heavy-tailed columns (rewards with rare spikes), now and then
a constant column, and a binary one like the leg contacts (whose quantile edges repeat). `encode` and `decode` are
given ttlib's edges -- uniform or quantile -- and `decode` ttlib's means, so a mistake in an exercise's edges never
shows up as one in its encoding, nor one in the means as one in decoding. The course dataset itself is not loaded
here (that takes seconds); its columns' kinds are.
"""

from __future__ import annotations

import numpy as np

from ttlib.exercises import Exercise, Mistake
from ttlib.model import tokenizer
from ttlib.model.tokenizer import TrajectoryTokenizer

__all__ = ["EXERCISES", "SMALL_EDGES", "SMALL_X", "TOKENIZER", "decode_trial", "decoding", "fitted_edges",
           "lent_encode", "quantile_bins", "quantile_trial", "run_decode", "run_quantile", "run_uniform", "table",
           "ttlib_bin_means", "ttlib_decode", "ttlib_encode", "ttlib_quantile_edges", "ttlib_uniform_edges",
           "uniform_bins", "uniform_trial"]


# ttlib's tokenizer, everything of it that fits or reads edges: the exercises rebuild it
TOKENIZER = (TrajectoryTokenizer.__init__, TrajectoryTokenizer.fit, TrajectoryTokenizer.fit_dataset,
             TrajectoryTokenizer.encode, TrajectoryTokenizer.encode_transitions, TrajectoryTokenizer.decode,
             TrajectoryTokenizer.fit_means, tokenizer.bin_means)


def table(rng) -> np.ndarray:
    """(N, D) rows of transitions: heavy tails like rewards; sometimes a constant and a binary column."""
    n_rows, n_columns = int(rng.integers(5, 300)), int(rng.integers(3, 7))
    x = rng.standard_t(df=2, size=(n_rows, n_columns)) * rng.uniform(0.1, 100)
    if rng.random() < 0.5:
        x[:, 0] = float(rng.normal())  # a constant column
    if rng.random() < 0.5:
        x[:, -1] = rng.integers(0, 2, size=n_rows)  # a binary column, like the leg contacts
    return x


def fitted_edges(x: np.ndarray, n_bins: int, strategy: str) -> np.ndarray:
    """ttlib's (D, n_bins + 1) edges of the columns of x (any number of them)."""
    return TrajectoryTokenizer.fit(x, x.shape[1] - 2, 0, n_bins, strategy).edges


def _shape(array) -> str:
    return str(tuple(np.shape(array)))


# ---- exercise 1: uniform edges and encoding ------------------------------------------------------------------------
def uniform_trial(rng):
    """(rows and a number of bins for the edges; values to encode and the edges to encode them with)."""
    x, n_bins = table(rng), int(rng.integers(2, 120))
    fitted = table(rng)
    k = int(rng.integers(2, 60))
    edges = fitted_edges(fitted, k, str(rng.choice(["uniform", "quantile"])))
    inside_and_out = rng.standard_t(df=2, size=(50, len(edges))) * fitted.std()  # some fall outside the range
    on_edges = edges[np.arange(len(edges)), rng.integers(0, k + 1, size=(20, len(edges)))]  # exactly on an edge
    return x, n_bins, inside_and_out, on_edges, edges


def run_uniform(answer, trial):
    x, n_bins, inside_and_out, on_edges, edges = trial
    given = f"edges of shape {_shape(edges)}" + (", some repeated" if (np.diff(edges, axis=1) == 0).any() else "")
    outputs = {f"uniform_edges(x of shape {_shape(x)}, n_bins={n_bins})": answer.uniform_edges(x.copy(), n_bins),
               f"encode(values in and outside the fitted range, {given})":
                   answer.encode(inside_and_out.copy(), edges.copy())}
    bins = answer.encode(on_edges.copy(), edges.copy())
    outputs[f"encode(values exactly on an edge, {given})"] = bins
    outputs["encode returns whole numbers (an integer dtype), usable as indices"] = \
        np.issubdtype(np.asarray(bins).dtype, np.integer)
    return outputs


def ttlib_uniform_edges(x, n_bins):
    return fitted_edges(x, n_bins, "uniform")


def ttlib_encode(x, edges):
    return TrajectoryTokenizer(edges, edges.shape[0] - 2, 0).encode(x, on_clip="ignore")


def _edges_with(axis=0, guard_constant=True, n_edges=lambda n_bins: n_bins + 1):
    def uniform_edges(x, n_bins):
        lo, hi = x.min(axis=axis), x.max(axis=axis)
        if guard_constant:
            hi = np.where(hi > lo, hi, lo + 1e-6)
        edges = lo[:, None] + (hi - lo)[:, None] * np.linspace(0, 1, n_edges(n_bins))[None, :]
        edges[:, 0], edges[:, -1] = lo, hi
        return edges

    return {"uniform_edges": uniform_edges}


def _encode_with(side="right", interior=slice(1, -1)):
    def encode(x, edges):
        bins = np.empty(x.shape, dtype=np.int64)
        for j in range(x.shape[1]):
            bins[:, j] = np.searchsorted(edges[j, interior], x[:, j], side=side)
        return bins

    return {"encode": encode}


def _encode_equal_widths(x, edges):
    lo, hi = edges[:, 0], edges[:, -1]  # (D,)
    n_bins = edges.shape[1] - 1
    return np.clip(np.floor((x - lo) / (hi - lo) * n_bins), 0, n_bins - 1).astype(np.int64)


uniform_bins = Exercise(
    id="02-uniform", number=1, what="your uniform_edges or encode", names=("uniform_edges", "encode"),
    trial=uniform_trial, run=run_uniform, reference={"uniform_edges": ttlib_uniform_edges, "encode": ttlib_encode},
    forbid=TOKENIZER, atol=1e-9, rtol=1e-12, trials=10, hidden_trials=12,
    passed="your uniform tokenizer is ttlib's.",
    mistakes=[
        Mistake("a value exactly on an edge goes to the bin below: bin b is [e_b, e_{b+1}), so a value equal to "
                "e_b belongs to bin b -- count the interior edges <= x, np.searchsorted(..., side=\"right\").",
                _encode_with(side="left")),
        Mistake("the bins come out as 1 .. K: search only the interior edges e_1 .. e_{K-1} (edges[j, 1:-1]), so "
                "that values below e_1 land in bin 0 and the maximum in bin K - 1.",
                _encode_with(interior=slice(None, -1))),
        Mistake("a constant column gets zero-width bins (every edge the same): give it the range "
                "[min, min + 1e-6] instead (`np.where(hi > lo, hi, lo + 1e-6)`).",
                _edges_with(guard_constant=False)),
        Mistake("K bins need K + 1 edges: np.linspace(0, 1, n_bins + 1), from the minimum to the maximum.",
                _edges_with(n_edges=lambda n_bins: n_bins)),
        Mistake("the minimum and maximum are taken along each row (axis=1): take them down each column "
                "(axis=0), one range per dimension.", _edges_with(axis=1)),
        Mistake("your encode assumes equal-width bins: it must work for any edges, quantile edges too -- count the "
                "interior edges <= x with np.searchsorted(edges[j, 1:-1], x[:, j], side=\"right\").",
                {"encode": _encode_equal_widths}),
    ],
)


# ---- exercise 2: quantile edges ------------------------------------------------------------------------------------
def quantile_trial(rng):
    """(a column 0, 1, ..., m * K with its K; rows and a number of bins; rows whose quantiles rounding will hit)."""
    n_bins, step = int(rng.integers(2, 6)), int(rng.integers(1, 4))
    counting = np.arange(n_bins * step + 1.0)[:, None].repeat(2, axis=1)  # its quantile edges: 0, step, 2 step, ..
    rounded = np.linspace(0, 1, int(rng.integers(10, 60)))[:, None] ** 2 * rng.uniform(0.5, 10, size=2)
    return (counting, n_bins), (table(rng), int(rng.integers(2, 60))), (rounded, int(rng.integers(4, 12)))


def _rounding_quantile(quantile):
    """np.quantile with one edge a hair below its left neighbour, as floating-point rounding can make it."""

    def rounded(*args, **kwargs):
        q = np.array(quantile(*args, **kwargs), dtype=np.float64)
        if q.ndim >= 1 and len(q) > 2:
            q[len(q) // 2] = q[len(q) // 2 - 1] - 1e-9 * (1 + np.abs(q[len(q) // 2 - 1]))
        return q

    return rounded


def run_quantile(answer, trial):
    (counting, counting_bins), (x, n_bins), (rounded, rounded_bins) = trial
    outputs = {f"quantile_edges(x = 0, 1, ..., {len(counting) - 1} in each column, n_bins={counting_bins})":
                   answer.quantile_edges(counting.copy(), counting_bins),
               f"quantile_edges(x of shape {_shape(x)}, n_bins={n_bins})": answer.quantile_edges(x.copy(), n_bins)}
    quantile = np.quantile
    np.quantile = _rounding_quantile(quantile)
    try:
        edges = answer.quantile_edges(rounded.copy(), rounded_bins)
    finally:
        np.quantile = quantile
    outputs["edges that never decrease, when np.quantile's rounding puts an edge below its left neighbour"] = \
        bool(np.all(np.diff(np.asarray(edges, dtype=np.float64), axis=-1) >= 0))
    return outputs


def ttlib_quantile_edges(x, n_bins):
    return fitted_edges(x, n_bins, "quantile")


def _quantiles_with(qs=lambda n_bins: np.linspace(0, 1, n_bins + 1), transpose=True, accumulate=1):
    def quantile_edges(x, n_bins):
        edges = np.quantile(x, qs(n_bins), axis=0)
        edges = edges.T if transpose else edges
        return edges if accumulate is None else np.maximum.accumulate(edges, axis=accumulate)

    return {"quantile_edges": quantile_edges}


def _equal_width_edges(x, n_bins):
    return np.linspace(x.min(axis=0), x.max(axis=0), n_bins + 1).T


quantile_bins = Exercise(
    id="02-quantile", number=2, what="your quantile_edges", names=("quantile_edges",), trial=quantile_trial,
    run=run_quantile, reference={"quantile_edges": ttlib_quantile_edges}, forbid=TOKENIZER, atol=1e-9, rtol=1e-12,
    trials=8, hidden_trials=12, passed="your quantile edges are ttlib's.",
    mistakes=[
        Mistake("your edges decrease where np.quantile's rounding puts an edge a hair below its left neighbour: "
                "edges should never decrease -- make them non-decreasing with np.maximum.accumulate(edges, axis=1).",
                _quantiles_with(accumulate=None)),
        Mistake("K bins need K + 1 quantiles, at 0, 1/K, ..., 1: np.linspace(0, 1, n_bins + 1).",
                _quantiles_with(qs=lambda n_bins: np.linspace(0, 1, n_bins))),
        Mistake("these are equal-width (uniform) edges: quantile edges sit where the data is, at its quantiles, "
                "np.quantile(x, np.linspace(0, 1, n_bins + 1), axis=0).", {"quantile_edges": _equal_width_edges}),
        Mistake("np.quantile(x, qs, axis=0) is (K + 1, D): transpose it to (D, K + 1), one row of edges per "
                "dimension.", _quantiles_with(transpose=False)),
        Mistake("the running maximum runs across the dimensions (axis=0), mixing their edges: run it along each "
                "dimension's own edges, np.maximum.accumulate(edges, axis=1).", _quantiles_with(accumulate=0)),
    ],
)


# ---- exercise 3: what a bin holds, and decoding ---------------------------------------------------------------------
SMALL_X = np.array([[0.0, 5.0], [1.0, 5.0], [5.0, 5.0]])  # (3, 2): a worked case the message can show
SMALL_EDGES = np.array([[0.0, 2.0, 4.0, 6.0], [0.0, 2.0, 4.0, 6.0]])  # (2, 4): three bins, the middle one empty


def decode_trial(rng):
    """(the worked case; a table with ttlib's edges fitted on it, which leave bins empty now and then; bins and
    ttlib's means to decode them with)."""
    x = table(rng)
    edges = fitted_edges(x, int(rng.integers(2, 60)), str(rng.choice(["uniform", "quantile"])))
    means = ttlib_bin_means(x, edges)
    bins = rng.integers(0, means.shape[1], size=(int(rng.integers(1, 40)), len(means)))
    return (SMALL_X, SMALL_EDGES), (x, edges), (bins, means)


def run_decode(answer, trial):
    (small_x, small_edges), (x, edges), (bins, means) = trial
    return {f"bin_means(x {small_x.tolist()}, edges {small_edges.tolist()})": answer.bin_means(small_x, small_edges),
            f"bin_means(x of shape {_shape(x)}, edges of shape {_shape(edges)})": answer.bin_means(x, edges),
            f"decode(bins of shape {_shape(bins)}, means of shape {_shape(means)})": answer.decode(bins, means)}


def ttlib_bin_means(x, edges):
    return TrajectoryTokenizer(edges, edges.shape[0] - 2, 0).fit_means(x).means


def ttlib_decode(bins, means):
    D, K = means.shape
    return TrajectoryTokenizer(np.zeros((D, K + 1)), D - 2, 0, means=means).decode(bins)


def lent_encode(x, edges):  # exercise 1's encode, for bin_means to build on while it is checked
    return np.stack([np.searchsorted(edges[j, 1:-1], x[:, j], side="right") for j in range(x.shape[1])], axis=1)


def _means_with(empty="centre"):
    def bin_means(x, edges):
        bins, K = lent_encode(x, edges), edges.shape[1] - 1
        out = np.full((len(edges), K), np.nan) if empty == "nan" else np.zeros((len(edges), K))
        for d in range(len(edges)):
            counts = np.bincount(bins[:, d], minlength=K)
            sums = np.bincount(bins[:, d], weights=x[:, d], minlength=K)
            with np.errstate(invalid="ignore", divide="ignore"):
                out[d] = np.where(counts > 0, sums / counts, out[d])
        return out

    return {"bin_means": bin_means}


def _decode_with(shift=0, by_dimension=True):
    def decode(bins, means):
        if not by_dimension:
            return means[bins]
        return means[np.arange(means.shape[0]), np.minimum(bins + shift, means.shape[1] - 1)]

    return {"decode": decode}


decoding = Exercise(
    id="02-decode", number=3, what="your bin_means and decode", names=("bin_means", "decode"), trial=decode_trial,
    run=run_decode, reference={"bin_means": ttlib_bin_means, "decode": ttlib_decode}, lends={"encode": lent_encode},
    forbid=TOKENIZER, atol=1e-9, rtol=1e-9, trials=10, hidden_trials=12,
    passed="your bin_means and decode are ttlib's.",
    mistakes=[
        Mistake("every bin decodes to its centre, not to the mean of what it holds: average the values of x that "
                "fall in each bin (a leg contact's bin of zeros then decodes to 0, not to 0.5).",
                {"bin_means": lambda x, edges: (edges[:, :-1] + edges[:, 1:]) / 2}),
        Mistake("a bin that no value falls in has no mean (0 / 0 is NaN): let an empty bin decode to its centre, "
                "(e_b + e_{b+1}) / 2.", _means_with(empty="nan")),
        Mistake("an empty bin decodes to 0: let it decode to its centre, (e_b + e_{b+1}) / 2, which at least lies "
                "inside it.", _means_with(empty="zero")),
        Mistake("every bin decodes to what the bin to its right holds: index the means with the bins themselves, "
                "means[np.arange(D), bins].", _decode_with(shift=1)),
        Mistake("the means are indexed by the bins alone: index them with the dimension too, "
                "means[np.arange(D), bins], so that column d reads dimension d's means.",
                _decode_with(by_dimension=False)),
    ],
)

EXERCISES = [uniform_bins, quantile_bins, decoding]
