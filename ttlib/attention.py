"""Causal multi-head self-attention with a real key/value cache.

Attention lets every token look back at the tokens before it. Written out, for one head:

    scores  = q @ k^T / sqrt(head_dim)          # how much each query likes each key
    scores  = where(allowed, scores, -inf)      # causal mask (+ the Trajectory Transformer's value rule)
    weights = softmax(scores)                   # each row sums to 1
    out     = weights @ v                       # a weighted average of the values

Decoding one token at a time, the keys and values of all earlier tokens never change, so recomputing them for
every new token wastes almost all of the work. A KV cache keeps the *projected* K and V of every layer in
preallocated buffers and only computes them for the new token. That makes each decoding step cost O(length)
instead of O(length^2), and it is exactly the same computation as running the whole sequence again.

Beam search adds two twists, both handled here:
- `KVCache.reorder(indices)` keeps, drops or duplicates rows when beams are selected or expanded.
- All beams of one environment share the same context, and a beam's children share the beam's past.
  `KVCache.shared(prefix, ...)` stores such a prefix once per group of rows and only the newer tokens per row,
  so the cache holds, copies and reads far less memory; `extend` folds the chosen children back into their beams.
The planner's own decoder (`planning.CachedDecoder`) applies the same sharing with a leaner layout for its hot loop
(one token per row, value tokens never stored); this general cache is the one notebook 02 builds and tests.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class CacheFullError(RuntimeError):
    """Raised when a token is written past the cache's capacity."""


def explicit_attention(q, k, v, allowed, dropout_p=0.0):
    """Attention spelled out. q (B, H, T, D); k, v (B, H, S, D); allowed (T, S) bool. Returns (B, H, T, D)."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, H, T, S)
    scores = scores.masked_fill(~allowed, float("-inf"))
    weights = torch.softmax(scores, dim=-1)  # (B, H, T, S)
    weights = F.dropout(weights, dropout_p) if dropout_p > 0 else weights
    return weights @ v  # (B, H, T, D)


def fast_attention(q, k, v, allowed, dropout_p=0.0):
    """The same result through PyTorch's fused kernel (flash / memory-efficient / math, whichever fits)."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, dropout_p=dropout_p)


