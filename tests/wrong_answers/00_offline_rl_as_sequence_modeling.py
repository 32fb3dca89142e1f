"""Wrong answers to notebook 00's exercises (see tests/test_exercises.py for the format)."""

REFUSED = "refuses to run"  # what a delegating answer's failure says (ttlib.checks.forbidding)

ANSWERS = [
    ("00-discounted-values", "its own reward included (off by one)",
     ("values[t] = rewards[t + 1] + gamma", "values[t] = rewards[t] + gamma")),
    ("00-discounted-values", "the next reward discounted too", ("rewards[t + 1] + gamma * values[t + 1]",
                                                                "gamma * (rewards[t + 1] + values[t + 1])")),
    ("00-discounted-values", "the loop stops before step 0", ("range(len(rewards) - 2, -1, -1)",
                                                              "range(len(rewards) - 2, 0, -1)")),
    ("00-discounted-values", "delegates to ttlib's values", '''def discounted_values(rewards, gamma):
    return data.discounted_values(rewards, gamma)
''', REFUSED),
    ("00-discounted-values", "unsolved, with the checking helpers rebound to do nothing", '''import ttlib.checks

for name in ["check_close", "check_equal_arrays", "check_shape", "check_function", "call", "check_own_code"]:
    setattr(ttlib.checks, name, lambda *args, **kwargs: None)


def discounted_values(rewards, gamma):
    raise NotImplementedError()
'''),
    ("00-returns", "mean reward instead of the return", ("np.sum(r, dtype=np.float64)",
                                                          "np.mean(r, dtype=np.float64)")),
    ("00-returns", "scores scaled by the expert's return alone", ("/ (ref_max - ref_min)", "/ ref_max")),
    ("00-returns", "scores measured from the expert's end", ("- ref_min) /", "- ref_max) /")),
    ("00-returns", "delegates to the dataset's methods", '''import dataclasses


def episode_returns(rewards):
    return dataclasses.replace(d, rewards=list(rewards)).returns()


def normalized_score(returns, ref_min, ref_max):
    return dataclasses.replace(d, ref_min_score=ref_min, ref_max_score=ref_max).normalized_score(returns)
''', REFUSED),
]
