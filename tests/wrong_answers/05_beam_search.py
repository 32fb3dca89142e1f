"""Wrong answers to notebook 05's exercises (see tests/test_exercises.py for the format)."""

REFUSED = "refuses to run"  # what a delegating answer's failure says (ttlib.exercises.refuse)

ANSWERS = [
    # exercise 1: sample_bins
    ("05-sample-bins", "top-k drops the k-th largest logit too",
     ("masked_fill(logits < kth", "masked_fill(logits <= kth"), "top-k drops the k-th largest logit too"),
    ("05-sample-bins", "temperature multiplies instead of dividing",
     ("logits = logits / temperature", "logits = logits * temperature"), "the temperature multiplies the logits"),
    ("05-sample-bins", "softmax over the batch axis, not the bins",
     ("torch.softmax(logits, dim=-1).cumsum(dim=-1)", "torch.softmax(logits, dim=0).cumsum(dim=-1)"),
     "the softmax runs over the batch axis"),
    ("05-sample-bins", "delegates to ttlib's sampler", '''def sample_bins(logits, uniform, top_k=None, temperature=1.0):
    return planning.sample_bins(logits, uniform, top_k, temperature)
''', REFUSED),
    ("05-sample-bins", "top-k left out", ('''    if top_k is not None and top_k < K:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]  # (B, 1) the k-th largest logit of each row
        logits = logits.masked_fill(logits < kth, float("-inf"))
''', ""), "top-k is not applied"),
    # no diagnosis fits: the message says where the answer first differs
    ("05-sample-bins", "torch.multinomial instead of the inverse CDF of `uniform`",
     ('''    cdf = torch.softmax(logits, dim=-1).cumsum(dim=-1)  # (B, K)
    threshold = uniform.to(cdf.dtype)[:, None] * cdf[:, -1:]  # (B, 1)
    return (cdf <= threshold).sum(dim=-1).clamp(max=K - 1)''',
      "    return torch.multinomial(torch.softmax(logits, dim=-1), 1)[:, 0]"), "the bins your sample_bins("),
    # exercise 2: plan_score
    ("05-plan-score", "discounts start at gamma^1, not gamma^0",
     ("gamma ** torch.arange(T, dtype", "gamma ** torch.arange(1, T + 1, dtype"), "the discounts start at gamma^1"),
    ("05-plan-score", "the value not discounted by gamma^T", ("+ gamma**T * value", "+ value"),
     "the value is not discounted"),
    ("05-plan-score", "the value discounted by gamma^(T-1)", ("+ gamma**T * value", "+ gamma ** (T - 1) * value"),
     "the value is discounted by gamma^(T-1)"),
    ("05-plan-score", "delegates to ttlib's score", '''def plan_score(rewards, value, gamma):
    return planning.plan_score(rewards, value, gamma)
''', REFUSED),
    ("05-plan-score", "the rewards summed without their discounts",
     ("(rewards * discounts).sum(dim=1)", "rewards.sum(dim=1)"), "the rewards are not discounted"),
    # no diagnosis fits: the message says where the answer first differs
    ("05-plan-score", "a (B, 1) score (keepdim)",
     ("(rewards * discounts).sum(dim=1) + gamma**T * value",
      "(rewards * discounts).sum(dim=1, keepdim=True) + gamma**T * value[:, None]"), "should have shape"),
    # exercise 3: best_children
    ("05-best-children", "beams selected by the lowest score", ("descending=True", "descending=False"),
     "the lowest scores are kept"),
    ("05-best-children", "no environment offset (every environment's indices point into the first)",
     ("return (order + offsets).reshape(-1)", "return order.reshape(-1)"), "row offsets are missing"),
    ("05-best-children", "keeps one beam too few", (".indices[:, :beam_width]", ".indices[:, :beam_width - 1]"),
     "one beam too few"),
    ("05-best-children", "delegates to ttlib's selection", '''def best_children(score, n_envs, beam_width):
    return planning.best_children(score, n_envs, beam_width)
''', REFUSED),
    ("05-best-children", "one sort over every environment's children", '''def best_children(score, n_envs, beam_width):
    return torch.sort(score, descending=True, stable=True).indices[:n_envs * beam_width]
''', "mixes the environments"),
    # no diagnosis fits: the message says where the answer first differs
    ("05-best-children", "an (E, W) table of rows, not flattened",
     ("return (order + offsets).reshape(-1)", "return order + offsets"), "should have shape"),
    # exercise 4: the search loop
    ("05-beam-search", "no reorder of the cache after selection", ("        decoder.select(keep)\n", ""),
     "a loop that never reorders the cache"),
    ("05-beam-search", "the generated tokens not reordered with the kept rows",
     ("generated, rewards, values = generated[keep], rewards[keep], values[keep]",
      "generated, rewards, values = generated[:E * W], rewards[keep], values[keep]"),
     "the generated tokens are not reordered with the kept rows"),
    ("05-beam-search", "every action dimension sampled from the same random numbers",
     ("uniforms[:, a], config.top_k_action", "uniforms[:, 0], config.top_k_action"),
     "every action dimension is sampled from the same random numbers"),
    ("05-beam-search", "the value read from the reward's logits (before the reward token is fed)",
     ("logits = decoder.feed(reward_bins)\n"
      "        values[:, t] = tokenizer.expectation(torch.softmax(logits, dim=-1), tokenizer.value_dim)",
      "values[:, t] = tokenizer.expectation(torch.softmax(logits, dim=-1), tokenizer.value_dim)\n"
      "        logits = decoder.feed(reward_bins)"),
     "the value is read from the reward's logits"),
    ("05-beam-search", "the next observation sampled instead of decoded greedily",
     ("            bins = logits.argmax(dim=-1)  # (E*W,) the most likely next observation",
      "            bins = torch.multinomial(torch.softmax(logits, dim=-1), 1)[:, 0]"),
     "the next observation is sampled"),
    ("05-beam-search", "the score without value_weight", ("config.value_weight * values[:, t]", "values[:, t]"),
     "the score leaves out value_weight"),
    ("05-beam-search", "beams selected by the lowest score", ("keep = best_children(score, E, W)",
                                                              "keep = best_children(-score, E, W)"),
     "the lowest scores are kept"),
    ("05-beam-search", "delegates to ttlib's planner", '''@torch.inference_mode()
def beam_search(model, tokenizer, prefix, keys, config, decoder_class=decoders.CachedDecoder, trace=None):
    return planning.beam_plan(model, tokenizer, prefix, keys, config, trace=trace)
''', REFUSED),
    ("05-beam-search", "unsolved, with the checking helpers rebound to do nothing", '''import ttlib.course.checks

for name in ["check_close", "check_equal_arrays", "check_shape", "call", "check_own_code"]:
    setattr(ttlib.course.checks, name, lambda *args, **kwargs: None)


def beam_search(model, tokenizer, prefix, keys, config, decoder_class=decoders.CachedDecoder, trace=None):
    raise NotImplementedError()
''', "not implemented yet"),
    ("05-beam-search", "children expanded with .repeat (the batch tiled, not each row repeated)",
     ("(x.repeat_interleave(X, dim=0) for x in (generated, rewards, values))",
      "(x.repeat(X, 1) for x in (generated, rewards, values))"), ".repeat, which tiles the whole batch"),
    ("05-beam-search", "the logits not expanded with the rows",
     ("        logits = logits.repeat_interleave(X, dim=0)  # (E*W*X, K)\n", ""), "the logits are not expanded"),
    # no diagnosis fits: the message says where the answer first differs
    ("05-beam-search", "the value bins kept but not appended to generated",
     ("        generated = torch.cat([generated, value_bins[:, None]], dim=1)\n", ""),
     "the shape of the best plans' bins"),
]

