import numpy as np
import pytest
import torch

from ttlib.tokenizer import ClippingWarning, TokenizerRangeError, TrajectoryTokenizer


def sample_rows(n=5000, seed=0):
    rng = np.random.default_rng(seed)
    obs = rng.normal(size=(n, 3)) * [1, 10, 0.1]
    act = rng.uniform(-1, 1, size=(n, 2))
    reward = rng.exponential(size=n)
    value = rng.normal(size=n) * 50
    return np.concatenate([obs, act, reward[:, None], value[:, None]], axis=1)


@pytest.mark.parametrize("strategy", ["uniform", "quantile"])
def test_round_trip_within_half_a_bin(strategy):
    rows = sample_rows()
    tok = TrajectoryTokenizer.fit(rows, 3, 2, n_bins=50, strategy=strategy)
    bins = tok.encode(rows)
    assert bins.shape == rows.shape and bins.min() >= 0 and bins.max() < 50
    error = np.abs(tok.decode(bins) - rows)  # (N, td)
    half_width = tok.bin_widths[np.arange(rows.shape[1]), bins] / 2  # each value's own bin
    assert np.all(error <= half_width + 1e-9)


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
    c = tok.centers[tok.reward_dim]
    torch.testing.assert_close(got, torch.tensor([c[3], (c[2] + c[4]) / 2], dtype=torch.float64))


def test_save_and_load(tmp_path):
    tok = TrajectoryTokenizer.fit(sample_rows(), 3, 2, n_bins=10, strategy="uniform")
    tok.save(tmp_path / "tok.json")
    again = TrajectoryTokenizer.load(tmp_path / "tok.json")
    np.testing.assert_array_equal(again.edges, tok.edges)
    assert again.strategy == "uniform" and again.obs_dim == 3 and again.act_dim == 2
    assert list(tmp_path.iterdir()) == [tmp_path / "tok.json"]  # no temporary file left behind


def test_bad_input():
    with pytest.raises(ValueError, match="strategy"):
        TrajectoryTokenizer.fit(sample_rows(), 3, 2, strategy="log")
    with pytest.raises(ValueError, match=r"expected \(N, 7\)"):
        TrajectoryTokenizer.fit(sample_rows()[:, :5], 3, 2)
    tok = TrajectoryTokenizer.fit(sample_rows(), 3, 2, n_bins=10)
    with pytest.raises(ValueError, match="bins must lie"):
        tok.decode(np.array([[10, 0, 0, 0, 0, 0, 0]]))
