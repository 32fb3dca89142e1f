import json

import numpy as np
import pytest
import torch

from ttlib.model.tokenizer import ClippingWarning, NoBinMeansWarning, TokenizerRangeError, TrajectoryTokenizer


def sample_rows(n=5000, seed=0):
    rng = np.random.default_rng(seed)
    obs = rng.normal(size=(n, 3)) * [1, 10, 0.1]
    act = rng.uniform(-1, 1, size=(n, 2))
    reward = rng.exponential(size=n)
    value = rng.normal(size=n) * 50
    return np.concatenate([obs, act, reward[:, None], value[:, None]], axis=1)


def with_discrete_columns(rows, seed=0):
    """rows with obs 1 a leg contact (0 or 1, mostly 0) and obs 2 a three-way switch (-1, 0, 2)."""
    rng = np.random.default_rng(seed)
    rows = rows.copy()
    rows[:, 1] = (rng.uniform(size=len(rows)) < 0.3).astype(np.float64)
    rows[:, 2] = rng.choice([-1.0, 0.0, 2.0], size=len(rows), p=[0.2, 0.7, 0.1])
    return rows


@pytest.mark.parametrize("strategy", ["uniform", "quantile"])
def test_a_value_comes_back_inside_its_own_bin_at_the_mean_of_what_the_bin_holds(strategy):
    rows = sample_rows()
    tok = TrajectoryTokenizer.fit(rows, 3, 2, n_bins=50, strategy=strategy)
    bins = tok.encode(rows)
    assert bins.shape == rows.shape and bins.min() >= 0 and bins.max() < 50
    back = tok.decode(bins)  # (N, td)
    d = np.arange(rows.shape[1])
    assert np.all(back >= tok.edges[d, bins] - 1e-9) and np.all(back <= tok.edges[d, bins + 1] + 1e-9)
    for j in range(rows.shape[1]):  # the error of every bin's values averages to zero: the decoded value is unbiased
        sums = np.bincount(bins[:, j], weights=back[:, j] - rows[:, j], minlength=50)
        np.testing.assert_allclose(sums, 0, atol=1e-8)
    centres = tok.centers[d, bins]  # the mean is the one number per bin with the least squared error
    assert np.all(((back - rows) ** 2).sum(0) <= ((centres - rows) ** 2).sum(0) + 1e-9)


@pytest.mark.parametrize("strategy", ["uniform", "quantile"])
def test_binary_and_discrete_dimensions_decode_exactly(strategy):
    rows = with_discrete_columns(sample_rows())
    tok = TrajectoryTokenizer.fit(rows, 3, 2, n_bins=100, strategy=strategy)
    back = tok.decode(tok.encode(rows))
    np.testing.assert_array_equal(back[:, 1:3], rows[:, 1:3])  # exactly: "leg up" is 0.0, not half a bin
    if strategy == "quantile":  # where a bin's centre would have been off by half the bin
        assert np.abs(tok.centers[1, tok.encode(rows)[:, 1]] - rows[:, 1]).max() == 0.5


def test_an_empty_bin_decodes_to_its_centre():
    rows = with_discrete_columns(sample_rows())
    tok = TrajectoryTokenizer.fit(rows, 3, 2, n_bins=10, strategy="uniform")
    used = np.unique(tok.encode(rows)[:, 1])
    assert list(used) == [0, 9]  # a leg contact fills the first and the last bin only
    np.testing.assert_array_equal(tok.means[1, 1:9], tok.centers[1, 1:9])
    assert tok.means[1, 0] == 0.0 and tok.means[1, 9] == 1.0


def test_quantile_bins_hold_about_equal_counts():
    rows = sample_rows(20000)
    tok = TrajectoryTokenizer.fit(rows, 3, 2, n_bins=20, strategy="quantile")
    bins = tok.encode(rows)
    for d in range(rows.shape[1]):
        counts = np.bincount(bins[:, d], minlength=20)
        assert counts.min() > 0.8 * counts.mean() and counts.max() < 1.2 * counts.mean(), (d, counts)


def test_uniform_bins_have_equal_width():
    tok = TrajectoryTokenizer.fit(sample_rows(), 3, 2, n_bins=10, strategy="uniform")
    np.testing.assert_allclose(tok.bin_widths, tok.bin_widths[:, :1].repeat(10, axis=1))


