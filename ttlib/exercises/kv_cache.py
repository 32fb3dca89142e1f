"""Notebook 04's exercises: the KV cache -- storing keys and values, one cached attention layer, the cached forward
pass, reordering rows for beam search, and a cache's size in bytes.

A cache is state: every trial holds the buffers a cache starts from (noise in every slot, so that a write to the
wrong slot shows), and `run` builds a fresh KVCache from them for each answer, calls it, and returns the state the
call left behind ("the cache's keys after your write_kv(...)") next to what it returned.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ttlib.exercises import Exercise, Mistake
from ttlib.exercises.attention import merge_heads, merge_unmoved, split_heads, split_plain_view
from ttlib.model.attention import CausalSelfAttention, KVCache, explicit_attention
from ttlib.model.gpt import Block, GPTConfig, TrajectoryGPT

__all__ = ["EXERCISES", "Stored", "allocated_bytes", "attention_trial", "bytes_trial", "cached_layer", "cached_pass",
           "forward_trial", "lent_cached_attention", "lent_write_kv", "reorder_trial", "reordering", "run_attention",
           "run_bytes", "run_forward", "run_reorder", "run_write", "sizing", "storing", "ttlib_cached_attention",
           "ttlib_forward", "ttlib_reorder", "ttlib_write_kv", "write_trial"]


@dataclass
class Stored:
    """What a cache holds before the call: its buffers (n_layer, batch, n_head, capacity, head_dim) and length."""

    k: torch.Tensor
    v: torch.Tensor
    length: int

    @classmethod
    def noise(cls, n_layer, batch, n_head, head_dim, capacity, length: int) -> Stored:
        shape = (n_layer, batch, n_head, capacity, head_dim)
        return cls(torch.randn(shape), torch.randn(shape), length)

    def cache(self) -> KVCache:
        """A fresh KVCache holding these buffers (copies: no answer changes the trial)."""
        n_layer, batch, n_head, capacity, head_dim = self.k.shape
        cache = KVCache(n_layer, batch, n_head, head_dim, capacity, dtype=self.k.dtype)
        cache.k.copy_(self.k)
        cache.v.copy_(self.v)
        cache.length = self.length
        return cache


def _tokens(n: int) -> str:
    return f"{n} new token" + ("" if n == 1 else "s")


def _two_tensors(result, what: str):
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        raise AssertionError(f"{what} should return two tensors, (keys, values), got {type(result).__name__}"
                             + (f" of {len(result)}" if isinstance(result, (tuple, list)) else ""))
    return result


# ---- exercise 1: write_kv ----------------------------------------------------------------------------------------
def write_trial(rng):
    n_layer, batch, n_head, head_dim = (int(x) for x in rng.integers(1, 4, size=4))
    capacity = int(rng.integers(2, 20))
    length = int(rng.integers(0, capacity))
    T = int(rng.integers(1, capacity - length + 1))
    stored = Stored.noise(n_layer, batch, n_head, head_dim, capacity, length)
    return stored, int(rng.integers(0, n_layer)), torch.randn(batch, n_head, T, head_dim), \
        torch.randn(batch, n_head, T, head_dim)


def run_write(answer, trial):
    stored, layer, k, v = trial
    cache = stored.cache()
    call = f"write_kv(cache of length {stored.length}, layer {layer}, {_tokens(k.shape[2])})"
    keys, values = _two_tensors(answer.write_kv(cache, layer, k, v), f"your {call}")
    return {f"the cache's keys after your {call}": cache.k, f"the cache's values after your {call}": cache.v,
            f"the keys your {call} returns": keys, f"the values your {call} returns": values,
            f"cache.length after your {call}": cache.length}


def ttlib_write_kv(cache, layer, k, v):
    return cache.write(layer, k, v)


def _write_with(offset=lambda start: start, returned="all", v_from_k=False, advance=False):
    def write_kv(cache, layer, k, v):
        start, T = offset(cache.length), k.shape[2]
        cache.k[layer, :, :, start:start + T] = k
        cache.v[layer, :, :, start:start + T] = k if v_from_k else v
        end = start + T if returned == "all" else start
        if advance:
            cache.length += T
        return cache.k[layer, :, :, :end], cache.v[layer, :, :, :end]

    return {"write_kv": write_kv}


lent_write_kv = _write_with()["write_kv"]  # exercise 1's piece, lent to exercise 2: ttlib's write, not calling it


storing = Exercise(
    id="04-write", number=1, what="your write_kv", names=("write_kv",), trial=write_trial, run=run_write,
    reference={"write_kv": ttlib_write_kv},
    forbid=(KVCache.write, KVCache.reorder, CausalSelfAttention.forward, _write_with()["write_kv"]),
    atol=0.0, trials=10, hidden_trials=20, passed="your write_kv stores keys and values where ttlib's KVCache does.",
    mistakes=[
        Mistake("writes at the wrong offset: the new tokens go one slot too far. The first new token belongs in slot "
                "cache.length (slots count from 0), so write slots [cache.length, cache.length + T).",
                _write_with(offset=lambda start: start + 1)),
        Mistake("writes at the wrong offset: the new tokens go to slots 0 .. T-1, over the tokens already stored. "
                "They belong after them, in slots [cache.length, cache.length + T).",
                _write_with(offset=lambda start: 0)),
        Mistake("returns only the tokens stored before this call: attention needs every token so far, the new ones "
                "included, so return the slots up to cache.length + T.", _write_with(returned="before")),
        Mistake("the keys are stored in the values' buffer too: cache.v must receive v.", _write_with(v_from_k=True)),
        Mistake("write_kv advances cache.length: every layer writes at the same slots, so the position may only "
                "move once, after the last layer (the forward pass does that, exercise 3).",
                _write_with(advance=True)),
    ],
)


# ---- exercise 2: one cached attention layer ----------------------------------------------------------------------
def attention_trial(rng):
    H = int(rng.integers(1, 4))
    C, B = H * int(rng.integers(1, 6)), int(rng.integers(1, 4))
    attn = CausalSelfAttention(C, H).eval()
    for p in attn.parameters():
        torch.nn.init.normal_(p, std=0.5)  # large weights: sharp attention, so that a wrong key or mask shows
    capacity, n_layer = int(rng.integers(2, 16)), int(rng.integers(1, 3))
    stored = Stored.noise(n_layer, B, H, C // H, capacity, int(rng.integers(0, capacity)))
    T = int(rng.integers(1, capacity - stored.length + 1))
    allowed = torch.rand(T, stored.length + T) < 0.6
    allowed[:, stored.length:] &= torch.tril(torch.ones(T, T, dtype=torch.bool))  # causal among the new tokens
    allowed[:, stored.length:] |= torch.eye(T, dtype=torch.bool)  # every new token sees itself
    return attn, torch.randn(B, T, C), allowed, stored, int(rng.integers(0, n_layer))


def run_attention(answer, trial):
    attn, x, allowed, stored, layer = trial
    cache = stored.cache()
    call = (f"cached_attention(x of shape {tuple(x.shape)}, {attn.n_head} heads, layer {layer}, "
            f"{stored.length} tokens stored)")
    with torch.no_grad():
        y = answer.cached_attention(attn, x, allowed, cache, layer)
    return {f"the cache's keys after your {call}": cache.k, f"the cache's values after your {call}": cache.v,
            f"the output of your {call}": y}


def ttlib_cached_attention(attn, x, allowed, cache, layer):
    return attn(x, allowed, cache, layer)


def _attention_with(stored=True, masked=True, split=split_heads, merge=merge_heads, project=True):
    def cached_attention(attn, x, allowed, cache, layer):
        B, T, C = x.shape
        q, k, v = (split(z, attn.n_head) for z in attn.qkv(x).split(C, dim=2))  # each (B, H, T, D)
        keys, values = lent_write_kv(cache, layer, k, v)
        if not stored:
            keys, values, allowed = k, v, allowed[:, -T:]
        y = merge(explicit_attention(q, keys, values, allowed if masked else torch.ones_like(allowed)))
        return attn.proj(y) if project else y

    return {"cached_attention": cached_attention}


# exercise 2's piece, lent to exercise 3: ttlib's cached attention, written here so that the layer's forward and
# the cache's write can refuse to run while exercise 3 is checked
lent_cached_attention = _attention_with()["cached_attention"]


cached_layer = Exercise(
    id="04-attention", number=2, what="your cached_attention", names=("cached_attention",), trial=attention_trial,
    run=run_attention, reference={"cached_attention": ttlib_cached_attention}, lends={"write_kv": lent_write_kv},
    forbid=(CausalSelfAttention.forward, Block.forward, torch.nn.MultiheadAttention, KVCache.write,
            _attention_with()["cached_attention"]), atol=1e-4, trials=10,
    hidden_trials=15, passed="your cached attention layer computes what ttlib's does, and fills the same cache.",
    mistakes=[
        Mistake("the new tokens attend only to each other: attend over *all* the keys and values write_kv returns "
                "(the stored tokens and the new ones), with the whole `allowed`.", _attention_with(stored=False)),
        Mistake("the mask is ignored: the new tokens see every stored token, value tokens included (Faster-TT's "
                "bug). Pass `allowed` to explicit_attention: it carries the causal rule and the value rule.",
                _attention_with(masked=False)),
        Mistake("the heads are merged without moving the head axis back: transpose (B, H, T, D) to (B, T, H, D) "
                "first, then reshape to (B, T, C).", _attention_with(merge=merge_unmoved)),
        Mistake("the heads are split by a plain view to (B, H, T, D): that interleaves tokens and channels. View "
                "as (B, T, H, D), then transpose(1, 2).", _attention_with(split=split_plain_view)),
        Mistake("the output projection is missing: after merging the heads, `attn.proj` mixes them.",
                _attention_with(project=False)),
    ],
)


# ---- exercise 3: the cached forward pass -------------------------------------------------------------------------
def forward_trial(rng):
    H = int(rng.integers(1, 3))
    config = GPTConfig(obs_dim=int(rng.integers(1, 4)), act_dim=int(rng.integers(1, 3)),
                       n_bins=int(rng.integers(3, 12)), n_layer=int(rng.integers(1, 4)), n_head=H,
                       n_embd=4 * H, n_transitions=3, dropout=0.0)
    model = TrajectoryGPT(config).eval()
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.5)  # large weights, so that a wrong position or mask shows in the logits
    B, L = int(rng.integers(1, 4)), config.block_size
    start = int(rng.integers(config.transition_dim, L))  # at least one whole transition stored: a value token
    cache = model.new_cache(B)
    with torch.no_grad():
        model(torch.as_tensor(rng.integers(0, config.n_bins, size=(B, start))), cache=cache)
    for buffer in (cache.k, cache.v):
        buffer[:, :, :, start:] = torch.randn_like(buffer[:, :, :, start:])  # noise in the empty slots
    T = int(rng.choice([1, int(rng.integers(1, L - start + 1))]))  # one token, or a chunk
    bins = torch.as_tensor(rng.integers(0, config.n_bins, size=(B, T)))
    return model, bins, Stored(cache.k, cache.v, start)


def run_forward(answer, trial):
    model, bins, stored = trial
    cache = stored.cache()
    start, T = stored.length, bins.shape[1]
    call = f"cached_forward({_tokens(T)} after {start} stored)"
    with torch.no_grad():
        logits = answer.cached_forward(model, bins, cache)
    outputs = {}
    for layer in range(model.config.n_layer):  # what each layer stored, in the order the layers run
        outputs[f"layer {layer}'s keys in the cache after your {call}"] = cache.k[layer, :, :, :start + T]
        outputs[f"layer {layer}'s values in the cache after your {call}"] = cache.v[layer, :, :, :start + T]
    outputs[f"cache.length after your {call}"] = cache.length
    outputs[f"the logits of your {call}"] = logits
    return outputs


def ttlib_forward(model, bins, cache):
    return model(bins, cache=cache)[0]


def _heads(model, x, start):  # the per-position heads the notebook gives (notebook 03)
    dims = torch.arange(start + 1, start + 1 + x.shape[1], device=x.device) % model.config.transition_dim  # (T,)
    return torch.einsum("btc,tck->btk", x, model.head_weight[dims]) + model.head_bias[dims]


def _forward_with(mask="model", first=lambda start: start, advance="once", residual=True, final_norm=True,
                  heads_from=lambda start: start):
    def cached_forward(model, bins, cache):
        start, T = cache.length, bins.shape[1]
        positions = torch.arange(first(start), first(start) + T)  # (T,)
        x = model.tok_emb(bins + model.token_offset[positions]) + model.pos_emb[positions]  # (B, T, C)
        allowed = {"model": model.allowed[start:start + T, :start + T],
                   "causal only": torch.tril(torch.ones(start + T, start + T, dtype=torch.bool))[start:],
                   "first rows": model.allowed[:T, :start + T]}[mask]
        for layer, block in enumerate(model.blocks):
            attended = lent_cached_attention(block.attn, block.ln_1(x), allowed, cache, layer)
            x = x + attended if residual else attended
            x = x + block.mlp(block.ln_2(x))
            if advance == "every layer":
                cache.length += T
        if advance == "once":
            cache.length += T
        return _heads(model, model.ln_f(x) if final_norm else x, heads_from(start))

    return {"cached_forward": cached_forward}


cached_pass = Exercise(
    id="04-forward", number=3, what="your cached_forward", names=("cached_forward",), trial=forward_trial,
    run=run_forward, reference={"cached_forward": ttlib_forward}, lends={"cached_attention": lent_cached_attention},
    forbid=(TrajectoryGPT.forward, Block.forward, CausalSelfAttention.forward, _forward_with()["cached_forward"]),
    atol=1e-4, trials=10, hidden_trials=15,
    passed="your cached forward pass gives the model's logits and fills its cache like ttlib's.",
    mistakes=[
        Mistake("the value rule is missing in the cache: your new tokens may attend to the stored value tokens "
                "(a causal-only mask, Faster-TT's bug), so they read a summary of the future the model never saw in "
                "training. The differences look small but are not rounding: take the new tokens' rows of the "
                "model's own mask, `model.allowed[start:start + T, :start + T]`, which hides every value token.",
                _forward_with(mask="causal only")),
        Mistake("the mask's first T rows are used: the new tokens sit at positions start ... start + T - 1, so take "
                "*those* rows, `model.allowed[start:start + T, :start + T]`.", _forward_with(mask="first rows")),
        Mistake("the positions are off by one: the first new token sits at position cache.length (0-based), so "
                "positions = torch.arange(start, start + T).", _forward_with(first=lambda start: start + 1)),
        Mistake("the positions start at 0 in every call: a cached call continues the sequence, so the new tokens' "
                "positions are start ... start + T - 1 (start = cache.length), for the position embedding and for "
                "the token offsets.", _forward_with(first=lambda start: 0)),
        Mistake("cache.length is advanced inside the layer loop: every layer must write the new tokens at the same "
                "slots, so advance once, after the last layer.", _forward_with(advance="every layer")),
        Mistake("cache.length is never advanced: after the last layer, `cache.length += T`, or the next call "
                "overwrites these tokens.", _forward_with(advance="never")),
        Mistake("the residual around attention is missing: x = x + cached_attention(...), so the block adds to "
                "the residual stream instead of replacing it.", _forward_with(residual=False)),
        Mistake("the final LayerNorm is missing: the heads read model.ln_f(x), as in the model's forward pass.",
                _forward_with(final_norm=False)),
        Mistake("the heads are told the new tokens start at position 0: pass `start`, so each position gets the "
                "head of the dimension it predicts.", _forward_with(heads_from=lambda start: 0)),
    ],
)


# ---- exercise 4: reorder -----------------------------------------------------------------------------------------
def reorder_trial(rng):
    n_layer, batch, n_head, head_dim = (int(x) for x in rng.integers(1, 5, size=4))
    capacity = int(rng.integers(1, 12))
    stored = Stored.noise(n_layer, batch, n_head, head_dim, capacity, int(rng.integers(1, capacity + 1)))
    indices = torch.as_tensor(rng.integers(0, batch, size=int(rng.integers(1, 2 * batch + 1))))
    return stored, indices


def run_reorder(answer, trial):
    stored, indices = trial
    cache = stored.cache()
    call = f"reorder(indices={indices.tolist()}) of {stored.k.shape[1]} rows"
    answer.reorder(cache, indices)
    L = stored.length  # only the stored slots count: the rest may hold anything
    return {f"the cache's stored keys after your {call}": cache.k[:, :, :, :L],
            f"the cache's stored values after your {call}": cache.v[:, :, :, :L],
            f"cache.length after your {call}": cache.length}


def ttlib_reorder(cache, indices):
    cache.reorder(indices)


def _reorder_with(keys_axis=1, values=True, keep=False):
    def reorder(cache, indices):
        if keep:
            return
        cache.k = cache.k.index_select(keys_axis, indices)
        if values:
            cache.v = cache.v.index_select(1, indices)

    return {"reorder": reorder}


reordering = Exercise(
    id="04-reorder", number=4, what="your reorder", names=("reorder",), trial=reorder_trial, run=run_reorder,
    reference={"reorder": ttlib_reorder}, forbid=(KVCache.reorder, KVCache.write), atol=0.0, trials=10,
    hidden_trials=20, passed="your reorder moves every layer's keys and values like KVCache.reorder.",
    mistakes=[
        Mistake("reorder keeps the old rows: the cache must end up with the gathered rows, so assign them, "
                "`cache.k = cache.k.index_select(1, indices)` (the same for cache.v); index_select returns a new "
                "tensor and changes nothing in place.", _reorder_with(keep=True)),
        Mistake("only the keys are reordered: cache.v must follow, or every row's values belong to another row.",
                _reorder_with(values=False)),
        Mistake("the rows are gathered along axis 0, the layers: the buffers are (n_layer, batch, n_head, "
                "capacity, head_dim), so the rows are axis 1.", _reorder_with(keys_axis=0)),
    ],
)


# ---- exercise 5: the size of a cache -----------------------------------------------------------------------------
def bytes_trial(rng):
    return tuple(int(x) for x in rng.integers(1, 9, size=5))  # n_layer, batch, n_head, head_dim, capacity


def run_bytes(answer, trial):
    outputs = {}
    for bytes_per_number in (4, 2):  # float32 and float16: every mistake gives another pair of numbers
        call = "kv_cache_bytes(n_layer={}, batch={}, n_head={}, head_dim={}, capacity={}, bytes_per_number={})".format(
            *trial, bytes_per_number)
        size = answer.kv_cache_bytes(*trial, bytes_per_number)
        outputs[call] = size
        outputs[f"{call} is an int"] = isinstance(size, (int, np.integer)) and not isinstance(size, bool)
    return outputs


def allocated_bytes(n_layer, batch, n_head, head_dim, capacity, bytes_per_number=4):
    """What a KVCache of that shape really allocates."""
    dtype = {2: torch.float16, 4: torch.float32}[bytes_per_number]
    cache = KVCache(n_layer, batch, n_head, head_dim, capacity, dtype=dtype)
    return cache.k.nbytes + cache.v.nbytes


def _bytes_with(buffers=2, per_number=True):
    def kv_cache_bytes(n_layer, batch, n_head, head_dim, capacity, bytes_per_number=4):
        return buffers * n_layer * batch * n_head * capacity * head_dim * (bytes_per_number if per_number else 1)

    return {"kv_cache_bytes": kv_cache_bytes}


sizing = Exercise(
    id="04-cache-bytes", number=5, what="your kv_cache_bytes", names=("kv_cache_bytes",), trial=bytes_trial,
    run=run_bytes, reference={"kv_cache_bytes": allocated_bytes}, forbid=(KVCache.__init__,), trials=10,
    hidden_trials=20, passed="your formula is what a KVCache allocates.",
    mistakes=[
        Mistake("only one buffer is counted: a cache holds keys *and* values, two buffers of that shape.",
                _bytes_with(buffers=1)),
        Mistake("this counts numbers, not bytes: multiply by bytes_per_number (4 for float32, 2 for float16).",
                _bytes_with(per_number=False)),
    ],
)

EXERCISES = [storing, cached_layer, cached_pass, reordering, sizing]
