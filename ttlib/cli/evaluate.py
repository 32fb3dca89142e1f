"""`ttlib evaluate`: a checkpoint (Trajectory GPT or Decision Transformer) played in its dataset's environment,
in one process or over Ray workers, with the planner its options ask for; or a baseline (--model bc, iql:
ttlib.cli.baselines)."""

from __future__ import annotations

import dataclasses
import json

from ttlib.cli.baselines import add_baseline_options
from ttlib.cli.train import which_arg


def _weights_words(info: dict) -> str:
    """"the best model, step 500" -- which of a checkpoint's models was loaded
    (ttlib.training.checkpoints.weights_info)."""
    step = f", step {info['step']}" if info.get("step") is not None else ""
    return f"the {info['which']} model{step}"


def _cmd_evaluate_dt(args):
    from ttlib.agents import dt
    from ttlib.training.checkpoints import weights_info

    if args.checkpoint is None:
        args.checkpoint = dt.default_checkpoint(dt.COURSE_CHECKPOINT)
    model, payload = dt.load_checkpoint(args.checkpoint, device=args.device, which=args.which)
    info = payload["dataset"]
    env_id, env_kwargs = _env_for(args, info)
    target = args.target_return if args.target_return is not None else dt.default_target(info)
    seeds = list(range(args.seed, args.seed + args.episodes))
    result = dt.evaluate(model, env_id, seeds, target, env_kwargs=env_kwargs,
                         vectorized=not args.sequential, n_envs=args.n_envs, max_steps=args.max_steps,
                         record=args.video is not None)
    report = {"model": "dt", "target_return": target, **result.return_stats(),
              "returns": result.returns.tolist(), "steps": result.steps, "seconds": result.seconds,
              "dataset_mean_return": info["mean_return"],
              "expert_mean_return": info.get("mean_return_by_behaviour", {}).get("expert"),
              "weights": weights_info(payload, args.which)}
    if args.video:
        from ttlib.evaluation.rollout import save_video

        report["video"] = save_video(result.frames, args.video)
    if args.json:
        print(json.dumps(report))
        return
    print(f"Decision Transformer ({_weights_words(report['weights'])}), target return {target:.1f}: "
          f"{result.summary()}")
    print(f"dataset mean return {info['mean_return']:.1f}, scripted expert {report['expert_mean_return']}")


def _agent_of(args) -> str:
    """tt, dt, bc or iql: --model says so, else the checkpoint's kind does (tt without either)."""
    from ttlib.training.checkpoints import read_checkpoint

    if args.model is not None or args.checkpoint is None:
        return args.model or "tt"
    payload = read_checkpoint(args.checkpoint, kind=None)
    if payload.get("kind") == "policy":
        return payload["policy_config"]["kind"]
    return "dt" if payload.get("kind") == "decision-transformer" else "tt"


def _env_for(args, info: dict) -> tuple[str, dict]:
    """The environment to evaluate in: the one the dataset names (its kwargs and time limit included), or --env.
    A checkpoint that knows its dataset's action bounds is refused in an environment with other bounds."""
    import gymnasium as gym

    from ttlib.evaluation.rollout import check_action_space, make_env

    env_id = args.env or info.get("env_id")
    env_kwargs = dict(info.get("env_kwargs") or {}) if env_id == info.get("env_id") else {}
    if env_id is None:
        raise ValueError(f"dataset {info.get('id')} names no environment to evaluate in; pass a gymnasium id "
                         "with --env ENV_ID")
    env = make_env(env_id, env_kwargs)
    try:
        if info.get("action_low") is not None and isinstance(env.action_space, gym.spaces.Box):
            check_action_space(env.action_space, info["action_low"], info["action_high"], "this checkpoint")
    finally:
        env.close()
    return env_id, env_kwargs


def _planner_from(args, critic, payload: dict | None = None):
    """The planner the options ask for: `critic_planner()` when scoring with the checkpoint's critic (--value
    critic, the default when it has one), `imitation_planner()` for --value likelihood (the default for a model
    trained on the best episodes only, --top-percent), else `course_planner()`; options given override single
    fields."""
    from ttlib.planning.beam import course_planner, critic_planner, imitation_planner

    imitates = ((payload or {}).get("train_config") or {}).get("top_percent", 100.0) < 100
    value = args.value or ("critic" if critic is not None else "likelihood" if imitates else "token")
    if value == "critic" and critic is None:
        raise ValueError("--value critic: this checkpoint has no critic; add one with `ttlib train-critic "
                         "--checkpoint PATH`, or plan with --value token")
    given = {"beam_width": args.beam_width, "horizon": args.horizon, "sample_expand": args.expand,
             "context": args.context, "top_k_action": args.top_k, "top_p_action": args.top_p, "decoder": args.decoder}
    overrides = {name: value for name, value in given.items() if value is not None}
    if overrides.get("top_k_action") == 0:
        overrides["top_k_action"] = None  # --top-k 0: all bins
    planner = {"critic": critic_planner, "likelihood": imitation_planner, "token": course_planner}[value]
    return planner(**overrides)


def _check_distributed_args(args):
    """--workers/--central/--address: contradictions and a missing Ray or cluster fail before any loading."""
    if args.workers is None:
        if args.central or args.address:
            raise ValueError("--central and --address need --workers K (the number of Ray workers)")
        return
    if args.workers < 1:
        raise ValueError(f"--workers must be >= 1, got {args.workers}")
    if args.sequential or args.video:
        raise ValueError("--sequential plays in one process and --video records there: leave out --workers")
    from ttlib.evaluation import ray_cluster

    ray_cluster.import_ray()
    if args.address:
        ray_cluster.check_reachable(args.address)