# exercise 4's graded stages: 4a (stages 1-2) and 4b (stages 1-4) name the mistakes of their stages -- the same
# answers as 4c's above -- and a loop whose stage is not written yet is told so; mistakes in later stages pass them
# (tests/test_grading.py's "bug")
STAGES = {"05-beam-search-actions": ["every action dimension sampled from the same random numbers",
                                     "the logits not expanded with the rows"],
          "05-beam-search-scores": ["the value read from the reward's logits (before the reward token is fed)",
                                    "the score without value_weight", "beams selected by the lowest score"]}
ANSWERS += [(stage, why, answer, says) for stage, whys in STAGES.items()
            for grade_id, why, answer, says in ANSWERS if grade_id == "05-beam-search" and why in whys]
ANSWERS += [
    ("05-beam-search-actions", "stage 1 not written yet",
     ("        decoder.expand(X)\n        logits = logits.repeat_interleave(X, dim=0)  # (E*W*X, K)\n",
      "        raise NotImplementedError()\n"), "not implemented yet"),
    ("05-beam-search-scores", "the actions right, the reward's expectation taken over the value's bins",
     ("rewards[:, t] = tokenizer.expectation(torch.softmax(logits, dim=-1), tokenizer.reward_dim)",
      "rewards[:, t] = tokenizer.expectation(torch.softmax(logits, dim=-1), tokenizer.value_dim)"),
     "step 0, stage 4: the children's scores"),
]
