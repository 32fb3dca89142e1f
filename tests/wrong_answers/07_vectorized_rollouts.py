"""Wrong answers to notebook 07's exercises (see tests/test_exercises.py for the format)."""

import json
from pathlib import Path

REFUSED = "refuses to run"  # what a delegating answer's failure says (ttlib.exercises.refuse)


def solution(grade_id: str) -> str:
    """The notebook's solution cell, for answers that change it in more than one place."""
    cells = json.loads((Path(__file__).parents[2] / "notebooks" / "07_vectorized_rollouts.ipynb").read_text())["cells"]
    (cell,) = [c for c in cells if c["metadata"].get("nbgrader", {}).get("grade_id") == grade_id]
    return "".join(cell["source"])


ANSWERS = [
    # exercise 1: a transition's tokens, the batched prefix
    ("07-contexts", "the value token keeps the bin of value 0.0 instead of bin 0",
     ("    bins[tok.value_dim] = 0  # never attended to: any bin would do, 0 is the convention\n", ""),
     "the value token keeps the bin"),
    ("07-contexts", "the last context transitions, one too many", ("min(len(past), context - 1)",
                                                                   "min(len(past), context)"), "one too many"),
    ("07-contexts", "h[-(context - 1):] keeps the whole history when context is 1",
     ("past[len(past) - min(len(past), context - 1):]", "past[-(context - 1):]"), "with context 1"),
    ("07-contexts", "the observation before the history", ("np.concatenate([*recent, obs])",
                                                            "np.concatenate([obs, *recent])"),
     "the observation comes before the history"),
    ("07-contexts", "delegates to rollout.Contexts", '''def encode_transition(tok, obs, action, reward):
    contexts = rollout.Contexts(tok, 1, 1)
    contexts.append(0, obs, action, reward)
    return contexts.history[0][-1]


def build_prefix(history, obs_bins, context):
    contexts = rollout.Contexts(tok, len(history), context)
    contexts.history = [list(h) for h in history]
    return contexts.prefix(range(len(history)), tok.decode(obs_bins, slice(0, tok.obs_dim)))
''', REFUSED),
    # new: the history newest first
    ("07-contexts", "the history in reverse order", ("np.concatenate([*recent, obs])",
                                                      "np.concatenate([*recent[::-1], obs])"),
     "the history is in reverse order"),
    # new: the first transitions of the history, not the last
    ("07-contexts", "the first context - 1 transitions", ("past[len(past) - min(len(past), context - 1):]",
                                                           "past[:min(len(past), context - 1)]"),
     "the *first* transitions of the history"),
    # new, no diagnosis: a numpy array instead of a long tensor -- the message says where it first differs
    ("07-contexts", "the prefix as a numpy array", ("return torch.as_tensor(np.stack(rows), dtype=torch.long)",
                                                    "return np.stack(rows)"), "its type and dtype: expected Tensor"),
    ("07-contexts", "unsolved, with the checking helpers rebound to do nothing", '''import ttlib.course.checks

for name in ["check_close", "check_equal_arrays", "check_shape", "call"]:
    setattr(ttlib.course.checks, name, lambda *args, **kwargs: None)


def encode_transition(tok, obs, action, reward):
    raise NotImplementedError()


def build_prefix(history, obs_bins, context):
    raise NotImplementedError()
''', "not implemented yet"),
    # exercise 2: one planning call
    ("07-plan-actions", "random keys from the place in the batch, not the episode's seed",
     ("rollout.step_key(s, t) for s, t in zip(seeds, steps, strict=True)",
      "rollout.step_key(i, t) for i, t in enumerate(steps)"), "places in the batch"),
    ("07-plan-actions", "seed and step swapped in the key", ("rollout.step_key(s, t)", "rollout.step_key(t, s)"),
     "seed and step are swapped"),
    ("07-plan-actions", "the last action of the plan, not the first", ("plan.actions[:, 0].numpy()",
                                                                       "plan.actions[:, -1].numpy()"),
     "the *last* action of every plan"),
    ("07-plan-actions", "the history left out of the prefix",
     ("build_prefix([history[i] for i in group], obs_bins[group], planner.context)",
      "build_prefix([[] for i in group], obs_bins[group], planner.context)"), "the history is left out"),
    ("07-plan-actions", "one call for prefixes of different lengths",
     '''def plan_actions(model, tok, planner, history, observations, seeds, steps, buffers=None):
    obs_bins = tok.encode(observations, slice(0, tok.obs_dim), on_clip="ignore")
    prefix = build_prefix(history, obs_bins, planner.context)
    keys = torch.tensor([rollout.step_key(s, t) for s, t in zip(seeds, steps, strict=True)], dtype=torch.int64)
    plan = planning.beam_plan(model, tok, prefix.to(model.pos_emb.device), keys, planner, buffers)
    return plan.actions[:, 0].numpy()
''', "prefixes of different lengths go into one call"),
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
     "an autoreset step is counted as a transition"),
    ("07-vector-rollout", "the return not reset for the new episode",
     ("ep_return[e], ep_length[e], history[e] = 0.0, 0, []", "ep_length[e], history[e] = 0, []"),
     "the return is not reset"),
    ("07-vector-rollout", "the context not cleared for the new episode",
     ("ep_return[e], ep_length[e], history[e] = 0.0, 0, []", "ep_return[e], ep_length[e] = 0.0, 0"),
     "the history is not cleared"),
    ("07-vector-rollout", "random keys from the environment's index, not the episode's seed",
     ("seeds = [schedule[e][episode[e]] for e in active]", "seeds = list(active)"), "the environment's index"),
    ("07-vector-rollout", "the progress bar moved per finished episode, not per step",
     ("bar.update(len(active))", "bar.update(int((terminated | truncated)[active].sum()))"),
     "the progress bar moves per finished episode"),
    ("07-vector-rollout", "delegates to rollout.evaluate",
     '''def vector_rollout(model, tok, envs, schedule, planner, bar=None):
    seeds = [seed for seeds in schedule for seed in seeds]
    spec = envs.envs[0].spec
    result = rollout.evaluate(model, tok, spec.id, seeds, planner, max_steps=spec.max_episode_steps, progress=False)
    if bar is not None:
        bar.update(int(result.lengths.sum()))
    return dict(zip(seeds, result.returns.tolist())), dict(zip(seeds, result.lengths.tolist()))
''', REFUSED),
    # new: the key's step counted from the start of the loop, not of the episode
    ("07-vector-rollout", "the key's step is the loop's step count",
     solution("07-vector-rollout").replace("    while (episode < n_scheduled).any():\n",
                                           "    t = -1\n    while (episode < n_scheduled).any():\n        t += 1\n")
     .replace("ep_length[active], buffers)", "np.full(len(active), t), buffers)"), "the loop's step count"),
    # new: stops when the first environment is done
    ("07-vector-rollout", "stops when one environment has played its schedule",
     ("while (episode < n_scheduled).any():", "while (episode < n_scheduled).all():"),
     "stops as soon as one environment has played its schedule"),
    # new, no diagnosis: the observations never move on -- the message names the step where it first differs
    ("07-vector-rollout", "the next observation never taken", ("        obs = next_obs\n", ""),
     "the actions sent to the environments that play"),
]

# exercise 3's first stage (3a, one episode per environment) names the mistakes that show without a second episode
# -- the same answers as 3b's above; those of the autoreset and the fresh start pass it (3b names them)
SINGLE = ["random keys from the environment's index, not the episode's seed",
          "stops when one environment has played its schedule",
          "the progress bar moved per finished episode, not per step"]
ANSWERS += [("07-vector-rollout-single", why, answer, says) for grade_id, why, answer, says in ANSWERS
            if grade_id == "07-vector-rollout" and why in SINGLE]
