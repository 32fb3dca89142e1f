"""Wrong answers to notebook 05's exercises (see tests/test_exercises.py for the format)."""

REFUSED = "refuses to run"  # what a delegating answer's failure says (ttlib.checks.forbidding)

ANSWERS = [
    # exercise 1: sample_bins
    ("05-sample-bins", "top-k drops the k-th largest logit too",
     ("masked_fill(logits < kth", "masked_fill(logits <= kth")),
    ("05-sample-bins", "temperature multiplies instead of dividing",
     ("logits = logits / temperature", "logits = logits * temperature")),
    ("05-sample-bins", "softmax over the batch axis, not the bins",
     ("torch.softmax(logits, dim=-1).cumsum(dim=-1)", "torch.softmax(logits, dim=0).cumsum(dim=-1)")),
    ("05-sample-bins", "delegates to ttlib's sampler", '''def sample_bins(logits, uniform, top_k=None, temperature=1.0):
    return planning.sample_bins(logits, uniform, top_k, temperature)
''', REFUSED),
    # exercise 2: plan_score
    ("05-plan-score", "discounts start at gamma^1, not gamma^0",
     ("gamma ** torch.arange(T, dtype", "gamma ** torch.arange(1, T + 1, dtype")),
    ("05-plan-score", "the value not discounted by gamma^T", ("+ gamma**T * value", "+ value")),
    ("05-plan-score", "the value discounted by gamma^(T-1)", ("+ gamma**T * value", "+ gamma ** (T - 1) * value")),
    ("05-plan-score", "delegates to ttlib's score", '''def plan_score(rewards, value, gamma):
    return planning.plan_score(rewards, value, gamma)
''', REFUSED),
    # exercise 3: best_children
    ("05-best-children", "beams selected by the lowest score", ("descending=True", "descending=False")),
    ("05-best-children", "no environment offset (every environment's indices point into the first)",
     ("return (order + offsets).reshape(-1)", "return order.reshape(-1)")),
    ("05-best-children", "keeps one beam too few", (".indices[:, :beam_width]", ".indices[:, :beam_width - 1]")),
    ("05-best-children", "delegates to ttlib's selection", '''def best_children(score, n_envs, beam_width):
    return planning.best_children(score, n_envs, beam_width)
''', REFUSED),
    # exercise 4: the search loop
    ("05-beam-search", "no reorder of the cache after selection", ("        decoder.select(keep)\n", "")),
    ("05-beam-search", "the generated tokens not reordered with the kept rows",
     ("generated, rewards, values = generated[keep], rewards[keep], values[keep]",
      "generated, rewards, values = generated[:E * W], rewards[keep], values[keep]")),
    ("05-beam-search", "every action dimension sampled from the same random numbers",
     ("uniforms[:, a], config.top_k_action", "uniforms[:, 0], config.top_k_action")),
    ("05-beam-search", "the value read from the reward's logits (before the reward token is fed)",
     ("logits = decoder.feed(reward_bins)\n"
      "        values[:, t] = tokenizer.expectation(torch.softmax(logits, dim=-1), tokenizer.value_dim)",
      "values[:, t] = tokenizer.expectation(torch.softmax(logits, dim=-1), tokenizer.value_dim)\n"
      "        logits = decoder.feed(reward_bins)"),
     "scores at step 0"),
    ("05-beam-search", "the next observation sampled instead of decoded greedily",
     ("            bins = logits.argmax(dim=-1)  # (E*W,) the most likely next observation",
      "            bins = torch.multinomial(torch.softmax(logits, dim=-1), 1)[:, 0]")),
    ("05-beam-search", "the score without value_weight", ("config.value_weight * values[:, t]", "values[:, t]")),
    ("05-beam-search", "beams selected by the lowest score", ("keep = best_children(score, E, W)",
                                                              "keep = best_children(-score, E, W)")),
    ("05-beam-search", "delegates to ttlib's planner", '''@torch.inference_mode()
def beam_search(model, tokenizer, prefix, keys, config, decoder_class=planning.CachedDecoder, trace=None):
    return planning.beam_plan(model, tokenizer, prefix, keys, config, trace=trace)
''', REFUSED),
    ("05-beam-search", "unsolved, with the checking helpers rebound to do nothing", '''import ttlib.checks

for name in ["check_close", "check_equal_arrays", "check_shape", "check_function", "call", "check_own_code"]:
    setattr(ttlib.checks, name, lambda *args, **kwargs: None)


def beam_search(model, tokenizer, prefix, keys, config, decoder_class=planning.CachedDecoder, trace=None):
    raise NotImplementedError()
'''),
]
