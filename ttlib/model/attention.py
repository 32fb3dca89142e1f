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

Beam search reorders rows: `KVCache.reorder(indices)` keeps, drops or duplicates them when beams are expanded
or selected (`decoders.CachedDecoder` decodes this way). The planner's fast decoder (`fast_decoder.FusedDecoder`)
goes further and stores an environment's context once for all of its beams.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ttlib.errors import TTLibError

__all__ = ["CacheFullError", "CausalSelfAttention", "KVCache", "explicit_attention", "fast_attention"]


class CacheFullError(TTLibError, RuntimeError):
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


class KVCache:
    """Projected keys and values of every layer, for `batch` rows, in preallocated buffers.

    k, v: (n_layer, batch, n_head, capacity, head_dim), written in place as tokens arrive. `length` tokens are
    stored per row.
    """

    def __init__(self, n_layer, batch, n_head, head_dim, capacity, *, dtype=torch.float32, device="cpu"):
        shape = (n_layer, batch, n_head, capacity, head_dim)
        self.k = torch.empty(shape, dtype=dtype, device=device)  # only [:length] is ever read
        self.v = torch.empty(shape, dtype=dtype, device=device)
        self.length = 0  # tokens stored per row

    def __repr__(self) -> str:
        return f"KVCache(length {self.length} of {self.capacity}, k and v {tuple(self.k.shape)})"

    @property
    def batch(self) -> int:
        return self.k.shape[1]

    @property
    def capacity(self) -> int:
        return self.k.shape[3]

    @property
    def position(self) -> int:
        """Absolute position of the next token."""
        return self.length

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        """Store k, v (B, H, T, D) after the tokens already there; return this layer's keys and values so far."""
        start, T = self.length, k.shape[2]
        if start + T > self.capacity:
            raise CacheFullError(f"KV cache is full: {start} + {T} tokens > capacity {self.capacity}")
        self.k[layer, :, :, start:start + T] = k
        self.v[layer, :, :, start:start + T] = v
        return self.k[layer, :, :, :start + T], self.v[layer, :, :, :start + T]  # (B, H, start+T, D)

    def advance(self, n_tokens: int):
        """Called by the model once every layer has written the new tokens."""
        self.length += n_tokens

    def reorder(self, indices: torch.Tensor):
        """Rows become rows[indices]: keep, drop or duplicate them (beam search). Only stored tokens are copied."""
        indices = indices.to(self.k.device)
        L = self.length
        shape = (self.k.shape[0], indices.numel(), *self.k.shape[2:])
        new_k, new_v = self.k.new_empty(shape), self.v.new_empty(shape)
        new_k[:, :, :, :L] = self.k[:, :, :, :L].index_select(1, indices)
        new_v[:, :, :, :L] = self.v[:, :, :, :L].index_select(1, indices)
        self.k, self.v = new_k, new_v


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
        if cache is not None:
            k, v = cache.write(layer, k, v)  # (B, H, S, D): every token so far
        if self.fast:
            y = fast_attention(q, k, v, allowed, self.attn_dropout if self.training else 0.0)
        else:
            y = explicit_attention(q, k, v, allowed, self.attn_dropout if self.training else 0.0)
        y = y.transpose(1, 2).reshape(B, T, C)  # (B, T, C): heads side by side
        return self.resid_dropout(self.proj(y))
