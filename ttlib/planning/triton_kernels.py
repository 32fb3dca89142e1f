"""The static search's decoding step as one Triton kernel: every layer, the head and the next token, on chip.

`static_decoder.StaticPlanner._step` is about a hundred PyTorch kernels a token; on a GPU each costs a few
microseconds of launching, far more than its arithmetic. `decode_step` does the same work in one launch: a program
takes a tile of BLOCK_B rows (a row: one beam, or one child of a beam) and keeps their residual stream in registers
from the token's embedding to its logits:

    x = tok_emb[bin + dim * N] + pos_emb[position]                     (BB, C)
    for every layer:
        h = LayerNorm(x);  q, k, v = h @ W_qkv + b  (per head)         (BB, D) each
        k, v -> the row's beam's cache slot (the schedule's slot + its child index)
        y = softmax(q . keys) . values over the context's used slots and the past slots the row sees
        x = x + y @ W_proj + b;  x = x + GELU(LayerNorm(x) @ W_up + b) @ W_down + b
    logits = LayerNorm(x) @ head[dim after] + b                         (BB, N)
    next bin: sampled from the plan's uniform (temperature, top-k, top-p, inverse CDF) or the likeliest;
    the expected reward read off the logits; bin, plan column and reward stored where the schedule says

Rows never wait on each other (a row reads its own beam's past and its environment's context), so programs need
no synchronisation. Attention reads only slots in use: the context's real slots (`n_context`) and the past slots
used once this token is stored (`used[k]`), a row's siblings' masked by the schedule's `seen` table -- stale
numbers there are finite, and weighted exactly 0. Softmax is online (flash attention's running maximum and sum),
so a row never holds all its scores at once. Products are `tl.dot` with input_precision="ieee": no TF32.

Layout: a layer's weights packed in one row of `layers` (see `triton_step.pack_layers`): ln_1 weight and bias
(C each), W_qkv (C, 3C) with 1/sqrt(D) folded into the queries, b_qkv (3C), W_proj (C, C), b_proj (C), ln_2 (2C),
W_up (C, 4C), b_up (4C), W_down (4C, C), b_down (C). This module needs Triton; `triton_step` imports it lazily.
"""

# (no `from __future__ import annotations`: Triton 3.0 needs the tl.constexpr annotations as objects)
import triton
import triton.language as tl

__all__ = ["COLUMN", "FP64_DOT", "REWARD", "SAMPLE", "SLOT", "UNIFORM", "decode_step"]

SLOT, SAMPLE, UNIFORM, COLUMN, REWARD = range(5)  # the columns of a schedule row (static_decoder's)
FP64_DOT = tl.constexpr(tuple(int(v) for v in triton.__version__.split(".")[:2]) >= (3, 2))  # tl.dot takes float64
# (Triton 3.0, torch 2.4's, does not: there float64 products are summed elementwise -- the tests' dtype, not a GPU's)


@triton.jit
def _dot(a, b):
    """a (M, K) @ b (K, M'): IEEE float32 (no TF32), or float64."""
    if a.dtype == tl.float64:
        if not FP64_DOT:
            return tl.sum(a[:, :, None] * b[None, :, :], axis=1)
    return tl.dot(a, b, input_precision="ieee")


@triton.jit
def _layer_norm(x, params, C: tl.constexpr, eps):
    """x (BB, C) -> (BB, C), normalised over C; weight at params[:C], bias at params[C:2C]."""
    cols = tl.arange(0, C)
    mean = tl.sum(x, axis=1) / C
    centred = x - mean[:, None]
    var = tl.sum(centred * centred, axis=1) / C + eps  # (BB,)
    if x.dtype == tl.float32:  # rounded as ATen rounds (tl.sqrt and `/` may be approximate in float32)
        rstd = tl.div_rn(tl.full(var.shape, 1.0, var.dtype), tl.sqrt_rn(var))
    else:
        rstd = 1.0 / tl.sqrt(var)
    return centred * rstd[:, None] * tl.load(params + cols)[None, :] + tl.load(params + C + cols)[None, :]


