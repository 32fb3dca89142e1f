'''Wrong answers to notebook 08's exercises (see tests/test_exercises.py for the format).'''

REFUSED = "refuses to run"  # what a delegating answer's failure says (ttlib.exercises.refuse)

ANSWERS = [
    ("08-split", "the extra episodes go to the last slices", ("1 if i < n_episodes % n_slices",
                                                             "1 if i >= n_slices - n_episodes % n_slices"),
     "the extra episodes go to the last slices"),
    ("08-split", "empty slices for idle workers", ("n_slices = min(n_workers, n_episodes)", "n_slices = n_workers"),
     "workers without an episode get an empty slice"),
    ("08-split", "round robin instead of contiguous slices", '''def split_episodes(n_episodes, n_workers):
    n_slices = min(n_workers, n_episodes)
    return [list(range(i, n_episodes, n_slices)) for i in range(n_slices)]
''', "round robin"),
    ("08-split", "delegates to ttlib's slices", '''def split_episodes(n_episodes, n_workers):
    return distributed.slices(n_episodes, n_workers)
''', REFUSED),
    # not in the catalogue before: slips a learner makes
    ("08-split", "np.array_split, without a case for zero episodes", '''def split_episodes(n_episodes, n_workers):
    return [list(s) for s in np.array_split(np.arange(n_episodes), min(n_workers, n_episodes))]
''', "np.array_split with 0 sections raises"),
    ("08-split", "slices as NumPy arrays", ("slices.append(list(range(start, start + size)))",
                                            "slices.append(np.arange(start, start + size))"),
     "the slices are NumPy arrays"),
    ("08-split", "slices of ceil(n / k) episodes, the last one short", '''def split_episodes(n_episodes, n_workers):
    if n_episodes == 0:
        return []
    size = -(-n_episodes // n_workers)
    return [list(range(start, min(start + size, n_episodes))) for start in range(0, n_episodes, size)]
''', "split_episodes(9, 7): expected [[0, 1], [2, 3], [4], [5], [6], [7], [8]], got"),  # no diagnosis: where
    ("08-merge", "split_actions never moves past the first worker's rows", ("        start += n\n", ""),
     "every worker gets the first rows of the batch"),
    ("08-merge", "workers merged in reverse order", ('np.concatenate([o["prefix"] for o in observations])',
                                                     'np.concatenate([o["prefix"] for o in observations[::-1]])'),
     "merged in reverse order of the workers"),
    ("08-merge", "counts the context length, not the environments", ('[len(o["keys"]) for o in observations]',
                                                                     '[o["prefix"].shape[1] for o in observations]'),
     "the counts are the contexts' length"),
    ("08-merge", "delegates to ttlib's merge and split", '''def merge_contexts(observations):
    return distributed.merge_observations(observations)


def split_actions(actions, counts):
    return distributed.split_actions(actions, counts)
''', REFUSED),
    # not in the catalogue before
    ("08-merge", "prefix and keys both merged in reverse order", '''def merge_contexts(observations):
    prefix = torch.as_tensor(np.concatenate([o["prefix"] for o in reversed(observations)]), dtype=torch.long)
    keys = torch.as_tensor(np.concatenate([o["keys"] for o in reversed(observations)]), dtype=torch.int64)
    return prefix, keys, [len(o["keys"]) for o in observations]


def split_actions(actions, counts):
    actions = np.asarray(actions)
    parts, start = [], 0
    for n in counts:
        parts.append(actions[start:start + n])
        start += n
    return parts
''', "the workers' rows are merged in reverse order"),
    ("08-merge", "keys cast to 32 bits", ("dtype=torch.int64)", "dtype=torch.int32)"), "cast to 32 bits"),
    ("08-merge", "actions cut into equal parts", '''def merge_contexts(observations):
    prefix = torch.as_tensor(np.concatenate([o["prefix"] for o in observations]), dtype=torch.long)
    keys = torch.as_tensor(np.concatenate([o["keys"] for o in observations]), dtype=torch.int64)
    return prefix, keys, [len(o["keys"]) for o in observations]


def split_actions(actions, counts):
    return np.array_split(np.asarray(actions), len(counts))
''', "cut into equal parts"),
    ("08-merge", "the merged prefix left a NumPy array",  # no diagnosis: where it differs
     ('prefix = torch.as_tensor(np.concatenate([o["prefix"] for o in observations]), dtype=torch.long)',
      'prefix = np.concatenate([o["prefix"] for o in observations])'),
     "what the merged prefix is: expected torch.Tensor of torch.int64, got numpy.ndarray of int64"),
    ("08-shards", "the mean of the workers' means", '''def shard_objective(loss_sum, n_real, world_size, all_reduce):
    mean = loss_sum / n_real.clamp(min=1)
    batch_loss = mean.detach().clone()
    all_reduce(batch_loss)
    return mean, batch_loss / world_size
''', "every worker backpropagates the mean loss of its own slice"),
    ("08-shards", "divides by this worker's own count", ("return loss_sum * world_size / batch_real",
                                                         "return loss_sum * world_size / n_real.clamp(min=1)"),
     "each worker divides by its own count of real targets"),
    ("08-shards", "forgets that DDP averages over the workers", ("loss_sum * world_size / batch_real",
                                                                 "loss_sum / batch_real"),
     "is not multiplied by world_size"),
    ("08-shards", "delegates to ttlib's", '''def shard_objective(loss_sum, n_real, world_size, all_reduce):
    from ttlib.training import data_parallel

    return data_parallel.shard_objective(loss_sum, n_real, world_size, all_reduce)
''', REFUSED),
    # not in the catalogue before
    ("08-shards", "the objective made of the all-reduced (detached) sum", ("return loss_sum * world_size / batch_real",
                                                                          "return totals[0] * world_size / batch_real"),
     "the objective carries no gradient"),
    ("08-shards", "returns this worker's own mean as the batch's loss", ("totals[0] / batch_real",
                                                                        "loss_sum.detach() / n_real.clamp(min=1)"),
     "the batch's loss you return is this worker's own mean"),
    ("08-shards", "the batch's loss from this worker's sum alone",  # no diagnosis: where it differs
     ("totals[0] / batch_real", "loss_sum.detach() / batch_real"),
     "the batch's loss on worker 0 (of 4, slices of [2, 2, 1, 1] windows): 1 of 1 entries differ"),
]
