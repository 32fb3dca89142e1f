"""Wrong answers to notebook 08's exercises (see tests/test_exercises.py for the format)."""

REFUSED = "refuses to run"  # what a delegating answer's failure says (ttlib.checks.forbidding)

ANSWERS = [
    ("08-split", "the extra episodes go to the last slices", ("1 if i < n_episodes % n_slices",
                                                             "1 if i >= n_slices - n_episodes % n_slices")),
    ("08-split", "empty slices for idle workers", ("n_slices = min(n_workers, n_episodes)", "n_slices = n_workers")),
    ("08-split", "round robin instead of contiguous slices", '''def split_episodes(n_episodes, n_workers):
    n_slices = min(n_workers, n_episodes)
    return [list(range(i, n_episodes, n_slices)) for i in range(n_slices)]
'''),
    ("08-split", "delegates to ttlib's slices", '''def split_episodes(n_episodes, n_workers):
    return distributed.slices(n_episodes, n_workers)
''', REFUSED),
    ("08-merge", "split_actions never moves past the first worker's rows", ("        start += n\n", "")),
    ("08-merge", "workers merged in reverse order", ('np.concatenate([o["prefix"] for o in observations])',
                                                     'np.concatenate([o["prefix"] for o in observations[::-1]])')),
    ("08-merge", "counts the context length, not the environments", ('[len(o["keys"]) for o in observations]',
                                                                     '[o["prefix"].shape[1] for o in observations]')),
    ("08-merge", "delegates to ttlib's merge and split", '''def merge_contexts(observations):
    return distributed.merge_observations(observations)


def split_actions(actions, counts):
    return distributed.split_actions(actions, counts)
''', REFUSED),
]