@triton.jit
def _matmul(h, weight, row: tl.constexpr, K: tl.constexpr, M: tl.constexpr):
    """h (BB, K) @ weight[:K, :M], the weight row-major with rows of `row` elements -> (BB, M), IEEE float32."""
    w = tl.load(weight + tl.arange(0, K)[:, None] * row + tl.arange(0, M)[None, :])  # (K, M)
    return _dot(h, w)


@triton.jit
def _online(scores, values, m, total, acc):
    """One chunk of a softmax-weighted sum, kept online: scores (BB, BS), -inf where not seen; values (BB, BS, D);
    m (BB,) the largest score so far, total (BB,) the sum of exp(score - m), acc (BB, D) the weighted values."""
    m_new = tl.maximum(m, tl.max(scores, axis=1))
    alpha = tl.exp(m - m_new)  # (BB,) rescales what came before (0 before the first chunk)
    p = tl.exp(scores - m_new[:, None])  # (BB, BS)
    acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * values, axis=1)
    return m_new, total * alpha + tl.sum(p, axis=1), acc


@triton.jit
def _attend(q, context_k, context_v, past_k, past_v, seen, n_context, n_used,
            KC: tl.constexpr, S: tl.constexpr, D: tl.constexpr, BLOCK_S: tl.constexpr):
    """One head: q (BB, D) -> (BB, D), the softmax over the row's context slots [0, n_context) and its past slots
    [0, n_used) it sees. context_k (BB,) pointers to each row's keys (D, KC), context_v to its values (KC, D);
    past_k, past_v (BB,) to its beam's (S, D); seen (BB,) to its row of the seen table (S,) int8."""
    d = tl.arange(0, D)[None, None, :]  # (1, 1, D)
    m = tl.full(q.shape[:1], float("-inf"), q.dtype)
    total, acc = tl.zeros(q.shape[:1], q.dtype), tl.zeros(q.shape, q.dtype)
    for s0 in range(0, n_context, BLOCK_S):  # the context (every row has at least one slot: m turns finite)
        s = s0 + tl.arange(0, BLOCK_S)  # (BS,)
        inside = (s < n_context)[None, :, None]  # (1, BS, 1)
        keys = tl.load(context_k[:, None, None] + d * KC + s[None, :, None], mask=inside, other=0.0)
        values = tl.load(context_v[:, None, None] + s[None, :, None] * D + d, mask=inside, other=0.0)
        scores = tl.where((s < n_context)[None, :], tl.sum(q[:, None, :] * keys, axis=2), float("-inf"))
        m, total, acc = _online(scores, values, m, total, acc)
    for s0 in range(0, n_used, BLOCK_S):  # the past slots in use, those the row does not see masked
        s = s0 + tl.arange(0, BLOCK_S)
        inside = (s < n_used)[None, :, None]
        sees = tl.load(seen[:, None] + s[None, :], mask=(s < n_used)[None, :], other=0) != 0  # (BB, BS)
        keys = tl.load(past_k[:, None, None] + s[None, :, None] * D + d, mask=inside, other=0.0)
        values = tl.load(past_v[:, None, None] + s[None, :, None] * D + d, mask=inside, other=0.0)
        scores = tl.where(sees, tl.sum(q[:, None, :] * keys, axis=2), float("-inf"))
        m, total, acc = _online(scores, values, m, total, acc)
    return acc / total[:, None]


