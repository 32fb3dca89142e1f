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
    ("02-decode", "every bin decodes to its centre", ("        means[d, filled] = sums[filled] / counts[filled]\n",
                                                      "        pass\n"),
     "every bin decodes to its centre, not to the mean of what it holds"),
    ("02-decode", "the mean of an empty bin is 0 / 0", ("        filled = counts > 0\n        means[d, filled] = "
                                                        "sums[filled] / counts[filled]\n",
                                                        "        with np.errstate(invalid=\"ignore\"):\n"
                                                        "            means[d] = sums / counts\n"),
     "a bin that no value falls in has no mean"),
    ("02-decode", "means one bin to the right", ("means[np.arange(means.shape[0]), bins]",
                                                 "means[np.arange(means.shape[0]), np.minimum(bins + 1, "
                                                 "means.shape[1] - 1)]"),
     "what the bin to its right holds"),
    ("02-decode", "delegates to ttlib's decode", '''def bin_means(x, edges):
    return TrajectoryTokenizer(edges, edges.shape[0] - 2, 0).fit_means(x).means


def decode(bins, means):
    return means[np.arange(means.shape[0]), bins]
''', REFUSED),
    # not in the catalogue before
    ("02-decode", "empty bins decode to 0", ("    means = (edges[:, :-1] + edges[:, 1:]) / 2  # (D, K): the centres, "
                                            "kept where a bin is empty",
                                            "    means = np.zeros((edges.shape[0], K))"),
     "an empty bin decodes to 0"),
    ("02-decode", "means indexed by the bins alone", ("means[np.arange(means.shape[0]), bins]", "means[bins]"),
     "the means are indexed by the bins alone"),
    ("02-decode", "the midpoint without brackets for empty bins: e_b + e_{b+1} / 2",  # no diagnosis: where it differs
     ("(edges[:, :-1] + edges[:, 1:]) / 2", "edges[:, :-1] + edges[:, 1:] / 2"),
     "bin_means(x [[0.0, 5.0], [1.0, 5.0], [5.0, 5.0]], edges [[0.0, 2.0, 4.0, 6.0], [0.0, 2.0, 4.0, 6.0]]): "),
]
