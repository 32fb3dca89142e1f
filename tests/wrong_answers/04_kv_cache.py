"""Wrong answers to notebook 04's exercises (see tests/test_exercises.py for the format)."""

REFUSED = "refuses to run"  # what a delegating answer's failure says (ttlib.exercises.refuse)

TAMPER = '''import ttlib.course.checks

for name in ["check_close", "check_equal_arrays", "check_shape", "call", "check_own_code"]:
    setattr(ttlib.course.checks, name, lambda *args, **kwargs: None)


'''

ANSWERS = [
    # exercise 1: write_kv
    ("04-write", "writes one slot too far (positions off by one)",
     ("start, T = cache.length, k.shape[2]", "start, T = cache.length + 1, k.shape[2]"),
     "writes at the wrong offset: the new tokens go one slot too far"),
    ("04-write", "returns only the tokens stored before, not the new ones",
     ("return cache.k[layer, :, :, :start + T], cache.v[layer, :, :, :start + T]",
      "return cache.k[layer, :, :, :start], cache.v[layer, :, :, :start]"),
     "returns only the tokens stored before this call"),
    ("04-write", "stores the keys in both buffers", ("cache.v[layer, :, :, start:start + T] = v",
                                                     "cache.v[layer, :, :, start:start + T] = k"),
     "the keys are stored in the values' buffer too"),
    ("04-write", "advances the position in every layer's write",
     ("    return cache.k[layer, :, :, :start + T], cache.v[layer, :, :, :start + T]",
      "    cache.length += T\n    return cache.k[layer, :, :, :start + T], cache.v[layer, :, :, :start + T]"),
     "write_kv advances cache.length"),
    ("04-write", "delegates to KVCache.write", '''def write_kv(cache, layer, k, v):
    return cache.write(layer, k, v)
''', REFUSED),
    ("04-write", "unsolved, with the checking helpers rebound to do nothing",
     TAMPER + "def write_kv(cache, layer, k, v):\n    raise NotImplementedError()\n", "not implemented yet"),
    ("04-write", "writes the new tokens at slots 0 .. T-1, over the stored ones (no offset)",
     ("start, T = cache.length, k.shape[2]", "start, T = 0, k.shape[2]"), "over the tokens already stored"),
    # exercise 2: cached_attention
    ("04-attention", "attends only to the new tokens, not to the stored ones",
     ("y = explicit_attention(q, keys, values, allowed)",
      "y = explicit_attention(q, k, v, allowed[:, -T:])"), "the new tokens attend only to each other"),
    ("04-attention", "ignores the mask (new tokens see every stored token, value tokens included)",
     ("y = explicit_attention(q, keys, values, allowed)",
      "y = explicit_attention(q, keys, values, torch.ones_like(allowed))"), "the mask is ignored"),
    ("04-attention", "heads merged without moving the head axis back",
     ("y.transpose(1, 2).reshape(B, T, C)", "y.reshape(B, T, C)"), "merged without moving the head axis back"),
    ("04-attention", "no output projection", ("return attn.proj(y.transpose(1, 2).reshape(B, T, C))",
                                              "return y.transpose(1, 2).reshape(B, T, C)"),
     "the output projection is missing"),
    ("04-attention", "delegates to ttlib's CausalSelfAttention",
     "def cached_attention(attn, x, allowed, cache, layer):\n    return attn(x, allowed, cache, layer)\n", REFUSED),
    ("04-attention", "stores through the cache's own write, not write_kv",
     ("write_kv(cache, layer, k, v)", "cache.write(layer, k, v)"), REFUSED),
    ("04-attention", "heads split by a plain view to (B, H, T, D)",
     ("z.view(B, T, H, C // H).transpose(1, 2)", "z.view(B, H, T, C // H)"), "split by a plain view"),
    # exercise 3: cached_forward
    ("04-forward", "new tokens may see value tokens (Faster-TT: causal mask only)",
     ("allowed = model.allowed[start:start + T, :start + T]",
      "allowed = torch.tril(torch.ones(start + T, start + T, dtype=torch.bool, device=bins.device))[start:]"),
     "the value rule is missing in the cache"),
    ("04-forward", "the mask's first rows instead of the new tokens' rows",
     ("allowed = model.allowed[start:start + T, :start + T]", "allowed = model.allowed[:T, :start + T]"),
     "the mask's first T rows are used"),
    ("04-forward", "positions off by one", ("positions = torch.arange(start, start + T, device=bins.device)",
                                            "positions = torch.arange(start + 1, start + T + 1, device=bins.device)"),
     "the positions are off by one"),
    ("04-forward", "positions start at 0 for every call",
     ("positions = torch.arange(start, start + T, device=bins.device)",
      "positions = torch.arange(T, device=bins.device)"), "the positions start at 0 in every call"),
    ("04-forward", "advances the position inside the layer loop",
     ("        x = x + block.mlp(block.ln_2(x))\n    cache.length += T",
      "        x = x + block.mlp(block.ln_2(x))\n        cache.length += T"), "advanced inside the layer loop"),
    ("04-forward", "never advances the position", ("    cache.length += T  # every layer has stored the new tokens\n",
                                                   ""), "cache.length is never advanced"),
    ("04-forward", "no residual around attention",
     ("x = x + cached_attention(block.attn, block.ln_1(x), allowed, cache, layer)",
      "x = cached_attention(block.attn, block.ln_1(x), allowed, cache, layer)"),
     "the residual around attention is missing"),
    ("04-forward", "delegates to TrajectoryGPT.forward", '''def cached_forward(model, bins, cache):
    logits, _ = model(bins, cache=cache)
    return logits
''', REFUSED),
    ("04-forward", "delegates each layer to ttlib's Block",
     ("        x = x + cached_attention(block.attn, block.ln_1(x), allowed, cache, layer)\n"
      "        x = x + block.mlp(block.ln_2(x))\n", "        x = block(x, allowed, cache, layer)\n"), REFUSED),
    ("04-forward", "each layer's attention through ttlib's layer, not cached_attention",
     ("cached_attention(block.attn, block.ln_1(x), allowed, cache, layer)",
      "block.attn(block.ln_1(x), allowed, cache, layer)"), REFUSED),
    ("04-forward", "no final LayerNorm", ("return heads(model, model.ln_f(x), start)", "return heads(model, x, start)"),
     "the final LayerNorm is missing"),
    ("04-forward", "the heads told the new tokens start at position 0",
     ("return heads(model, model.ln_f(x), start)", "return heads(model, model.ln_f(x), 0)"),
     "the heads are told the new tokens start at position 0"),
    # exercise 4: reorder
    ("04-reorder", "keeps the old rows", '''def reorder(cache, indices):
    pass
''', "reorder keeps the old rows"),
    ("04-reorder", "reorders only the keys", ("    cache.v = cache.v.index_select(1, indices)\n", ""),
     "only the keys are reordered"),
    ("04-reorder", "gathers along the layer axis", ("cache.k = cache.k.index_select(1, indices)",
                                                    "cache.k = cache.k.index_select(0, indices)"),
     "the rows are gathered along axis 0"),
    ("04-reorder", "delegates to KVCache.reorder", '''def reorder(cache, indices):
    cache.reorder(indices)
''', REFUSED),
    ("04-reorder", "index_select called, its result not assigned",
     ("    cache.k = cache.k.index_select(1, indices)  # axis 1 is the batch of rows, in every layer at once\n"
      "    cache.v = cache.v.index_select(1, indices)\n",
      "    cache.k.index_select(1, indices)\n    cache.v.index_select(1, indices)\n"), "reorder keeps the old rows"),
    # no diagnosis fits: the message says where the answer first differs
    ("04-reorder", "cache.length set to the number of rows", '''def reorder(cache, indices):
    cache.k = cache.k.index_select(1, indices)
    cache.v = cache.v.index_select(1, indices)
    cache.length = len(indices)
''', "cache.length after your reorder"),
    # exercise 5: kv_cache_bytes
    ("04-cache-bytes", "counts the keys only", ("return 2 * n_layer", "return n_layer"), "only one buffer is counted"),
    ("04-cache-bytes", "allocates a KVCache to measure it", '''
def kv_cache_bytes(n_layer, batch, n_head, head_dim, capacity, bytes_per_number=4):
    dtype = {2: torch.float16, 4: torch.float32}[bytes_per_number]
    cache = KVCache(n_layer, batch, n_head, head_dim, capacity, dtype=dtype)
    return cache.k.nbytes + cache.v.nbytes
''', REFUSED),
    ("04-cache-bytes", "counts numbers, not bytes", (" * bytes_per_number", ""), "counts numbers, not bytes"),
    # no diagnosis fits: the message says where the answer first differs
    ("04-cache-bytes", "a tensor, not an int",
     '''def kv_cache_bytes(n_layer, batch, n_head, head_dim, capacity, bytes_per_number=4):
    shape = torch.tensor([n_layer, batch, n_head, capacity, head_dim])
    return 2 * shape.prod() * bytes_per_number
''', "is an int"),
]