@triton.jit
def _attention(x, layer, context_k, context_v, past, slot, seen, n_context, n_used, eps, context_stride,
               head_stride, kv_stride, C: tl.constexpr, HEADS: tl.constexpr, D: tl.constexpr,
               KC: tl.constexpr, S: tl.constexpr, BLOCK_S: tl.constexpr):
    """x (BB, C) -> x + attention(LayerNorm(x)) @ W_proj + b_proj. context_k, context_v: (BB,) pointers to each
    row's environment in head 0 of this layer (+ head * context_stride: a head further); past: (BB,) to its beam's
    row in this layer's keys, head 0 (+ kv_stride: the values; + head * head_stride: a head further); slot (BB,)
    where the row's new key and value go."""
    h = _layer_norm(x, layer, C, eps)
    w_qkv = layer + 2 * C
    b_qkv = w_qkv + 3 * C * C
    w_proj = b_qkv + 3 * C
    d = tl.arange(0, D)[None, :]
    out = tl.zeros(x.shape, x.dtype)
    for head in tl.static_range(HEADS):
        cols = head * D + tl.arange(0, D)
        q = _matmul(h, w_qkv + head * D, 3 * C, C, D) + tl.load(b_qkv + cols)[None, :]  # (BB, D)
        k = _matmul(h, w_qkv + C + head * D, 3 * C, C, D) + tl.load(b_qkv + C + cols)[None, :]
        v = _matmul(h, w_qkv + 2 * C + head * D, 3 * C, C, D) + tl.load(b_qkv + 2 * C + cols)[None, :]
        past_k = past + head * head_stride  # (BB,)
        tl.store(past_k[:, None] + slot[:, None] * D + d, k)
        tl.store(past_k[:, None] + kv_stride + slot[:, None] * D + d, v)
        tl.debug_barrier()  # the new key and value are read back below, by other threads of this program
        y = _attend(q, context_k + head * context_stride, context_v + head * context_stride, past_k,
                    past_k + kv_stride, seen, n_context, n_used, KC, S, D, BLOCK_S)
        out += _matmul(y, w_proj + head * D * C, C, D, C)  # (BB, C): this head's share of the projection
    return x + out + tl.load(w_proj + C * C + tl.arange(0, C))[None, :]


@triton.jit
def _mlp(x, layer, eps, C: tl.constexpr, BLOCK_F: tl.constexpr):
    """x (BB, C) -> x + GELU(LayerNorm(x) @ W_up + b_up) @ W_down + b_down, BLOCK_F hidden units at a time."""
    ln_2 = layer + 2 * C + 3 * C * C + 3 * C + C * C + C
    w_up = ln_2 + 2 * C
    b_up = w_up + 4 * C * C
    w_down = b_up + 4 * C
    h = _layer_norm(x, ln_2, C, eps)
    out = tl.zeros(x.shape, x.dtype)
    for f0 in tl.static_range(0, 4 * C, BLOCK_F):
        u = _matmul(h, w_up + f0, 4 * C, C, BLOCK_F) + tl.load(b_up + f0 + tl.arange(0, BLOCK_F))[None, :]
        g = 0.5 * u * (1.0 + tl.erf(u * 0.7071067811865476))  # (BB, BLOCK_F) the exact GELU, as F.gelu
        out += _matmul(g, w_down + f0 * C, C, BLOCK_F, C)
    return x + out + tl.load(w_down + 4 * C * C + tl.arange(0, C))[None, :]


@triton.jit
def _softmax(z):
    """z (BB, BN) -> softmax over its last axis (-inf: probability 0)."""
    p = tl.exp(z - tl.max(z, axis=1)[:, None])
    return p / tl.sum(p, axis=1)[:, None]


@triton.jit
def _nucleus(z, top_p, N: tl.constexpr, BLOCK_N: tl.constexpr):
    """z (BB, BN) logits -> the same with -inf outside the top-p nucleus, as `search.sample_bins` keeps it: a bin
    is out once the likelier bins before it, taken one at a time (ties: the lower bin first), hold top_p. The
    running sum is float64 rounded to z's type, as ATen's CPU cumsum accumulates."""
    cols = tl.arange(0, BLOCK_N)[None, :]
    p = _softmax(z)
    work = tl.where(cols < N, p, -1.0)  # bins not taken yet (padding: never)
    mass = tl.zeros(z.shape[:1], tl.float64)
    outside = tl.zeros(z.shape, tl.int32) != 0  # (BB, BN) bins out of the nucleus
    for _ in range(N):
        pick = cols == tl.argmax(work, axis=1)[:, None]  # (BB, BN) the likeliest bin not taken yet
        p_pick = tl.sum(tl.where(pick, p, 0.0), axis=1)  # (BB,)
        mass += p_pick.to(tl.float64)
        outside = outside | (pick & ((mass.to(z.dtype) - p_pick) >= top_p)[:, None])
        work = tl.where(pick, -1.0, work)
    return tl.where(outside, float("-inf"), z)


