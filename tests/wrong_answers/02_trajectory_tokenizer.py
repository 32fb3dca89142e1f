"""Wrong answers to notebook 02's exercises (see tests/test_exercises.py for the format)."""

REFUSED = "refuses to run"  # what a delegating answer's failure says (ttlib.checks.forbidding)

ANSWERS = [
    ("02-uniform", "a value exactly on an edge goes to the bin below", ('side="right"', 'side="left"')),
    ("02-uniform", "every edge searched, not the interior ones (bins 1..K)", ("edges[j, 1:-1]", "edges[j, :-1]")),
    ("02-uniform", "a constant column gets zero-width bins", ("hi = np.where(hi > lo, hi, lo + 1e-6)", "hi = hi")),
    ("02-uniform", "n_bins edges instead of n_bins + 1", ("np.linspace(0, 1, n_bins + 1)",
                                                          "np.linspace(0, 1, n_bins)")),
    ("02-uniform", "delegates to ttlib's tokenizer", '''def uniform_edges(x, n_bins):
    return TrajectoryTokenizer.fit(x, x.shape[1] - 2, 0, n_bins, "uniform").edges


def encode(x, edges):
    return TrajectoryTokenizer(edges, edges.shape[0] - 2, 0, "uniform").encode(x, on_clip="ignore")
''', REFUSED),
    ("02-quantile", "edges that rounding can make decrease", ("return np.maximum.accumulate(edges, axis=1)",
                                                           "return edges")),
    ("02-quantile", "quantiles at 0, 1/(K-1), ..., 1", ("np.linspace(0, 1, n_bins + 1)", "np.linspace(0, 1, n_bins)")),
    ("02-quantile", "equal-width edges, not quantiles", '''def quantile_edges(x, n_bins):
    return np.linspace(x.min(axis=0), x.max(axis=0), n_bins + 1).T
'''),
    ("02-quantile", "delegates to ttlib's tokenizer", '''def quantile_edges(x, n_bins):
    return TrajectoryTokenizer.fit(x, x.shape[1] - 2, 0, n_bins, "quantile").edges
''', REFUSED),
    ("02-decode", "left edges instead of centres", ("(edges[:, :-1] + edges[:, 1:]) / 2", "edges[:, :-1]")),
    ("02-decode", "centres one bin to the right", ("centres[np.arange(edges.shape[0]), bins]",
                                                   "centres[np.arange(edges.shape[0]), np.minimum(bins + 1, "
                                                   "centres.shape[1] - 1)]")),
    ("02-decode", "delegates to ttlib's decode", '''def decode(bins, edges):
    return TrajectoryTokenizer(edges, edges.shape[0] - 2, 0).decode(bins)
''', REFUSED),
    ("02-decode", "reads ttlib's bin centres", '''def decode(bins, edges):
    centres = TrajectoryTokenizer(edges, edges.shape[0] - 2, 0).centers
    return centres[np.arange(edges.shape[0]), bins]
''', REFUSED),
]
