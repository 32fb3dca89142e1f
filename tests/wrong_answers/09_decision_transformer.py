"""Wrong answers to notebook 09's exercises (see tests/test_exercises.py for the format)."""

REFUSED = "refuses to run"  # what a delegating answer's failure says (ttlib.checks.forbidding)

ANSWERS = [
    ("09-returns-to-go", "rewards summed forwards, not backwards", ("np.cumsum(rewards[::-1])[::-1]",
                                                                   "np.cumsum(rewards)")),
    ("09-returns-to-go", "r_t left out (what is left after step t)", ("np.cumsum(rewards[::-1])[::-1]",
                                                                      "(np.cumsum(rewards[::-1])[::-1] - rewards)")),
    ("09-returns-to-go", "delegates to ttlib's returns-to-go", '''def returns_to_go(rewards):
    return dt.returns_to_go(rewards)
''', REFUSED),
    # last of its exercise: the rebinding stays for the rest of the kernel (nothing after this exercise uses it)
    ("09-returns-to-go", "summed forwards, with ttlib's returns_to_go rebound to agree", '''def returns_to_go(rewards):
    return np.cumsum(np.asarray(rewards, dtype=np.float64)).astype(np.float32)


dt.returns_to_go = returns_to_go  # the visible check now compares this answer with itself
''', "was written in this notebook"),
    ("09-interleave", "stacked on the time axis: all returns first", ("dim=2", "dim=1")),
    ("09-interleave", "concatenated, not interleaved", ("torch.stack([returns, states, actions], dim=2).reshape",
                                                        "torch.cat([returns, states, actions], dim=1).reshape")),
    ("09-interleave", "the order s, R, a", ("[returns, states, actions]", "[states, returns, actions]")),
    ("09-interleave", "delegates to ttlib's interleave", '''def interleave(returns, states, actions):
    return dt.interleave(returns, states, actions)
''', REFUSED),
    ("09-return-tokens", "each reward subtracted before its own action", (
        "np.concatenate([[0.0], np.cumsum(rewards)[:-1]])", "np.cumsum(rewards)")),
    ("09-return-tokens", "rewards added to the target", ("return target - ", "return target + ")),
    ("09-return-tokens", "delegates to DTAgent's bookkeeping", '''def return_tokens(target, rewards):
    agent = dt.DTAgent(small, target, n_envs=1)
    fed = []
    for r in rewards:
        fed.append(agent.target.item())
        agent.observe([r])
    return np.array(fed)
''', REFUSED),
]
