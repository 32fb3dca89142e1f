"""Wrong answers to notebook 00's exercises (see tests/test_exercises.py for the format)."""

REFUSED = "refuses to run"  # what a delegating answer's failure says (ttlib.exercises.refuse)

ANSWERS = [
    ("00-discounted-values", "its own reward included (off by one)",
     ("values[t] = rewards[t + 1] + gamma", "values[t] = rewards[t] + gamma"), "includes its own step's reward"),
    ("00-discounted-values", "the next reward discounted too", ("rewards[t + 1] + gamma * values[t + 1]",
                                                                "gamma * (rewards[t + 1] + values[t + 1])"),
     "the next reward is discounted too"),
    ("00-discounted-values", "the loop stops before step 0", ("range(len(rewards) - 2, -1, -1)",
                                                              "range(len(rewards) - 2, 0, -1)"),
     "V_0 is never computed"),
    ("00-discounted-values", "delegates to ttlib's values", '''def discounted_values(rewards, gamma):
    return data.discounted_values(rewards, gamma)
''', REFUSED),
    ("00-discounted-values", "unsolved, with the checking helpers rebound to do nothing", '''import ttlib.course.checks

for name in ["check_close", "check_equal_arrays", "check_shape", "call", "check_own_code"]:
    setattr(ttlib.course.checks, name, lambda *args, **kwargs: None)


def discounted_values(rewards, gamma):
    raise NotImplementedError()
''', "not implemented yet"),
    # not in the catalogue before: slips a learner makes
    ("00-discounted-values", "the return-to-go G_t", '''def discounted_values(rewards, gamma):
    rewards = np.asarray(rewards, dtype=np.float64)
    values = rewards.copy()
    for t in range(len(rewards) - 2, -1, -1):
        values[t] = rewards[t] + gamma * values[t + 1]
    return values
''', "this is the return-to-go"),
    ("00-discounted-values", "a forward loop (reads V_{t+1} before it is computed)",
     ("range(len(rewards) - 2, -1, -1)", "range(len(rewards) - 1)"), "the loop runs forwards"),
    ("00-discounted-values", "gamma on the reward, not on the later values",  # no diagnosis: where it differs
     ("rewards[t + 1] + gamma * values[t + 1]", "gamma * rewards[t + 1] + values[t + 1]"),
     "discounted_values([2.0, 1.0, -1.0, -1.0], gamma=0.5): "),
    ("00-returns", "mean reward instead of the return", ("np.sum(r, dtype=np.float64)",
                                                          "np.mean(r, dtype=np.float64)"), "these are mean rewards"),
    ("00-returns", "scores scaled by the expert's return alone", ("/ (ref_max - ref_min)", "/ ref_max"),
     "divided by ref_max alone"),
    ("00-returns", "scores measured from the expert's end", ("- ref_min) /", "- ref_max) /"),
     "measured from the expert's return"),
    ("00-returns", "delegates to the dataset's methods", '''from ttlib.data.trajectories import OfflineDataset


def dataset(rewards, ref_min=0.0, ref_max=1.0):
    empty, flags = [np.zeros((len(r), 1)) for r in rewards], [np.zeros(len(r), bool) for r in rewards]
    return OfflineDataset("x/y-v0", None, {}, 0.99, empty, empty, list(rewards), flags, flags, list(rewards), None,
                          ref_min, ref_max)


def episode_returns(rewards):
    return dataset(rewards).returns()


def normalized_score(returns, ref_min, ref_max):
    return dataset([], ref_min, ref_max).normalized_score(returns)
''', REFUSED),
    ("00-returns", "loads the dataset to compute the scores", '''def episode_returns(rewards):
    return np.array([np.sum(r, dtype=np.float64) for r in rewards])


def normalized_score(returns, ref_min, ref_max):
    return data.load(progress=False).normalized_score(returns)
''', REFUSED),
    # not in the catalogue before
    ("00-returns", "discounted returns", ("np.sum(r, dtype=np.float64)",
                                          "np.sum(r * 0.99 ** np.arange(len(r)), dtype=np.float64)"),
     "these returns are discounted"),
    ("00-returns", "scores in percent", ("return (np.asarray(returns, dtype=np.float64) - ref_min)",
                                         "return 100 * (np.asarray(returns, dtype=np.float64) - ref_min)"),
     "these are percentages"),
    ("00-returns", "one total for all the episodes",  # no diagnosis: where it differs
     ("np.array([np.sum(r, dtype=np.float64) for r in rewards])", "np.sum([np.sum(r) for r in rewards])"),
     "episode_returns([[1.0, -1.0, -1.0], [-3.0], [-2.0]]) has shape () but should have shape (3,)"),
    ("00-best-episodes", "ranked by the mean reward per step",
     ("returns = episode_returns(rewards)", "returns = np.array([np.mean(r) for r in rewards])"),
     "ranked by their mean reward per step"),
    ("00-best-episodes", "ranked by the discounted return",
     ("returns = episode_returns(rewards)",
      "returns = np.array([np.sum(r * 0.99 ** np.arange(len(r))) for r in rewards])"),
     "ranked by their discounted return"),
    ("00-best-episodes", "the worst episodes", ("np.argsort(-returns)", "np.argsort(returns)"),
     "these are the *worst* episodes"),
    ("00-best-episodes", "the share rounded down (off by one)",
     ("max(1, math.ceil(percent / 100 * len(returns)))", "int(percent / 100 * len(returns))"),
     "one episode too few"),
    ("00-best-episodes", "one episode too many (off by one)", ("[:keep]", "[:keep + 1]"), "one episode too many"),
    ("00-best-episodes", "percent taken as a fraction", ("percent / 100 * len", "percent * len"),
     "percent is used as a fraction"),
    ("00-best-episodes", "indices in the order of their returns",
     ("return np.sort(np.argsort(-returns)[:keep])", "return np.argsort(-returns)[:keep]"),
     "in the order of their returns"),
    ("00-best-episodes", "delegates to ttlib's best_episodes", '''from ttlib.agents import baselines


def best_episodes(rewards, percent):
    return baselines.best_episodes([np.sum(r) for r in rewards], percent)
''', REFUSED),
    ("00-fit-policy", "the gradients never zeroed", ("        optimizer.zero_grad()\n", ""),
     "the gradients are never zeroed"),
    ("00-fit-policy", "no optimiser step", ("        optimizer.step()\n", ""), "the weights never change"),
    ("00-fit-policy", "a new Adam every step",
     ("    optimizer = torch.optim.Adam(policy.parameters(), lr=learning_rate)\n    losses = []\n"
      "    for _ in range(steps):\n",
      "    losses = []\n    for _ in range(steps):\n"
      "        optimizer = torch.optim.Adam(policy.parameters(), lr=learning_rate)\n"),
     "a new Adam is made every step"),
    ("00-fit-policy", "plain SGD", ("torch.optim.Adam", "torch.optim.SGD"), "this is plain SGD"),
    ("00-fit-policy", "an absolute error", ("** 2).mean()", ").abs().mean()"), "this is an absolute error"),
    ("00-fit-policy", "squared errors summed over the action's dimensions",
     ("** 2).mean()", "** 2).sum(dim=1).mean()"), "summed over the action's dimensions"),
    ("00-fit-policy", "batches from torch's global generator", (", generator=generator)", ")"),
     "torch's global random generator"),
    ("00-fit-policy", "delegates to ttlib's fit_policy", '''from ttlib.agents import baselines


def fit_policy(policy, observations, actions, steps, batch_size, learning_rate, generator):
    return baselines.fit_policy(policy, observations, actions, steps, batch_size, learning_rate, generator)
''', REFUSED),
]
