"""Wrong answers to notebook 04's exercises (see tests/test_exercises.py for the format)."""

REFUSED = "refuses to run"  # what a delegating answer's failure says (ttlib.checks.forbidding)

TAMPER = '''import ttlib.checks

for name in ["check_close", "check_equal_arrays", "check_shape", "check_function", "call", "check_own_code"]:
    setattr(ttlib.checks, name, lambda *args, **kwargs: None)


'''

ANSWERS = [
    # exercise 1: write_kv
    ("04-write", "writes one slot too far (positions off by one)",
     ("start, T = cache.length, k.shape[2]", "start, T = cache.length + 1, k.shape[2]")),
    ("04-write", "returns only the tokens stored before, not the new ones",
     ("return cache.k[layer, :, :, :start + T], cache.v[layer, :, :, :start + T]",
      "return cache.k[layer, :, :, :start], cache.v[layer, :, :, :start]")),
    ("04-write", "stores the keys in both buffers", ("cache.v[layer, :, :, start:start + T] = v",
                                                     "cache.v[layer, :, :, start:start + T] = k")),
    ("04-write", "advances the position in every layer's write",
     ("    return cache.k[layer, :, :, :start + T], cache.v[layer, :, :, :start + T]",
      "    cache.length += T\n    return cache.k[layer, :, :, :start + T], cache.v[layer, :, :, :start + T]")),
    ("04-write", "delegates to KVCache.write", '''def write_kv(cache, layer, k, v):
    return cache.write(layer, k, v)
''', REFUSED),
    ("04-write", "unsolved, with the checking helpers rebound to do nothing",
     TAMPER + "def write_kv(cache, layer, k, v):\n    raise NotImplementedError()\n"),
    # exercise 2: cached_attention
    ("04-attention", "attends only to the new tokens, not to the stored ones",
     ("y = explicit_attention(q, keys, values, allowed)",
      "y = explicit_attention(q, k, v, allowed[:, -T:])")),
    ("04-attention", "ignores the mask (new tokens see every stored token, value tokens included)",
     ("y = explicit_attention(q, keys, values, allowed)",
      "y = explicit_attention(q, keys, values, torch.ones_like(allowed))")),
    ("04-attention", "heads merged without moving the head axis back",
     ("y.transpose(1, 2).reshape(B, T, C)", "y.reshape(B, T, C)")),
    ("04-attention", "no output projection", ("return attn.proj(y.transpose(1, 2).reshape(B, T, C))",
                                              "return y.transpose(1, 2).reshape(B, T, C)")),
    ("04-attention", "delegates to ttlib's CausalSelfAttention",
     "def cached_attention(attn, x, allowed, cache, layer):\n    return attn(x, allowed, cache, layer)\n", REFUSED),
    # exercise 3: cached_forward
    ("04-forward", "new tokens may see value tokens (Faster-TT: causal mask only)",
     ("allowed = model.allowed[start:start + T, :start + T]",
      "allowed = torch.tril(torch.ones(start + T, start + T, dtype=torch.bool, device=bins.device))[start:]")),
    ("04-forward", "the mask's first rows instead of the new tokens' rows",
     ("allowed = model.allowed[start:start + T, :start + T]", "allowed = model.allowed[:T, :start + T]")),
    ("04-forward", "positions off by one", ("positions = torch.arange(start, start + T, device=bins.device)",
                                            "positions = torch.arange(start + 1, start + T + 1, device=bins.device)")),
    ("04-forward", "positions start at 0 for every call",
     ("positions = torch.arange(start, start + T, device=bins.device)",
      "positions = torch.arange(T, device=bins.device)")),
    ("04-forward", "advances the position inside the layer loop",
     ("        x = x + block.mlp(block.ln_2(x))\n    cache.length += T",
      "        x = x + block.mlp(block.ln_2(x))\n        cache.length += T")),
    ("04-forward", "never advances the position", ("    cache.length += T  # every layer has stored the new tokens\n",
                                                   "")),
    ("04-forward", "no residual around attention",
     ("x = x + cached_attention(block.attn, block.ln_1(x), allowed, cache, layer)",
      "x = cached_attention(block.attn, block.ln_1(x), allowed, cache, layer)")),
    ("04-forward", "delegates to TrajectoryGPT.forward", '''def cached_forward(model, bins, cache):
    logits, _ = model(bins, cache=cache)
    return logits
''', REFUSED),
    ("04-forward", "delegates each layer to ttlib's Block",
     ("        x = x + cached_attention(block.attn, block.ln_1(x), allowed, cache, layer)\n"
      "        x = x + block.mlp(block.ln_2(x))\n", "        x = block(x, allowed, cache, layer)\n"), REFUSED),
    # exercise 4: reorder
    ("04-reorder", "keeps the old rows", '''def reorder(cache, indices):
    pass
'''),
    ("04-reorder", "reorders only the keys", ("    cache.v = cache.v.index_select(1, indices)\n", "")),
    ("04-reorder", "gathers along the layer axis", ("cache.k = cache.k.index_select(1, indices)",
                                                    "cache.k = cache.k.index_select(0, indices)")),
    ("04-reorder", "delegates to KVCache.reorder", '''def reorder(cache, indices):
    cache.reorder(indices)
''', REFUSED),
    # exercise 5: kv_cache_bytes
    ("04-cache-bytes", "counts the keys only", ("return 2 * n_layer", "return n_layer")),
    ("04-cache-bytes", "allocates a KVCache to measure it", '''
def kv_cache_bytes(n_layer, batch, n_head, head_dim, capacity, bytes_per_number=4):
    dtype = {2: torch.float16, 4: torch.float32}[bytes_per_number]
    cache = KVCache(n_layer, batch, n_head, head_dim, capacity, dtype=dtype)
    return cache.k.nbytes + cache.v.nbytes
''', REFUSED),
]
