"""Wrong answers to notebook 09's exercises (see tests/test_exercises.py for the format)."""

REFUSED = "refuses to run"  # what a delegating answer's failure says (ttlib.exercises.refuse)

ANSWERS = [
    ("09-returns-to-go", "rewards summed forwards, not backwards", ("np.cumsum(rewards[::-1])[::-1]",
                                                                   "np.cumsum(rewards)"), "summed from the start"),
    ("09-returns-to-go", "r_t left out (what is left after step t)", ("np.cumsum(rewards[::-1])[::-1]",
                                                                      "(np.cumsum(rewards[::-1])[::-1] - rewards)"),
     "R_t leaves out r_t"),
    ("09-returns-to-go", "delegates to ttlib's returns-to-go", '''def returns_to_go(rewards):
    return dt.returns_to_go(rewards)
''', REFUSED),
    # not in the first catalogue
    ("09-returns-to-go", "the reversed cumulative sum not reversed back",
     ("np.cumsum(rewards[::-1])[::-1]", "np.cumsum(rewards[::-1])"), "is not reversed back"),
    ("09-returns-to-go", "discounted returns (gamma 0.99)", '''def returns_to_go(rewards):
    returns, later = np.zeros(len(rewards)), 0.0
    for t in reversed(range(len(rewards))):
        later = rewards[t] + 0.99 * later
        returns[t] = later
    return returns.astype(np.float32)
''', "are discounted"),
    # no diagnosis fits: the message says where the answer first differs
    ("09-returns-to-go", "float64 returned", ("[::-1].astype(np.float32)", "[::-1]"),
     "the dtype of your returns-to-go"),
    # last of its exercise: the rebinding stays for the rest of the kernel (nothing after this exercise uses it); the
    # check's reference is the one ttlib.exercises.dt took when it was imported
    ("09-returns-to-go", "summed forwards, with ttlib's returns_to_go rebound to agree", '''def returns_to_go(rewards):
    return np.cumsum(np.asarray(rewards, dtype=np.float64)).astype(np.float32)


dt.returns_to_go = returns_to_go  # the visible check now compares this answer with itself
''', "summed from the start"),
    ("09-interleave", "stacked on the time axis: all returns first", ("dim=2", "dim=1"), "all the returns come first"),
    ("09-interleave", "concatenated, not interleaved", ("torch.stack([returns, states, actions], dim=2).reshape",
                                                        "torch.cat([returns, states, actions], dim=1).reshape"),
     "all the returns come first"),
    ("09-interleave", "the order s, R, a", ("[returns, states, actions]", "[states, returns, actions]"),
     "in the order s, R, a"),
    ("09-interleave", "delegates to ttlib's interleave", '''def interleave(returns, states, actions):
    return dt.interleave(returns, states, actions)
''', REFUSED),
    # not in the first catalogue
    ("09-interleave", "stacked on the channel axis", ("dim=2", "dim=-1"), "stacked on the last axis"),
    ("09-interleave", "the order R, a, s", ("[returns, states, actions]", "[returns, actions, states]"),
     "in the order R, a, s"),
    # no diagnosis fits: the message says where the answer first differs
    ("09-interleave", "stacked but not reshaped: (B, T, 3, C)", (".reshape(B, 3 * T, C)", ""),
     "but should have shape (1, 6, 1)"),
    ("09-return-tokens", "each reward subtracted before its own action", (
        "np.concatenate([[0.0], np.cumsum(rewards)[:-1]])", "np.cumsum(rewards)"), "subtracted before its own action"),
    ("09-return-tokens", "rewards added to the target", ("return target - ", "return target + "),
     "added to the target"),
    ("09-return-tokens", "delegates to DTAgent's bookkeeping", '''def return_tokens(target, rewards):
    model = dt.DecisionTransformer(dt.DTConfig(obs_dim=8, act_dim=2, context=3, n_layer=1, n_embd=8)).eval()
    agent = dt.DTAgent(model, target, n_envs=1)
    fed = []
    for r in rewards:
        fed.append(agent.target.item())
        agent.observe([r])
    return np.array(fed)
''', REFUSED),
    # not in the first catalogue
    ("09-return-tokens", "the data's returns-to-go of the rewards (exercise 1), not the target's books",
     '''def return_tokens(target, rewards):
    return returns_to_go(rewards)
''', "the data's returns-to-go"),
    ("09-return-tokens", "divided by 100 (the model's scale)", (
        "return target - np.concatenate([[0.0], np.cumsum(rewards)[:-1]])",
        "return (target - np.concatenate([[0.0], np.cumsum(rewards)[:-1]])) / 100"), "divided by 100"),
    # no diagnosis fits: the message says where the answer first differs
    ("09-return-tokens", "one token too many: R_T, after the last reward, included",
     ("np.cumsum(rewards)[:-1]", "np.cumsum(rewards)"), "should have shape (3,)"),
]
