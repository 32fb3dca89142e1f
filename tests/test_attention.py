"""The KV cache is exactly the uncached computation: every next-token logit agrees to 1e-5."""

import pytest
import torch

from ttlib.model.attention import CacheFullError, explicit_attention, fast_attention
from ttlib.model.gpt import GPTConfig, TrajectoryGPT


def small_model(seed=0, **overrides):
    torch.manual_seed(seed)
    config = GPTConfig(obs_dim=3, act_dim=2, n_bins=13, n_layer=2, n_head=2, n_embd=32, n_transitions=5,
                       dropout=0.0, **overrides)
    return TrajectoryGPT(config).eval()


def test_explicit_attention_matches_sdpa():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 9, 8) for _ in range(3))
    allowed = torch.tril(torch.ones(9, 9, dtype=torch.bool))
    allowed[:, 4] = False
    allowed[4, 4] = True
    torch.testing.assert_close(explicit_attention(q, k, v, allowed), fast_attention(q, k, v, allowed),
                               atol=1e-5, rtol=1e-5)


@pytest.mark.exactness
@pytest.mark.parametrize("seed", range(5))
def test_cached_decoding_equals_full_recompute(seed, device):
    model = small_model(seed).to(device)
    g = torch.Generator().manual_seed(seed)
    B, T = 3, model.config.block_size
    bins = torch.randint(0, 13, (B, T), generator=g).to(device)
    prefix = int(torch.randint(1, T - 1, (1,), generator=g))
    with torch.no_grad():
        full, _ = model(bins)
        cache = model.new_cache(B)
        pieces = [model(bins[:, :prefix], cache=cache)[0]]
        pieces += [model(bins[:, t:t + 1], cache=cache)[0] for t in range(prefix, T)]
    torch.testing.assert_close(torch.cat(pieces, 1), full, atol=1e-5, rtol=0)


def test_value_rule_holds_in_cached_decoding():
    """Changing an earlier value token changes nothing downstream, cached or not (the value rule)."""
    model = small_model(1)
    td = model.config.transition_dim
    bins = torch.randint(0, 13, (1, 3 * td))
    other = bins.clone()
    other[0, td - 1] = (bins[0, td - 1] + 5) % 13  # the first transition's value token
    with torch.no_grad():
        a, b = model(bins)[0], model(other)[0]
        cache_a, cache_b = model.new_cache(1), model.new_cache(1)
        ca = torch.cat([model(bins[:, t:t + 1], cache=cache_a)[0] for t in range(3 * td)], 1)
        cb = torch.cat([model(other[:, t:t + 1], cache=cache_b)[0] for t in range(3 * td)], 1)
    # the value token's own position still sees its embedding (residual stream); every *later* position must not
    torch.testing.assert_close(a[:, td:], b[:, td:], atol=1e-6, rtol=0)
    torch.testing.assert_close(ca[:, td:], cb[:, td:], atol=1e-6, rtol=0)
    assert not torch.allclose(a[:, td - 1], b[:, td - 1])


@pytest.mark.exactness
def test_reorder_matches_full_recompute(device):
    """Beam search's reorder: keep, drop and duplicate rows, then continue decoding: the same as recomputing."""
    model = small_model(2).to(device)
    T = model.config.block_size
    B, P = 6, 8
    torch.manual_seed(3)
    rows = torch.randint(0, 13, (B, T)).to(device)
    with torch.no_grad():
        cache = model.new_cache(B)
        model(rows[:, :P], cache=cache)
        outs = [model(rows[:, t:t + 1], cache=cache)[0] for t in range(P, P + 5)]
        full = model(rows)[0]
        torch.testing.assert_close(torch.cat(outs, 1), full[:, P:P + 5], atol=1e-5, rtol=0)
        keep = torch.tensor([2, 2, 0, 5, 3, 3], device=device)
        cache.reorder(keep)
        rows = rows[keep].clone()
        rows[:, P + 5:] = torch.randint(0, 13, rows[:, P + 5:].shape).to(device)
        full = model(rows)[0]
        outs = [model(rows[:, t:t + 1], cache=cache)[0] for t in range(P + 5, T)]
    torch.testing.assert_close(torch.cat(outs, 1), full[:, P + 5:], atol=1e-5, rtol=0)


def test_full_cache_raises_clearly():
    model = small_model()
    cache = model.new_cache(1, capacity=4)
    model(torch.zeros(1, 4, dtype=torch.long), cache=cache)
    with pytest.raises(CacheFullError, match="full"):
        model(torch.zeros(1, 1, dtype=torch.long), cache=cache)


def test_sequence_longer_than_block_raises():
    model = small_model()
    with pytest.raises(ValueError, match="block size"):
        model(torch.zeros(1, model.config.block_size + 1, dtype=torch.long))
