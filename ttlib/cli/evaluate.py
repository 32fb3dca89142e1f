"""`ttlib evaluate`: an agent of ttlib.agents.registry -- a checkpoint's (Trajectory GPT, Decision Transformer,
baseline policy) or a baseline trained now (--model bc, iql: ttlib.cli.baselines) -- played in its dataset's
environment by rollout.play, or (the planner) over Ray workers, with what its options ask for."""

from __future__ import annotations

import json

from ttlib.cli.baselines import BASELINES, POLICY_NAMES, add_baseline_options, check_evaluate_args, policy_options
from ttlib.cli.options import add_config_options, given, given_options
from ttlib.cli.train import which_arg
from ttlib.errors import ConfigError

__all__ = ["PLANNER_NAMES", "add_evaluate"]


def _env_for(args, info: dict) -> tuple[str, dict]:
    """The environment to evaluate in: the one the dataset names (its kwargs and time limit included), or --env.
    A checkpoint that knows its dataset's action bounds is refused in an environment with other bounds."""
    import gymnasium as gym

    from ttlib.evaluation.rollout import check_action_space, make_env

    env_id = args.env or info.get("env_id")
    env_kwargs = dict(info.get("env_kwargs") or {}) if env_id == info.get("env_id") else {}
    if env_id is None:
        raise ConfigError(f"dataset {info.get('id')} names no environment to evaluate in; pass a gymnasium id "
                          "with --env ENV_ID")
    env = make_env(env_id, env_kwargs)
    try:
        if info.get("action_low") is not None and isinstance(env.action_space, gym.spaces.Box):
            check_action_space(env.action_space, info["action_low"], info["action_high"], "this checkpoint")
    finally:
        env.close()
    return env_id, env_kwargs


def _check_distributed_args(args):
    """--workers/--central/--address: contradictions and a missing Ray or cluster fail before any loading."""
    if args.workers is None:
        if args.central or args.address:
            raise ConfigError("--central and --address need --workers K (the number of Ray workers)")
        return
    if args.workers < 1:
        raise ConfigError(f"--workers must be >= 1, got {args.workers}")
    if args.sequential or args.video:
        raise ConfigError("--sequential plays in one process and --video records there: leave out --workers")
    from ttlib.evaluation import ray_cluster

    ray_cluster.import_ray()
    if args.address:
        ray_cluster.check_reachable(args.address)


def _agent_of(args) -> str:
    """tt, dt, bc or iql: --model says so, else the checkpoint's kind does (tt without either)."""
    from ttlib.agents import registry

    if args.model is not None or args.checkpoint is None:
        return args.model or "tt"
    return registry.name_of(args.checkpoint)


def _cmd_evaluate(args):
    from ttlib.agents import registry
    from ttlib.evaluation.rollout import check_episodes, play
    from ttlib.planning.beam import PlannerConfig

    check_episodes(range(args.episodes), args.n_envs, args.max_steps)  # before loading anything
    args.model = _agent_of(args)
    check_evaluate_args(args, sorted(given_options(args, [PlannerConfig()], PLANNER_NAMES)))
    if args.model == "dt" and args.workers is not None:
        raise ConfigError("--workers spreads Trajectory Transformer planning over Ray; a Decision Transformer "
                          "acts in milliseconds, so evaluate it in one process (leave out --workers)")
    if args.model == "tt" and args.target_return is not None:
        raise ConfigError("--target-return is for Decision Transformer checkpoints (--model dt)")
    _check_distributed_args(args)
    options = {**vars(args), "progress": not args.json}
    loaded = registry.load(args.model, **{name: options[name] for name in registry.options_of(args.model)},
                           **_config_options(args))
    info = loaded.dataset
    env_id, env_kwargs = _env_for(args, info)
    seeds = list(range(args.seed, args.seed + args.episodes))
    if args.workers is not None:
        result = _evaluate_on_ray(args, loaded.agent, env_id, env_kwargs, seeds)
    else:
        result = play(loaded.agent, env_id, seeds, env_kwargs, vectorized=not args.sequential, n_envs=args.n_envs,
                      max_steps=args.max_steps, record=args.video is not None, progress=not args.json)
    _report(args, loaded, result)


def _config_options(args) -> dict:
    """The fields of the agent's config given on the command line, for its loader: the planner's (PlannerConfig)
    or a baseline's trained now (PolicyConfig)."""
    from ttlib.planning.beam import PlannerConfig

    if args.model == "tt":
        return given(args, PlannerConfig(), PLANNER_NAMES)
    return policy_options(args, args.model, POLICY_NAMES) if args.model in BASELINES else {}