@triton.jit
def _sample(logits, uniform, temperature, top_k, top_p, N: tl.constexpr, BLOCK_N: tl.constexpr,
            TOP_K: tl.constexpr, TOP_P: tl.constexpr):
    """Inverse-CDF sampling as `search.sample_bins`: logits (BB, BN) (padding -inf), uniform (BB,) float64 ->
    bins (BB,). Top-k keeps the bins at least as likely as the k-th likeliest (ties counted, as torch.topk)."""
    cols = tl.arange(0, BLOCK_N)[None, :]
    z = logits / temperature
    if TOP_K:
        work = z
        for _ in range(top_k - 1):  # take away the likeliest bin, k - 1 times: the k-th is then the largest left
            work = tl.where(cols == tl.argmax(work, axis=1)[:, None], float("-inf"), work)
        z = tl.where(z < tl.max(work, axis=1)[:, None], float("-inf"), z)
    if TOP_P:
        z = _nucleus(z, top_p, N, BLOCK_N)
    cdf = tl.cumsum(_softmax(z).to(tl.float64), axis=1).to(z.dtype)  # (BB, BN) float64 sums, as ATen's CPU cumsum
    last = tl.sum(tl.where(cols == N - 1, cdf, 0.0), axis=1)  # (BB,) the cdf's last real bin
    threshold = uniform.to(z.dtype) * last
    below = (cdf <= threshold[:, None]) & (cols < N)
    return tl.minimum(tl.sum(below.to(tl.int32), axis=1), N - 1)  # searchsorted(right=True), clamped


@triton.jit
def _head(x, final, head_w, head_b, after, eps, C: tl.constexpr, N: tl.constexpr, BLOCK_N: tl.constexpr):
    """x (BB, C) -> logits (BB, BN) of the dimension `after`: LayerNorm, then head[after]; padding -inf."""
    h = _layer_norm(x, final, C, eps)
    n = tl.arange(0, BLOCK_N)
    w = tl.load(head_w + after * C * N + tl.arange(0, C)[:, None] * N + n[None, :], mask=(n < N)[None, :],
                other=0.0)  # (C, BN)
    logits = _dot(h, w) + tl.load(head_b + after * N + n, mask=n < N, other=0.0)[None, :]
    return tl.where((n < N)[None, :], logits, float("-inf"))


@triton.jit
def _choose(logits, rows, valid, token, uniforms, reward_means, rewards, bins_out, generated, temperature,
            top_k, top_p, N: tl.constexpr, BLOCK_N: tl.constexpr, HA: tl.constexpr, H1: tl.constexpr,
            G1: tl.constexpr, CHILDREN: tl.constexpr, TOP_K: tl.constexpr, TOP_P: tl.constexpr):
    """The token after this one, from logits (BB, BN): on children, sampled where the schedule says (else the
    likeliest bin), with the expected reward stored in its column; on beams the likeliest bin. The bin goes to
    bins_out and to the plan's column."""
    bins = tl.argmax(logits, axis=1)  # (BB,) the likeliest bin, the first of equals (as torch.argmax)
    if CHILDREN:
        uniform = tl.load(uniforms + rows * HA + tl.load(token + UNIFORM))  # (BB,) float64
        sampled = _sample(logits, uniform, temperature, top_k, top_p, N, BLOCK_N, TOP_K, TOP_P)
        bins = tl.where(tl.load(token + SAMPLE) != 0, sampled, bins)
        means = tl.load(reward_means + tl.arange(0, BLOCK_N), mask=tl.arange(0, BLOCK_N) < N, other=0.0)
        reward = tl.sum(_softmax(logits) * means[None, :], axis=1)  # (BB,) the expected reward
        tl.store(rewards + rows * H1 + tl.load(token + REWARD), reward, mask=valid)
    tl.store(bins_out + rows, bins.to(tl.int64), mask=valid)
    tl.store(generated + rows * G1 + tl.load(token + COLUMN), bins.to(tl.int64), mask=valid)


