"""Wrong answers to notebook 06's exercises (see tests/test_exercises.py for the format)."""

REFUSED = "refuses to run"  # what a delegating answer's failure says (ttlib.exercises.refuse)
VALUE_LOSS = '''def value_loss(critic, target, batch, tau):
    with torch.no_grad():
        q = target.q(batch["obs"], batch["act"])
    return expectile_loss(q - critic.v(batch["obs"]), tau)


'''  # the right V loss, for the answers whose q_loss is wrong

ANSWERS = [
    # exercise 1: the expectile loss
    ("06-expectile-loss", "the weights swapped: overestimates cost tau",
     ("torch.where(diff < 0, 1 - tau, tau)", "torch.where(diff < 0, tau, 1 - tau)"), "the weights are swapped"),
    ("06-expectile-loss", "an absolute error instead of a squared one",
     ("(weight * diff**2)", "(weight * diff.abs())"), "this is an absolute error"),
    ("06-expectile-loss", "summed, not averaged", ("(weight * diff**2).mean()", "(weight * diff**2).sum()"),
     "the loss is summed, not averaged"),
    ("06-expectile-loss", "no asymmetry: every error weighted tau", ("torch.where(diff < 0, 1 - tau, tau)", "tau"),
     "every error is weighted tau"),
    ("06-expectile-loss", "computed in numpy: right numbers, but no gradient reaches the critic",
     '''def expectile_loss(diff, tau):
    u = diff.detach().numpy()
    return torch.tensor(float(np.mean(np.where(u < 0, 1 - tau, tau) * u**2)), dtype=diff.dtype)
''', "no gradient reaches the critic"),
    ("06-expectile-loss", "delegates to ttlib's loss", '''def expectile_loss(diff, tau):
    return ttlib.agents.critic.expectile_loss(diff, tau)
''', REFUSED),
    # new: the weight squared with the error
    ("06-expectile-loss", "the weight inside the square", ("(weight * diff**2).mean()", "((weight * diff)**2).mean()"),
     "the weight is squared with the error"),
    # new: |tau - 1[u < 0]| written without the absolute value
    ("06-expectile-loss", "tau - 1[u < 0] without the absolute value",
     ("torch.where(diff < 0, 1 - tau, tau)", "tau - (diff < 0).to(diff.dtype)"), "the absolute value is missing"),
    # new, no diagnosis: always float32 -- the message says where it first differs
    ("06-expectile-loss", "the loss cast to float32",
     ("(weight * diff**2).mean()", "(weight * diff**2).mean().float()"), "its dtype: expected float64, got float32"),
    # exercise 2: the TD target
    ("06-td-target", "no (1 - done)", ("gamma * (1 - batch[\"done\"]) * critic", "gamma * critic"),
     "the end of an episode is ignored"),
    ("06-td-target", "no discount", ("gamma * (1 - batch[\"done\"])", "(1 - batch[\"done\"])"),
     "the discount is missing"),
    ("06-td-target", "gradient flows through the target",
     ("    with torch.no_grad():  # a target to regress on: no gradient flows back into V\n"
      "        return batch", "    if True:\n        return batch"), "computed with gradient"),
    ("06-td-target", "V of the state s, not of s'", ('critic.v(batch["next_obs"])', 'critic.v(batch["obs"])'),
     "V is evaluated at the transition's own state"),
    # new: (1 - done) put around the whole target
    ("06-td-target", "(1 - done) multiplies the reward too",
     ('batch["reward"] + gamma * (1 - batch["done"]) * critic.v(batch["next_obs"])',
      '(1 - batch["done"]) * (batch["reward"] + gamma * critic.v(batch["next_obs"]))'),
     "multiplies the reward too"),
    # new: done where 1 - done belongs
    ("06-td-target", "done instead of 1 - done", ('(1 - batch["done"])', 'batch["done"]'),
     "done is used where 1 - done belongs"),
    # new, no diagnosis: the discount applied to the reward as well
    ("06-td-target", "the reward discounted too",
     ('batch["reward"] + gamma * (1 - batch["done"]) * critic.v(batch["next_obs"])',
      'gamma * (batch["reward"] + (1 - batch["done"]) * critic.v(batch["next_obs"]))'), "td_target(critic, batch of"),
    ("06-td-target", "delegates to ttlib's target", '''def td_target(critic, batch, gamma):
    return ttlib.agents.critic.td_target(critic, batch, gamma)
''', REFUSED),
    # exercise 3: the two losses of an IQL step
    ("06-iql-losses", "V regressed on the trained Q networks, not the target ones",
     ('q = target.q(batch["obs"], batch["act"])', 'q = critic.q(batch["obs"], batch["act"])'),
     "V is regressed on the Q networks being trained"),
    ("06-iql-losses", "V's error with the sign flipped (V - Q)",
     ('expectile_loss(q - critic.v(batch["obs"]), tau)', 'expectile_loss(critic.v(batch["obs"]) - q, tau)'),
     "V's error has its sign flipped"),
    ("06-iql-losses", "only one Q network trained",
     ("return ((q1 - y) ** 2).mean() + ((q2 - y) ** 2).mean()", "return ((q1 - y) ** 2).mean()"),
     "only one Q network is trained"),
    ("06-iql-losses", "the TD target computed inline, with gradient", VALUE_LOSS + '''def q_loss(critic, batch, gamma):
    y = batch["reward"] + gamma * (1 - batch["done"]) * critic.v(batch["next_obs"])
    q1, q2 = critic.q_pair(batch["obs"], batch["act"])
    return ((q1 - y) ** 2).mean() + ((q2 - y) ** 2).mean()
''', "q_loss sends a gradient into V"),
    ("06-iql-losses", "the TD target inline, without (1 - done)", VALUE_LOSS + '''def q_loss(critic, batch, gamma):
    with torch.no_grad():
        y = batch["reward"] + gamma * critic.v(batch["next_obs"])
    q1, q2 = critic.q_pair(batch["obs"], batch["act"])
    return ((q1 - y) ** 2).mean() + ((q2 - y) ** 2).mean()
''', "the end of an episode is ignored"),
    ("06-iql-losses", "the TD target inline, without the discount", VALUE_LOSS + '''def q_loss(critic, batch, gamma):
    with torch.no_grad():
        y = batch["reward"] + (1 - batch["done"]) * critic.v(batch["next_obs"])
    q1, q2 = critic.q_pair(batch["obs"], batch["act"])
    return ((q1 - y) ** 2).mean() + ((q2 - y) ** 2).mean()
''', "the discount is missing"),
    ("06-iql-losses", "the target networks' Q computed with gradient",
     ('    with torch.no_grad():\n        q = target.q(batch["obs"], batch["act"])',
      '    if True:\n        q = target.q(batch["obs"], batch["act"])'),
     "the target networks' Q is computed with gradient"),
    # new: the mean of the two target networks instead of the smaller
    ("06-iql-losses", "V regressed on the mean of the two target Q networks",
     ('q = target.q(batch["obs"], batch["act"])', 'q = sum(target.q_pair(batch["obs"], batch["act"])) / 2'),
     "the mean of the two target Q networks"),
    # new: the two Q losses averaged
    ("06-iql-losses", "the two Q losses averaged, not added",
     ("return ((q1 - y) ** 2).mean() + ((q2 - y) ** 2).mean()",
      "return (((q1 - y) ** 2).mean() + ((q2 - y) ** 2).mean()) / 2"), "averaged, not added"),
    # new: min(Q1, Q2) regressed
    ("06-iql-losses", "min(Q1, Q2) regressed on the target",
     ("return ((q1 - y) ** 2).mean() + ((q2 - y) ** 2).mean()", "return ((torch.minimum(q1, q2) - y) ** 2).mean()"),
     "min(Q1, Q2) is regressed on the target"),
    # new: V fitted with a plain squared error
    ("06-iql-losses", "V fitted with a plain squared error",
     ('return expectile_loss(q - critic.v(batch["obs"]), tau)', 'return ((q - critic.v(batch["obs"])) ** 2).mean()'),
     "V is fitted with a plain squared error"),
    # new, no diagnosis: the squared errors summed over the batch
    ("06-iql-losses", "Q's squared errors summed over the batch",
     ("return ((q1 - y) ** 2).mean() + ((q2 - y) ** 2).mean()", "return ((q1 - y) ** 2 + (q2 - y) ** 2).sum()"),
     "q_loss(critic, batch of"),
    ("06-iql-losses", "delegates to ttlib's losses", '''def value_loss(critic, target, batch, tau):
    return ttlib.agents.critic.value_loss(critic, target, batch, tau)


def q_loss(critic, batch, gamma):
    return ttlib.agents.critic.q_loss(critic, batch, gamma)
''', REFUSED),
]