def _evaluate_on_ray(args, agent, env_id, env_kwargs, seeds):
    """The planner's episodes spread over Ray workers (ttlib.evaluation.ray_evaluation)."""
    from ttlib.evaluation.ray_evaluation import evaluate_distributed

    return evaluate_distributed(agent.model, agent.tokenizer, env_id, seeds, agent.planner, workers=args.workers,
                                central=args.central, env_kwargs=env_kwargs, max_steps=args.max_steps,
                                address=args.address, progress=not args.json,
                                critic=agent.critic if agent.planner.value == "critic" else None)


def _report(args, loaded, result) -> None:
    """What `ttlib evaluate` prints: a JSON object (--json), or a few lines."""
    from ttlib.evaluation.rollout import save_video

    info = loaded.dataset
    report = {**loaded.report, **result.return_stats(), "returns": result.returns.tolist(), "steps": result.steps,
              "seconds": result.seconds, "dataset_mean_return": info["mean_return"],
              "expert_mean_return": info.get("mean_return_by_behaviour", {}).get("expert"),
              "clipped_observations": result.clipped_observations}
    if args.workers is not None:
        report.update(workers=result.workers, layout=result.layout, actor_deaths=result.actor_deaths)
    if info.get("ref_min_score") is not None and info.get("ref_max_score") is not None:
        span = info["ref_max_score"] - info["ref_min_score"]
        report["normalized_score"] = (report["mean_return"] - info["ref_min_score"]) / span
    if args.video:
        report["video"] = save_video(result.frames, args.video)
    if args.json:
        print(json.dumps(report))
        return
    print(f"{loaded.title}: {result.summary()}")
    for note in loaded.notes:
        print(note)
    expert = report["expert_mean_return"]
    print(f"dataset {info.get('id')}: mean return {info['mean_return']:.1f}"
          + (f", scripted expert {expert:.1f}" if expert is not None else "")
          + (f"; normalized score {report['normalized_score']:.2f}" if "normalized_score" in report else ""))
    if args.video:
        print(f"video of the first episode: {args.video}")


def add_evaluate(sub) -> None:
    from ttlib.agents.registry import AGENTS

    p = sub.add_parser("evaluate", help="plan with a checkpoint in its environment")
    p.add_argument("--checkpoint", help="default: the one shipped for --dataset")
    p.add_argument("--dataset", default=None, help="tt, dt: play the checkpoint shipped for this dataset (with "
                   "--checkpoint: check that it was trained on it); bc, iql: learn from it now (default: the course "
                   "dataset)")
    p.add_argument("--episodes", type=int, default=10)
    p.add_argument("--seed", type=int, default=0, help="seed of the first episode (then +1, +2, ...)")
    p.add_argument("--sequential", action="store_true", help="one episode at a time instead of vectorized")
    p.add_argument("--env", default=None, help="gymnasium id to evaluate in (default: the dataset's own "
                   "environment, with its kwargs and time limit)")
    p.add_argument("--n-envs", type=int, default=None, help="environments per batch (default: all)")
    p.add_argument("--max-steps", type=int, default=None, help="cut episodes after this many steps")
    p.add_argument("--workers", type=int, default=None, help="spread the episodes over K Ray workers (needs ray)")
    p.add_argument("--central", action="store_true", help="with --workers: one planner actor batches all "
                   "environments (SEED RL) instead of a model per worker")
    p.add_argument("--address", help="with --workers: an existing Ray cluster (default $RAY_ADDRESS, else a new "
                   "local one)")
    _planner_args(p)
    p.add_argument("--device", default="auto")
    which_arg(p, "the checkpoint's model to play")
    p.add_argument("--video", help="save the first episode as a GIF/MP4 here")
    p.add_argument("--json", action="store_true")
    p.add_argument("--model", choices=list(AGENTS), default=None, help="the agent: " + ", ".join(
        f"{name} ({entry.about})" for name, entry in AGENTS.items()).replace("%", "%%")
        + " (default: the checkpoint's kind; tt if none)")
    p.add_argument("--target-return", type=float, default=None, help="dt only: the return to ask for "
                   "(default: the dataset's expert reference score)")
    add_baseline_options(p, evaluate=True)
    p.set_defaults(func=_cmd_evaluate)


PLANNER_NAMES = {"sample_expand": ("--sample-expand", "--expand"), "top_k_action": ("--top-k-action", "--top-k"),
                 "top_p_action": ("--top-p-action", "--top-p")}  # the old spellings stay (docs/RESULTS.md)


def _planner_args(p):
    from ttlib.planning.beam import course_planner, critic_planner, imitation_planner

    presets = {"--value critic": critic_planner(), "--value likelihood": imitation_planner(),
               "--value token": course_planner()}
    group = p.add_argument_group("the planner (--model tt)")
    add_config_options(group, presets, names=PLANNER_NAMES, notes={
        "value": "default: critic when the checkpoint has one, likelihood for a model trained with --top-percent, "
                 "else token; each is a preset of the other options",
        "top_k_action": "0: all bins;"})