@triton.jit
def decode_step(bins, counter, first_position, schedule, seen, used, n_context, tok_emb, pos_emb, layers, final,
                head_w, head_b, context_k, context_v, past, logits_out, generated, rewards, uniforms,
                reward_means, n_rows, n_envs, eps, temperature, top_k, top_p,
                L: tl.constexpr, C: tl.constexpr, HEADS: tl.constexpr, D: tl.constexpr, N: tl.constexpr,
                TD: tl.constexpr, X: tl.constexpr, X_SEEN: tl.constexpr, S: tl.constexpr, KC: tl.constexpr,
                HA: tl.constexpr, H1: tl.constexpr, G1: tl.constexpr, CHILDREN: tl.constexpr,
                TOP_K: tl.constexpr, TOP_P: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_S: tl.constexpr,
                BLOCK_F: tl.constexpr, BLOCK_N: tl.constexpr):
    """Token k (counter[0]) for BLOCK_B rows of n_rows: bins (n_rows,) in, the next bins out; logits_out
    (n_rows, N). Rows are X children of n_rows / X beams, W beams of each of n_envs environments; past is
    (L, 2, HEADS, n_rows / X, S, D), context_k (L, HEADS * n_envs, D, KC), context_v (L, HEADS * n_envs, KC, D)."""
    rows = (tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)).to(tl.int64)  # (BB,)
    valid = rows < n_rows
    rows = tl.minimum(rows, n_rows - 1)  # a tile's rows past the end repeat the last row, never stored
    beams = n_rows // X
    beam, child, env = rows // X, rows % X, rows // (n_rows // n_envs)  # (BB,) each
    k = tl.load(counter)
    token = schedule + k * 5
    position = tl.load(first_position) + k
    cols = tl.arange(0, C)
    emb = (tl.load(bins + rows) + position % TD * N) * C  # (BB,) the row of this dimension's token
    x = tl.load(tok_emb + emb[:, None] + cols[None, :]) + tl.load(pos_emb + position * C + cols)[None, :]
    slot = tl.load(token + SLOT) + child  # (BB,) where a beam's X children write, side by side
    seen_rows = seen + (k * X_SEEN + child) * S  # (BB,) each row's slots seen at this token
    n_ctx, n_used = tl.load(n_context).to(tl.int32), tl.load(used + k).to(tl.int32)
    head_stride, context_stride = beams * S * D, n_envs * KC * D
    for layer in range(L):
        weights = layers + layer * (12 * C * C + 13 * C)
        past_rows = past + layer * 2 * HEADS * head_stride + beam * S * D  # (BB,) keys, head 0
        context = layer * HEADS * context_stride + env * KC * D  # (BB,)
        x = _attention(x, weights, context_k + context, context_v + context, past_rows, slot, seen_rows, n_ctx,
                       n_used, eps, context_stride, head_stride, HEADS * head_stride, C, HEADS, D, KC, S, BLOCK_S)
        x = _mlp(x, weights, eps, C, BLOCK_F)
    logits = _head(x, final, head_w, head_b, (position + 1) % TD, eps, C, N, BLOCK_N)  # (BB, BN)
    n = tl.arange(0, BLOCK_N)[None, :]
    tl.store(logits_out + rows[:, None] * N + n, logits, mask=valid[:, None] & (n < N))
    _choose(logits, rows, valid, token, uniforms, reward_means, rewards, bins, generated, temperature, top_k,
            top_p, N, BLOCK_N, HA, H1, G1, CHILDREN, TOP_K, TOP_P)