def _cmd_evaluate(args):
    from ttlib.agents.critic import load_critic
    from ttlib.evaluation.rollout import check_episodes, evaluate, save_video
    from ttlib.training.checkpoints import default_checkpoint, load_checkpoint, weights_info

    check_episodes(range(args.episodes), args.n_envs, args.max_steps)  # before loading anything
    from ttlib.cli.baselines import BASELINES, check_evaluate_args, cmd_evaluate_policy

    args.model = _agent_of(args)
    check_evaluate_args(args)
    if args.model in BASELINES:
        return cmd_evaluate_policy(args, _env_for)
    if args.model == "dt":
        if args.workers is not None:
            raise ValueError("--workers spreads Trajectory Transformer planning over Ray; a Decision Transformer "
                             "acts in milliseconds, so evaluate it in one process (leave out --workers)")
        return _cmd_evaluate_dt(args)
    if args.target_return is not None:
        raise ValueError("--target-return is for Decision Transformer checkpoints (--model dt)")
    _check_distributed_args(args)
    path = args.checkpoint or default_checkpoint()
    model, tokenizer, payload = load_checkpoint(path, device=args.device, which=args.which)
    critic = load_critic(path, device=args.device, payload=payload)
    planner = _planner_from(args, critic, payload)
    info = payload["dataset"]
    env_id, env_kwargs = _env_for(args, info)
    seeds = list(range(args.seed, args.seed + args.episodes))
    if args.workers is not None:
        from ttlib.evaluation.ray_evaluation import evaluate_distributed

        result = evaluate_distributed(model, tokenizer, env_id, seeds, planner,
                                      workers=args.workers, central=args.central, env_kwargs=env_kwargs,
                                      max_steps=args.max_steps, address=args.address, progress=not args.json,
                                      critic=critic if planner.value == "critic" else None)
    else:
        result = evaluate(model, tokenizer, env_id, seeds, planner,
                          env_kwargs=env_kwargs, vectorized=not args.sequential, n_envs=args.n_envs,
                          max_steps=args.max_steps, record=args.video is not None, critic=critic)
    report = {**result.return_stats(), "returns": result.returns.tolist(), "steps": result.steps,
              "seconds": result.seconds, "dataset_mean_return": info["mean_return"],
              "expert_mean_return": info.get("mean_return_by_behaviour", {}).get("expert"),
              "clipped_observations": result.clipped_observations, "planner": dataclasses.asdict(planner),
              "weights": weights_info(payload, args.which)}
    if args.workers is not None:
        report.update(workers=result.workers, layout=result.layout, actor_deaths=result.actor_deaths)
    if info.get("ref_min_score") is not None and info.get("ref_max_score") is not None:
        span = info["ref_max_score"] - info["ref_min_score"]
        report["normalized_score"] = (report["mean_return"] - info["ref_min_score"]) / span
    if args.video:
        save_video(result.frames, args.video)
        report["video"] = args.video
    if args.json:
        print(json.dumps(report))
        return
    print(f"{_weights_words(report['weights'])}: {result.summary()}")
    if planner.value == "token" and critic is None:
        print("planned with the value token: this checkpoint has no critic (`ttlib train-critic` adds one)")
    print(f"dataset mean return {info['mean_return']:.1f}", end="")
    if report["expert_mean_return"] is not None:
        print(f", scripted expert {report['expert_mean_return']:.1f}", end="")
    print(f"; normalized score {report['normalized_score']:.2f}" if "normalized_score" in report else "")
    if args.video:
        print(f"video of the first episode: {args.video}")


def add_evaluate(sub) -> None:
    p = sub.add_parser("evaluate", help="plan with a checkpoint in its environment")
    p.add_argument("--checkpoint", help="default: the shipped course checkpoint")
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
    p.add_argument("--model", choices=["tt", "dt", "bc", "iql"], default=None, help="the agent: the Trajectory "
                   "Transformer, the Decision Transformer, behaviour cloning (with --top-percent: %%BC) or IQL's "
                   "policy (default: the checkpoint's kind; tt if none)")
    p.add_argument("--target-return", type=float, default=None, help="dt only: the return to ask for "
                   "(default: the dataset's expert reference score)")
    add_baseline_options(p, evaluate=True)
    p.set_defaults(func=_cmd_evaluate)


def _planner_args(p):
    from ttlib.planning.beam import VALUES, course_planner, critic_planner
    from ttlib.planning.decoders import DECODERS

    t, c = course_planner(), critic_planner()

    def default(name: str) -> str:
        return f"default {getattr(c, name)} with the critic, {getattr(t, name)} with the value token"

    p.add_argument("--value", choices=list(VALUES), default=None, help="what scores plans: the checkpoint's Q "
                   "critic (the default when it has one), the model's value token, or the likelihood of the plan's "
                   "actions (imitation: the default for a model trained with --top-percent)")
    p.add_argument("--beam-width", type=int, default=None, help=default("beam_width"))
    p.add_argument("--horizon", type=int, default=None, help=default("horizon"))
    p.add_argument("--expand", type=int, default=None, help=default("sample_expand"))
    p.add_argument("--context", type=int, default=None, help=default("context"))
    p.add_argument("--top-k", type=int, default=None, help=default("top_k_action") + "; 0: all bins")
    p.add_argument("--top-p", type=float, default=None, help="nucleus for actions (default: all bins)")
    p.add_argument("--decoder", choices=list(DECODERS), default=None, help="where the planner's logits come from "
                   "(the plan is the same): auto (default) takes the fastest measured on the device")
