"""Wrong answers to notebook 01's exercises (see tests/test_exercises.py for the format)."""

REFUSED = "refuses to run"  # what a delegating answer's failure says (ttlib.exercises.refuse)
HEADS = '''def split_heads(x, n_head):
    B, T, C = x.shape
    return x.view(B, T, n_head, C // n_head).transpose(1, 2)


def merge_heads(y):
    B, H, T, D = y.shape
    return y.transpose(1, 2).reshape(B, T, H * D)


'''  # the right split and merge, for the answers that delegate the attention itself

ANSWERS = [
    ("01-sdpa", "no 1/sqrt(d) scaling", (" / math.sqrt(q.shape[-1])", ""), "without the 1/sqrt(d) scaling"),
    ("01-sdpa", "softmax over the queries, not the keys",
     ("torch.softmax(scores, dim=-1)", "torch.softmax(scores, dim=-2)"), "the softmax runs over the queries"),
    ("01-sdpa", "the mask read the wrong way round (True = hidden)", ("masked_fill(~mask", "masked_fill(mask"),
     "the mask is read the wrong way round"),
    ("01-sdpa", "scores divided by d, not sqrt(d)", ("/ math.sqrt(q.shape[-1])", "/ q.shape[-1]"),
     "divided by d, not by sqrt(d)"),
    ("01-sdpa", "masks after the softmax", ('''    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)  # each row sums to 1''', '''    weights = torch.softmax(scores, dim=-1)
    if mask is not None:
        weights = weights.masked_fill(~mask, 0.0)'''), "the mask is applied after the softmax"),
    # no diagnosis fits: the message says where the answer first differs
    ("01-sdpa", "masked scores set to 0 instead of -inf", ('scores.masked_fill(~mask, float("-inf"))', "scores * mask"),
     "attention output: "),
    ("01-sdpa", "delegates to PyTorch's SDPA", '''def scaled_dot_product_attention(q, k, v, mask=None):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
''', REFUSED),
    ("01-sdpa", "delegates to ttlib's attention", '''def scaled_dot_product_attention(q, k, v, mask=None):
    allowed = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool) if mask is None else mask
    return ttlib.model.attention.explicit_attention(q, k, v, allowed)
''', REFUSED),
    ("01-sdpa", "unsolved, with the checking helpers rebound to do nothing", '''import ttlib.course.checks

for name in ["check_close", "check_equal_arrays", "check_shape", "call"]:
    setattr(ttlib.course.checks, name, lambda *args, **kwargs: None)


def scaled_dot_product_attention(q, k, v, mask=None):
    raise NotImplementedError()
''', "not implemented yet"),
    ("01-mask", "the value rule off by one (hides the reward token)",
     ("== transition_dim - 1", "== transition_dim - 2"), "the value rule is off by one"),
    ("01-mask", "no causal rule", ("causal = torch.tril(torch.ones(n_tokens, n_tokens, dtype=torch.bool))",
                                  "causal = torch.ones(n_tokens, n_tokens, dtype=torch.bool)"),
     "the causal rule is missing"),
    ("01-mask", "the value rule on queries instead of keys",
     ("causal & ~is_value[None, :]", "causal & ~is_value[:, None]"), "hides value *queries* (rows)"),
    ("01-mask", "a token may not see itself", ("torch.tril(torch.ones(n_tokens, n_tokens, dtype=torch.bool))",
                                                "torch.tril(torch.ones(n_tokens, n_tokens, dtype=torch.bool), -1)"),
     "a token may not see itself"),
    ("01-mask", "a float mask of ones and zeros", ("return causal & ~is_value[None, :]",
                                                   "return (causal & ~is_value[None, :]).float()"), "the mask's dtype"),
    ("01-mask", "delegates to ttlib's mask", '''def trajectory_mask(n_tokens, transition_dim):
    return ttlib.model.gpt.trajectory_mask(n_tokens, transition_dim)
''', REFUSED),
    ("01-multi-head", "heads merged without moving the head axis back",
     ("y.transpose(1, 2).reshape(B, T, H * D)", "y.reshape(B, T, H * D)"), "merged without moving the head axis back"),
    ("01-multi-head", "heads split by a plain view (channels interleaved across heads)",
     ("x.view(B, T, n_head, C // n_head).transpose(1, 2)", "x.view(B, n_head, T, C // n_head)"),
     "split by a plain view"),
    ("01-multi-head", "no output projection", ("return proj(merge_heads(y))", "return merge_heads(y)"),
     "the output projection is missing"),
    ("01-multi-head", "key and query swapped",
     ("q, k, v = qkv(x).split(C, dim=-1)", "k, q, v = qkv(x).split(C, dim=-1)"), "in the wrong order"),
    ("01-multi-head", "delegates to ttlib's CausalSelfAttention",
     HEADS + '''def multi_head_attention(x, qkv, proj, n_head, mask):
    layer = ttlib.model.attention.CausalSelfAttention(x.shape[-1], n_head).eval()
    layer.qkv, layer.proj = qkv, proj
    return layer(x, mask)
''', REFUSED),
    ("01-multi-head", "delegates to nn.MultiheadAttention",
     HEADS + '''def multi_head_attention(x, qkv, proj, n_head, mask):
    C = x.shape[-1]
    layer = torch.nn.MultiheadAttention(C, n_head, batch_first=True)
    layer.in_proj_weight.data, layer.in_proj_bias.data = qkv.weight.data, qkv.bias.data
    layer.out_proj.weight.data, layer.out_proj.bias.data = proj.weight.data, proj.bias.data
    return layer(x, x, x, attn_mask=~mask, need_weights=False)[0]
''', REFUSED),
]
