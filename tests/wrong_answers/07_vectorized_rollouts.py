"""Wrong answers to notebook 07's exercises (see tests/test_exercises.py for the format)."""

REFUSED = "refuses to run"  # what a delegating answer's failure says (ttlib.checks.forbidding)

ANSWERS = [
    # exercise 1: a transition's tokens, the batched prefix
    ("07-contexts", "the value token keeps the bin of value 0.0 instead of bin 0",
     ("    bins[tok.value_dim] = 0  # never attended to: any bin would do, 0 is the convention\n", "")),
    ("07-contexts", "the last context transitions, one too many", ("min(len(past), context - 1)",
                                                                   "min(len(past), context)")),
    ("07-contexts", "h[-(context - 1):] keeps the whole history when context is 1",
     ("past[len(past) - min(len(past), context - 1):]", "past[-(context - 1):]")),
    ("07-contexts", "the observation before the history", ("np.concatenate([*recent, obs])",
                                                            "np.concatenate([obs, *recent])")),
    ("07-contexts", "delegates to rollout.Contexts", '''def encode_transition(tok, obs, action, reward):
    contexts = rollout.Contexts(tok, 1, 1)
    contexts.append(0, obs, action, reward)
    return contexts.history[0][-1]


def build_prefix(history, obs_bins, context):
    contexts = rollout.Contexts(tok, len(history), context)
    contexts.history = [list(h) for h in history]
    return contexts.prefix(range(len(history)), tok.decode(obs_bins, slice(0, tok.obs_dim)))
''', REFUSED),
    ("07-contexts", "unsolved, with the checking helpers rebound to do nothing", '''import ttlib.checks

for name in ["check_close", "check_equal_arrays", "check_shape", "check_function", "call"]:
    setattr(ttlib.checks, name, lambda *args, **kwargs: None)


def encode_transition(tok, obs, action, reward):
    raise NotImplementedError()


def build_prefix(history, obs_bins, context):
    raise NotImplementedError()
'''),
    # exercise 2: one planning call
    ("07-plan-actions", "random keys from the place in the batch, not the episode's seed",
     ("rollout.step_key(s, t) for s, t in zip(seeds, steps, strict=True)",
      "rollout.step_key(i, t) for i, t in enumerate(steps)")),
    ("07-plan-actions", "seed and step swapped in the key", ("rollout.step_key(s, t)", "rollout.step_key(t, s)")),
    ("07-plan-actions", "the last action of the plan, not the first", ("plan.actions[:, 0].numpy()",
                                                                       "plan.actions[:, -1].numpy()")),
    ("07-plan-actions", "the history left out of the prefix",
     ("build_prefix([history[i] for i in group], obs_bins[group], planner.context)",
      "build_prefix([[] for i in group], obs_bins[group], planner.context)")),
    ("07-plan-actions", "one call for prefixes of different lengths",
     '''def plan_actions(model, tok, planner, history, observations, seeds, steps, buffers=None):
    obs_bins = tok.encode(observations, slice(0, tok.obs_dim), on_clip="ignore")
    prefix = build_prefix(history, obs_bins, planner.context)
    keys = torch.tensor([rollout.step_key(s, t) for s, t in zip(seeds, steps, strict=True)], dtype=torch.int64)
    plan = planning.beam_plan(model, tok, prefix.to(model.pos_emb.device), keys, planner, buffers)
    return plan.actions[:, 0].numpy()
'''),
    ("07-plan-actions", "one beam_plan call per environment",
     '''def plan_actions(model, tok, planner, history, observations, seeds, steps, buffers=None):
    actions = []
    for past, obs, seed, step in zip(history, observations, seeds, steps, strict=True):
        obs_bins = tok.encode(obs[None], slice(0, tok.obs_dim), on_clip="ignore")
        keys = torch.tensor([rollout.step_key(seed, step)], dtype=torch.int64)
        plan = planning.beam_plan(model, tok, build_prefix([past], obs_bins, planner.context), keys, planner)
        actions.append(plan.actions[0, 0].numpy())
    return np.stack(actions)
''', "one beam_plan call"),
    ("07-plan-actions", "delegates the prefix to rollout.Contexts",
     '''def plan_actions(model, tok, planner, history, observations, seeds, steps, buffers=None):
    contexts = rollout.Contexts(tok, len(history), planner.context)
    contexts.history = [list(h) for h in history]
    keys = torch.tensor([rollout.step_key(s, t) for s, t in zip(seeds, steps, strict=True)], dtype=torch.int64)
    sizes = np.array([min(len(h), planner.context - 1) for h in history])
    actions = np.zeros((len(history), tok.act_dim), dtype=np.float32)
    for size in np.unique(sizes):
        group = np.flatnonzero(sizes == size)
        prefix = contexts.prefix(group, observations[group])
        actions[group] = planning.beam_plan(model, tok, prefix, keys[group], planner).actions[:, 0].numpy()
    return actions
''', REFUSED),
    # exercise 3: the loop
    ("07-vector-rollout", "the autoreset step counted as a real transition",
     ("np.flatnonzero(~autoreset & (episode < n_scheduled))", "np.flatnonzero(episode < n_scheduled)"),
     "episode lengths"),
    ("07-vector-rollout", "the return not reset for the new episode",
     ("ep_return[e], ep_length[e], history[e] = 0.0, 0, []", "ep_length[e], history[e] = 0, []"), "returns"),
    ("07-vector-rollout", "the context not cleared for the new episode",
     ("ep_return[e], ep_length[e], history[e] = 0.0, 0, []", "ep_return[e], ep_length[e] = 0.0, 0")),
    ("07-vector-rollout", "random keys from the environment's index, not the episode's seed",
     ("seeds = [schedule[e][episode[e]] for e in active]", "seeds = list(active)")),
    ("07-vector-rollout", "the progress bar moved per finished episode, not per step",
     ("bar.update(len(active))", "bar.update(int((terminated | truncated)[active].sum()))"), "progress bar"),
    ("07-vector-rollout", "delegates to rollout.evaluate",
     '''def vector_rollout(model, tok, envs, schedule, planner, bar=None):
    seeds = [seed for seeds in schedule for seed in seeds]
    result = rollout.evaluate(model, tok, info["env_id"], seeds, planner, env_kwargs=info["env_kwargs"],
                              max_steps=envs.envs[0].spec.max_episode_steps, progress=False)
    if bar is not None:
        bar.update(int(result.lengths.sum()))
    return dict(zip(seeds, result.returns.tolist())), dict(zip(seeds, result.lengths.tolist()))
''', REFUSED),
]