def attention_with_shared_prefixes(q, k, v, prefixes, allowed):
    """Attention over [shared prefix keys ... ; per-row keys] without copying any prefix into every row.

    q (B, H, T, D); k, v (B, H, S, D) per row; prefixes: a list of (k, v) pairs, each (G, H, P, D) and shared
    by groups of B // G consecutive rows (an environment's context, a beam's past); allowed (T, sum P + S).
    One softmax runs over all keys at once, so the result is the same as if every row held its own copy.
    """
    B, H, T, D = q.shape

    def grouped(x, G):  # (B, H, T, X) -> (G, H, R*T, X): the R rows of a group become extra queries
        return x.reshape(G, B // G, H, T, x.shape[-1]).transpose(1, 2).reshape(G, H, B // G * T, x.shape[-1])

    def ungrouped(x, G):  # (G, H, R*T, X) -> (B, H, T, X)
        return x.reshape(G, H, B // G, T, x.shape[-1]).transpose(1, 2).reshape(B, H, T, x.shape[-1])

    q = q / math.sqrt(D)
    scores = [ungrouped(grouped(q, pk.shape[0]) @ pk.transpose(-2, -1), pk.shape[0]) for pk, _ in prefixes]
    scores.append(q @ k.transpose(-2, -1))  # (B, H, T, S)
    lengths = [x.shape[-1] for x in scores]
    scores = torch.cat(scores, dim=-1).masked_fill(~allowed, float("-inf"))  # (B, H, T, sum P + S)
    weights = torch.softmax(scores, dim=-1).split(lengths, dim=-1)
    out = weights[-1] @ v  # (B, H, T, D)
    for w, (_, pv) in zip(weights[:-1], prefixes, strict=True):
        out = out + ungrouped(grouped(w, pv.shape[0]) @ pv, pv.shape[0])
    return out


class KVCache:
    """Projected keys and values of every layer, for `batch` rows, in preallocated buffers.

    k, v: (n_layer, batch, n_head, capacity, head_dim), written in place as tokens arrive. `length` tokens are
    stored per row. With a shared `prefix` (another, filled KVCache with one row per group), this cache's rows
    continue the prefix: row i belongs to group i // (batch // prefix.batch). Prefixes can nest: a beam's
    children continue the beam, which continues its environment's context.
    """

    def __init__(self, n_layer, batch, n_head, head_dim, capacity, *, dtype=torch.float32, device="cpu",
                 prefix: KVCache | None = None):
        shape = (n_layer, batch, n_head, capacity, head_dim)
        self.k = torch.empty(shape, dtype=dtype, device=device)  # only [:length] is ever read
        self.v = torch.empty(shape, dtype=dtype, device=device)
        self.length = 0  # tokens stored per row
        self.prefix = prefix  # shared prefix (itself a KVCache, one row per group of rows here), or None
        if prefix is not None and batch % prefix.batch:
            raise ValueError(f"batch {batch} is not a multiple of the prefix's {prefix.batch} groups")

    @classmethod
    def shared(cls, prefix: KVCache, rows_per_group: int, capacity: int) -> KVCache:
        """A cache of prefix.batch * rows_per_group rows that all continue `prefix` (its groups' contexts)."""
        n_layer, groups, n_head, _, head_dim = prefix.k.shape
        return cls(n_layer, groups * rows_per_group, n_head, head_dim, capacity, dtype=prefix.k.dtype,
                   device=prefix.k.device, prefix=prefix)

    @property
    def batch(self) -> int:
        return self.k.shape[1]

    @property
    def capacity(self) -> int:
        return self.k.shape[3]

    @property
    def position(self) -> int:
        """Absolute position of the next token (the prefixes' tokens come first)."""
        return self.length + (self.prefix.position if self.prefix is not None else 0)

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        """Store k, v (B, H, T, D) after the tokens already there; return this layer's keys and values so far."""
        start, T = self.length, k.shape[2]
        if start + T > self.capacity:
            raise CacheFullError(f"KV cache is full: {start} + {T} tokens > capacity {self.capacity}")
        self.k[layer, :, :, start:start + T] = k
        self.v[layer, :, :, start:start + T] = v
        return self.k[layer, :, :, :start + T], self.v[layer, :, :, :start + T]  # (B, H, start+T, D)

    def prefix_kv(self, layer: int) -> list:
        """The shared prefixes' (k, v) for a layer, outermost first, each (G, H, P, D); empty ones left out."""
        if self.prefix is None:
            return []
        P = self.prefix.length
        own = [(self.prefix.k[layer, :, :, :P], self.prefix.v[layer, :, :, :P])] if P else []
        return self.prefix.prefix_kv(layer) + own

    def advance(self, n_tokens: int):
        """Called by the model once every layer has written the new tokens."""
        self.length += n_tokens

    def reorder(self, indices: torch.Tensor):
        """Rows become rows[indices]: keep, drop or duplicate them (beam search). Only stored tokens are copied."""
        indices = indices.to(self.k.device)
        if self.prefix is not None:
            # a row may only move within its group: its prefix (the environment's context) must stay the same
            new_rows = indices.numel() // self.prefix.batch
            old_rows = self.batch // self.prefix.batch
            groups = torch.arange(indices.numel(), device=indices.device) // new_rows
            if indices.numel() % self.prefix.batch or not torch.equal(indices // old_rows, groups):
                raise ValueError("reorder with a shared prefix must keep every row within its group")
        L = self.length
        shape = (self.k.shape[0], indices.numel(), *self.k.shape[2:])
        new_k, new_v = self.k.new_empty(shape), self.v.new_empty(shape)
        new_k[:, :, :, :L] = self.k[:, :, :, :L].index_select(1, indices)
        new_v[:, :, :, :L] = self.v[:, :, :, :L].index_select(1, indices)
        self.k, self.v = new_k, new_v

    def extend(self, child: KVCache, rows: torch.Tensor) -> None:
        """Append the tokens of child rows `rows` (one per row here) after this cache's own tokens."""
        start, n = self.length, child.length
        if start + n > self.capacity:
            raise CacheFullError(f"KV cache is full: {start} + {n} tokens > capacity {self.capacity}")
        rows = rows.to(self.k.device)
        self.k[:, :, :, start:start + n] = child.k[:, :, :, :n].index_select(1, rows)
        self.v[:, :, :, start:start + n] = child.v[:, :, :, :n].index_select(1, rows)
        self.length += n


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention. `allowed` (T, S) says which key each query may see (causal + value rule)."""

    def __init__(self, n_embd: int, n_head: int, dropout: float = 0.0, attn_dropout: float = 0.0, fast: bool = True):
        super().__init__()
        assert n_embd % n_head == 0, "n_embd must be divisible by n_head"
        self.n_head = n_head
        self.qkv = nn.Linear(n_embd, 3 * n_embd)  # query, key and value projections in one matmul
        self.proj = nn.Linear(n_embd, n_embd)  # mixes the heads back together
        self.attn_dropout = attn_dropout  # dropout on attention weights (makes CPU SDPA take its slow path)
        self.resid_dropout = nn.Dropout(dropout)
        self.fast = fast  # use torch's fused scaled_dot_product_attention when possible

    def forward(self, x, allowed, cache: KVCache | None = None, layer: int = 0):
        B, T, C = x.shape
        H = self.n_head
        q, k, v = self.qkv(x).split(C, dim=2)  # each (B, T, C)
        q = q.view(B, T, H, C // H).transpose(1, 2)  # (B, H, T, D)
        k = k.view(B, T, H, C // H).transpose(1, 2)  # (B, H, T, D)
        v = v.view(B, T, H, C // H).transpose(1, 2)  # (B, H, T, D)
        prefixes = []
        if cache is not None:
            k, v = cache.write(layer, k, v)  # (B, H, S, D): this row's own tokens so far
            prefixes = cache.prefix_kv(layer)  # shared context / beam history, stored once per group
        if prefixes:
            y = attention_with_shared_prefixes(q, k, v, prefixes, allowed)
        elif self.fast:
            y = fast_attention(q, k, v, allowed, self.attn_dropout if self.training else 0.0)
        else:
            y = explicit_attention(q, k, v, allowed, self.attn_dropout if self.training else 0.0)
        y = y.transpose(1, 2).reshape(B, T, C)  # (B, T, C): heads side by side
        return self.resid_dropout(self.proj(y))
