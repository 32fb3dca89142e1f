"""Wrong answers to notebook 06's exercises (see tests/test_exercises.py for the format)."""

REFUSED = "refuses to run"  # what a delegating answer's failure says (ttlib.checks.forbidding)

# demo cells no exercise needs: the full episodes and the branched expert flights before exercise 1
SKIP = ["06-031", "06-034"]

ANSWERS = [
    ("06-expectile-loss", "the weights swapped: overestimates cost tau",
     ("torch.where(diff < 0, 1 - tau, tau)", "torch.where(diff < 0, tau, 1 - tau)")),
    ("06-expectile-loss", "an absolute error instead of a squared one",
     ("(weight * diff**2)", "(weight * diff.abs())")),
    ("06-expectile-loss", "summed, not averaged", ("(weight * diff**2).mean()", "(weight * diff**2).sum()")),
    ("06-expectile-loss", "no asymmetry: every error weighted tau", ("torch.where(diff < 0, 1 - tau, tau)", "tau")),
    ("06-expectile-loss", "computed in numpy: right numbers, but no gradient reaches the critic",
     '''def expectile_loss(diff, tau):
    u = diff.detach().numpy()
    return torch.tensor(float(np.mean(np.where(u < 0, 1 - tau, tau) * u**2)), dtype=diff.dtype)
''', "gradients flow through"),
    ("06-expectile-loss", "delegates to ttlib's loss", '''def expectile_loss(diff, tau):
    return ttlib.critic.expectile_loss(diff, tau)
''', REFUSED),
]
