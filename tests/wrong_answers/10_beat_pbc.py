"""Wrong answers to notebook 10's challenge (see tests/test_exercises.py for the format): agents that do not
clear a band, each named by the band check's message."""

ANSWERS = [
    ("10-your-agent", "BC on every episode, trained briefly: copies the random flights too", '''def train_agent(data):
    config = baselines.PolicyConfig(kind="bc", steps=200)
    policy, history = baselines.train_policy(data, config)
    return challenge.save_policy(policy, config, data, history)
''', "not reached on the public seeds"),
    ("10-your-agent", "an agent trained on the course dataset, not this one", '''def train_agent(data):
    config = baselines.PolicyConfig(kind="bc", top_percent=25, steps=50)
    other = ttdata.load(progress=False)
    policy, history = baselines.train_policy(other, config)
    return challenge.save_policy(policy, config, other, history)
''', "the challenge is on ttlib/lunarlander/no-expert-v0"),
]