def test_out_of_range_values_are_clipped_and_reported():
    tok = TrajectoryTokenizer.fit(sample_rows(), 3, 2, n_bins=10)
    lo, hi = tok.edges[0, 0], tok.edges[0, -1]
    obs = np.array([[lo - 100, 0, 0], [hi + 100, 0, 0], [0, 0, 0]])
    assert tok.out_of_range(obs, slice(0, 3)) == 2
    with pytest.warns(ClippingWarning, match="2 of 9 values"):
        bins = tok.encode(obs, slice(0, 3))
    assert bins[0, 0] == 0 and bins[1, 0] == 9
    with pytest.raises(TokenizerRangeError, match="outside"):
        tok.encode(obs, slice(0, 3), on_clip="raise")


def test_offsets_layout_and_expectation():
    tok = TrajectoryTokenizer.fit(sample_rows(), 3, 2, n_bins=10)
    assert tok.transition_dim == 7 and tok.reward_dim == 5 and tok.value_dim == 6
    assert list(tok.offsets) == [0, 10, 20, 30, 40, 50, 60]
    probs = torch.zeros(2, 10, dtype=torch.float64)
    probs[0, 3] = 1
    probs[1, [2, 4]] = 0.5
    got = tok.expectation(probs, tok.reward_dim)
    c = tok.means[tok.reward_dim]  # the mean over what the bins hold
    torch.testing.assert_close(got, torch.tensor([c[3], (c[2] + c[4]) / 2], dtype=torch.float64))


def test_save_and_load(tmp_path):
    tok = TrajectoryTokenizer.fit(sample_rows(), 3, 2, n_bins=10, strategy="uniform")
    tok.save(tmp_path / "tok.json")
    again = TrajectoryTokenizer.load(tmp_path / "tok.json")
    np.testing.assert_array_equal(again.edges, tok.edges)
    assert again.strategy == "uniform" and again.obs_dim == 3 and again.act_dim == 2
    np.testing.assert_array_equal(again.means, tok.means)
    assert list(tmp_path.iterdir()) == [tmp_path / "tok.json"]  # no temporary file left behind
    assert json.loads(json.dumps(tok.state_dict())) == tok.state_dict()  # plain JSON, nothing else


def test_a_tokenizer_saved_without_means_still_loads_decodes_to_centres_and_says_how_to_refresh():
    rows = with_discrete_columns(sample_rows())
    tok = TrajectoryTokenizer.fit(rows, 3, 2, n_bins=100)
    old = {k: v for k, v in tok.state_dict().items() if k != "means"}  # as ttlib saved it before
    with pytest.warns(NoBinMeansWarning, match="tools.refresh_tokenizer"):
        stale = TrajectoryTokenizer.from_state_dict(old)
    assert not stale.has_means and "means" not in stale.state_dict()  # saved again, it claims no means
    np.testing.assert_array_equal(stale.decode(tok.encode(rows)), tok.centers[np.arange(7), tok.encode(rows)])
    stale.fit_means(rows)  # refreshed from the data it was fitted on: the same as a fresh fit
    assert stale.has_means
    np.testing.assert_array_equal(stale.means, tok.means)
    np.testing.assert_array_equal(stale.decode(stale.encode(rows))[:, 1], rows[:, 1])


def test_bad_input():
    with pytest.raises(ValueError, match="strategy"):
        TrajectoryTokenizer.fit(sample_rows(), 3, 2, strategy="log")
    with pytest.raises(ValueError, match=r"expected \(N, 7\)"):
        TrajectoryTokenizer.fit(sample_rows()[:, :5], 3, 2)
    tok = TrajectoryTokenizer.fit(sample_rows(), 3, 2, n_bins=10)
    with pytest.raises(ValueError, match=r"expected \(N, 7\)"):
        tok.fit_means(sample_rows()[:, :6])
    with pytest.raises(ValueError, match="means must be"):
        TrajectoryTokenizer(tok.edges, 3, 2, means=tok.means[:, :5])
    with pytest.raises(ValueError, match="bins must lie"):
        tok.decode(np.array([[10, 0, 0, 0, 0, 0, 0]]))
