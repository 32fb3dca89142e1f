"""Wrong answers to notebook 02's exercises (see tests/test_exercises.py for the format)."""

REFUSED = "refuses to run"  # what a delegating answer's failure says (ttlib.exercises.refuse)

ANSWERS = [
    ("02-uniform", "a value exactly on an edge goes to the bin below", ('side="right"', 'side="left"'),
     "a value exactly on an edge goes to the bin below"),
    ("02-uniform", "every edge searched, not the interior ones (bins 1..K)", ("edges[j, 1:-1]", "edges[j, :-1]"),
     "the bins come out as 1 .. K"),
    ("02-uniform", "a constant column gets zero-width bins", ("hi = np.where(hi > lo, hi, lo + 1e-6)", "hi = hi"),
     "a constant column gets zero-width bins"),
    ("02-uniform", "n_bins edges instead of n_bins + 1", ("np.linspace(0, 1, n_bins + 1)",
                                                          "np.linspace(0, 1, n_bins)"), "K bins need K + 1 edges"),
    ("02-uniform", "delegates to ttlib's tokenizer", '''def uniform_edges(x, n_bins):
    return TrajectoryTokenizer.fit(x, x.shape[1] - 2, 0, n_bins, "uniform").edges


def encode(x, edges):
    return TrajectoryTokenizer(edges, edges.shape[0] - 2, 0, "uniform").encode(x, on_clip="ignore")
''', REFUSED),
    # not in the catalogue before: slips a learner makes
    ("02-uniform", "the range of each row, not of each column", ("lo, hi = x.min(axis=0), x.max(axis=0)",
                                                                 "lo, hi = x.min(axis=1), x.max(axis=1)"),
     "taken along each row (axis=1)"),
    ("02-uniform", "encode by arithmetic, as if every bin had the same width", '''def uniform_edges(x, n_bins):
    lo, hi = x.min(axis=0), x.max(axis=0)
    hi = np.where(hi > lo, hi, lo + 1e-6)
    edges = lo[:, None] + (hi - lo)[:, None] * np.linspace(0, 1, n_bins + 1)[None, :]
    edges[:, 0], edges[:, -1] = lo, hi
    return edges


def encode(x, edges):
    lo, hi = edges[:, 0], edges[:, -1]
    n_bins = edges.shape[1] - 1
    return np.clip(np.floor((x - lo) / (hi - lo) * n_bins), 0, n_bins - 1).astype(np.int64)
''', "your encode assumes equal-width bins"),
    ("02-uniform", "np.digitize over every edge, minus one (no clipping)",  # no diagnosis: where it differs
     ('np.searchsorted(edges[j, 1:-1], x[:, j], side="right")', "np.digitize(x[:, j], edges[j]) - 1"),
     "encode(values in and outside the fitted range, edges of shape "),
    ("02-quantile", "edges that rounding can make decrease", ("return np.maximum.accumulate(edges, axis=1)",
                                                           "return edges"), "edges should never decrease"),
    ("02-quantile", "quantiles at 0, 1/(K-1), ..., 1", ("np.linspace(0, 1, n_bins + 1)", "np.linspace(0, 1, n_bins)"),
     "K bins need K + 1 quantiles"),
    ("02-quantile", "equal-width edges, not quantiles", '''def quantile_edges(x, n_bins):
    return np.linspace(x.min(axis=0), x.max(axis=0), n_bins + 1).T
''', "these are equal-width (uniform) edges"),
    ("02-quantile", "delegates to ttlib's tokenizer", '''def quantile_edges(x, n_bins):
    return TrajectoryTokenizer.fit(x, x.shape[1] - 2, 0, n_bins, "quantile").edges
''', REFUSED),
    # not in the catalogue before
    ("02-quantile", "np.quantile's (K + 1, D) not transposed", ("axis=0).T  # (D, K + 1)", "axis=0)"),
     "transpose it to (D, K + 1)"),
    ("02-quantile", "the running maximum across the dimensions", ("np.maximum.accumulate(edges, axis=1)",
                                                                   "np.maximum.accumulate(edges, axis=0)"),
     "the running maximum runs across the dimensions"),
    ("02-quantile", "np.percentile given fractions, not percents",  # no diagnosis: where it differs
     ("np.quantile(x, np.linspace(0, 1, n_bins + 1), axis=0)",
      "np.percentile(x, np.linspace(0, 1, n_bins + 1), axis=0)"),
     "quantile_edges(x = 0, 1, ..., 10 in each column, n_bins=5): "),
    ("02-decode", "left edges instead of centres", ("(edges[:, :-1] + edges[:, 1:]) / 2", "edges[:, :-1]"),
     "a bin decodes to its left edge"),
    ("02-decode", "centres one bin to the right", ("centres[np.arange(edges.shape[0]), bins]",
                                                   "centres[np.arange(edges.shape[0]), np.minimum(bins + 1, "
                                                   "centres.shape[1] - 1)]"),
     "the centre of the bin to its right"),
    ("02-decode", "delegates to ttlib's decode", '''def decode(bins, edges):
    return TrajectoryTokenizer(edges, edges.shape[0] - 2, 0).decode(bins)
''', REFUSED),
    ("02-decode", "reads ttlib's bin centres", '''def decode(bins, edges):
    centres = TrajectoryTokenizer(edges, edges.shape[0] - 2, 0).centers
    return centres[np.arange(edges.shape[0]), bins]
''', REFUSED),
    # not in the catalogue before
    ("02-decode", "right edges instead of centres", ("(edges[:, :-1] + edges[:, 1:]) / 2", "edges[:, 1:]"),
     "a bin decodes to its right edge"),
    ("02-decode", "centres indexed by the bins alone", ("centres[np.arange(edges.shape[0]), bins]", "centres[bins]"),
     "the centres are indexed by the bins alone"),
    ("02-decode", "the midpoint without brackets: e_b + e_{b+1} / 2",  # no diagnosis: where it differs
     ("(edges[:, :-1] + edges[:, 1:]) / 2", "edges[:, :-1] + edges[:, 1:] / 2"),
     "decode(bins [[0], [1]], edges [[0.0, 3.0, 5.0]]): 1 of 2 entries differ"),
]
