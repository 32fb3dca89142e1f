"""The `ttlib` command line: python -m ttlib <command> (or just `ttlib <command>`).

    ttlib make-dataset [--dataset ID] [--force]     build the offline course dataset (or the HalfCheetah one)
    ttlib datasets                                  list the Minari datasets on this machine
    ttlib train --out runs/tt.pt [--export assets/tt_lunarlander.pt]
    ttlib train --model dt --out runs/dt.pt [--export assets/dt_lunarlander.pt]
    ttlib evaluate [--checkpoint PATH] --episodes 10 [--env ENV_ID] [--workers K [--central] [--address HOST:PORT]]
                   [--which last]               the last step's model, not the best evaluation's
    ttlib evaluate --model dt [--target-return 280] --episodes 10
    ttlib bench {decoding,planning,profile,rollouts,training,distributed} [--json]
    ttlib lab [JUPYTER LAB OPTIONS]                 JupyterLab on the student notebooks, without instructor tools
    ttlib grade release [--check]                   nbgrader student versions of the graded notebooks
    ttlib grade collect ASSIGNMENT FOLDER           a folder of <student>.ipynb into nbgrader's submitted/
    ttlib grade doctor                              what the grading sandbox guarantees on this machine
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from . import data as ttdata


def _cmd_make_dataset(args):
    path = ttdata.build(args.dataset, seed=args.seed, n_episodes=args.episodes, force=args.force)
    print(f"dataset {args.dataset} ready at {path}")
    print(ttdata.load(args.dataset, progress=False).summary())


def _cmd_datasets(args):
    rows = ttdata.list_local()
    if not rows:
        print(f"no local datasets yet; `ttlib make-dataset` builds {ttdata.DEFAULT_DATASET}")
    for r in rows:
        print(f"{r['id']:40s} {r['episodes']:6d} episodes {r['steps']:8d} steps  {r['env_id']}  {r['path']}")
    for r in ttdata.list_broken():
        print(f"{r['id']:40s} BROKEN: {r['error']}")
    built = {r["id"] for r in rows}
    for dataset_id in ttdata.buildable():
        if dataset_id not in built:
            print(f"{dataset_id:40s} (not built yet: ttlib make-dataset --dataset {dataset_id})")


def _cmd_lab(args):
    from .tools import lab

    try:
        code = lab.main(args.jupyter_options)
    except FileNotFoundError as error:
        raise ValueError(str(error)) from None
    if code:
        raise SystemExit(code)


def _cmd_train(args):
    from .train import TrainConfig, train

    if args.model == "dt":
        return _cmd_train_dt(args)
    if any(getattr(args, n) is not None for n in ("context", "rtg_scale", "max_timestep")):
        raise ValueError("--context, --rtg-scale and --max-timestep are Decision Transformer options (--model dt)")
    overrides = _given_settings(args, TrainConfig)
    config = TrainConfig.from_settings({**_resumed_config(args, TrainConfig, "trajectory-gpt"), **overrides})
    result = train(config, out=args.out, resume=args.resume)
    last = result.history[-1]
    _trained(args, result, f"train loss {last['train_loss']:.3f}, validation loss {last['val_loss']:.3f} at the last "
             f"step, {result.tokens_per_second:,.0f} tokens/s", result.config)


def _trained(args, result, losses: str, config) -> None:
    """Say how training went (how far, the last losses, the model kept, overfitting), and write the slim copy
    --export asks for."""
    from .train import best_line, export_checkpoint, overfitting

    history = result.history
    ran = history[-1]["step"] + 1
    how_far = f"{ran} of {config.steps} steps (stopped early: --early-stop {config.early_stop})" \
        if ran < config.steps else f"{ran} steps"
    print(f"trained {how_far}: {losses}; checkpoint {args.out}")
    if args.export:
        export_checkpoint(args.out, args.export, which=args.which)
        print(f"slim copy for shipping ({args.which} model): {args.export}")
    warning = overfitting(history)
    print(best_line(result.best, history) + (f". {warning[0].upper()}{warning[1:]}" if warning else ""))


def _resumed_config(args, config_class, kind: str) -> dict:
    """--resume continues the checkpoint's run: its own settings are the defaults (a flag that differs from them
    is refused by the training's check_resume, naming it), so no flag has to be repeated."""
    if args.resume is None:
        return {}
    from .train import read_checkpoint

    saved = read_checkpoint(args.resume, kind=kind).get("train_config")
    return config_class.from_settings(saved).settings() if saved else {}


def _given_settings(args, config_class) -> dict:
    """The settings of `config_class` given on the command line (an option left out is None)."""
    names = config_class().settings()
    return {n: getattr(args, n) for n in names if getattr(args, n, None) is not None}


def _cmd_train_dt(args):
    from . import dt
    from .train import TrainConfig

    given = set(_given_settings(args, TrainConfig)) - set(dt.DTTrainConfig().settings())
    if given:
        options = ", ".join(sorted("--" + n.replace("_", "-") for n in given))
        raise ValueError(f"--model dt has no option {options} (those are the Trajectory GPT's)")
    overrides = _given_settings(args, dt.DTTrainConfig)
    config = dt.DTTrainConfig.from_settings({**_resumed_config(args, dt.DTTrainConfig, dt.KIND), **overrides})
    result = dt.train(config, out=args.out, resume=args.resume)
    last = result.history[-1]
    _trained(args, result, f"a Decision Transformer in {result.seconds:.0f} s, train loss "
             f"{last['train_loss']:.4f}, validation loss {last['val_loss']:.4f} at the last step", config)


def _weights_words(info: dict) -> str:
    """"the best model, step 500" -- which of a checkpoint's models was loaded (ttlib.train.weights_info)."""
    step = f", step {info['step']}" if info.get("step") is not None else ""
    return f"the {info['which']} model{step}"


def _cmd_evaluate_dt(args):
    from . import dt
    from .train import weights_info

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
        from .rollout import save_video

        report["video"] = save_video(result.frames, args.video)
    if args.json:
        print(json.dumps(report))
        return
    print(f"Decision Transformer ({_weights_words(report['weights'])}), target return {target:.1f}: "
          f"{result.summary()}")
    print(f"dataset mean return {info['mean_return']:.1f}, scripted expert {report['expert_mean_return']}")


def _is_dt(args) -> bool:
    """Evaluate a Decision Transformer? --model says so, else the checkpoint's kind does."""
    from .train import read_checkpoint

    if args.model is not None:
        return args.model == "dt"
    return args.checkpoint is not None and read_checkpoint(args.checkpoint, kind=None).get("kind") == \
        "decision-transformer"


def _env_for(args, info: dict) -> tuple[str, dict]:
    """The environment to evaluate in: the one the dataset names (its kwargs and time limit included), or --env.
    A checkpoint that knows its dataset's action bounds is refused in an environment with other bounds."""
    import gymnasium as gym

    from .rollout import check_action_space, make_env

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


def _planner_from(args, critic):
    """The planner the options ask for: `critic_planner()` when scoring with the checkpoint's critic (--value
    critic, the default when it has one), else `course_planner()`; options given override single fields."""
    from .planning import course_planner, critic_planner

    value = args.value or ("critic" if critic is not None else "token")
    if value == "critic" and critic is None:
        raise ValueError("--value critic: this checkpoint has no critic; add one with `ttlib train-critic "
                         "--checkpoint PATH`, or plan with --value token")
    given = {"beam_width": args.beam_width, "horizon": args.horizon, "sample_expand": args.expand,
             "context": args.context, "top_k_action": args.top_k, "top_p_action": args.top_p}
    overrides = {name: value for name, value in given.items() if value is not None}
    if overrides.get("top_k_action") == 0:
        overrides["top_k_action"] = None  # --top-k 0: all bins
    return (critic_planner if value == "critic" else course_planner)(**overrides)


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
    from . import ray_cluster

    ray_cluster.import_ray()
    if args.address:
        ray_cluster.check_reachable(args.address)


def _cmd_evaluate(args):
    from .rollout import check_episodes, evaluate, save_video
    from .train import default_checkpoint, load_checkpoint, load_critic, weights_info

    check_episodes(range(args.episodes), args.n_envs, args.max_steps)  # before loading anything
    if _is_dt(args):
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
    planner = _planner_from(args, critic)
    info = payload["dataset"]
    env_id, env_kwargs = _env_for(args, info)
    seeds = list(range(args.seed, args.seed + args.episodes))
    if args.workers is not None:
        from .distributed import evaluate_distributed

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


def _cmd_bench(args):
    from . import bench

    repeats = {} if args.repeats is None else {"repeats": args.repeats}  # else each benchmark's own default
    if args.which == "decoding":
        out = bench.bench_decoding(args.preset, batch=args.batch, device=args.device, **repeats)
    elif args.which == "planning":
        out = bench.bench_planning(args.preset, batch=args.batch, uncached_repeats=args.uncached_repeats,
                                   device=args.device, dtype=args.dtype, faster_tt=args.faster_tt,
                                   faster_tt_repeats=args.faster_tt_repeats, **repeats)
    elif args.which == "profile":
        out = bench.profile_planning(args.preset, batch=args.batch, device=args.device)
    elif args.which == "rollouts":
        out = bench.bench_rollouts(episodes=args.episodes, max_steps=args.max_steps, **repeats)
    elif args.which == "distributed":
        out = bench.bench_distributed(workers=tuple(args.workers), episodes=args.episodes, max_steps=args.max_steps)
    else:
        out = bench.bench_training(args.preset if args.preset != "halfcheetah" else "lunarlander",
                                   device=args.device)
    if args.json:
        print(json.dumps(out))
        return
    for k, v in out.items():
        if isinstance(v, dict) and "median" in v:  # repeated measurements: median (range)
            v = f"{v['median']:.3g} ({v['min']:.3g}-{v['max']:.3g}, {v['n']} runs)"
        print(f"{k:24s} {v:.4g}" if isinstance(v, float) else f"{k:24s} {v}")
    if args.which == "planning":
        print(f"\none plan takes {out['plan_over_floor']['median']:.2f}x the float32 FLOP floor of this machine "
              f"({out['gflop_per_plan']:.2f} GFLOP at {out['matmul_gflops']:.0f} GFLOP/s = {out['floor_ms']:.0f} ms): "
              f"{out['share_of_matmul_rate']['median']:.0%} of its matmul rate")
        print(f"its matrix products alone, at their own sizes and with nothing between them, take "
              f"{out['products_alone_over_floor']['median']:.2f}x the floor; the plan takes "
              f"{out['plan_over_products_alone']['median']:.2f}x them (the rest: Python, softmax, GELU, copies)")
        if "speedup_vs_faster_tt" in out:
            print(f"{out['speedup_vs_faster_tt']['median']:.1f}x faster than faster-TT's batch_beam_plan, side by side")


def _cmd_grade(args):
    if args.action == "doctor":
        from .tools import sandbox

        print(sandbox.capabilities().report())
        return
    try:
        from .tools import grade
    except ImportError as e:
        raise ValueError(f'needs nbgrader ({e}): python -m pip install -e ".[dev]"') from e

    course = grade.open_course()
    if args.action == "release":
        report = grade.release(course, check=args.check)
        for name in report.unchanged:
            print(f"notebooks/student/{name}: up to date")
        for name in report.written:
            print(f"notebooks/student/{name}: {'OUT OF DATE' if args.check else 'written'}")
        for name in report.stale:
            print(f"notebooks/student/{name}: {'' if args.check else 'removed, '}it has no solution notebook")
        print(f"nbgrader course folder: {course.root} (source/, release/, gradebook.db)")
        if args.check and (report.written or report.stale):
            raise grade.GradingError("student versions out of date: run `ttlib grade release` and commit "
                                     "notebooks/student/")
    else:
        report = grade.collect(course, args.assignment, args.folder)
        for student, problems in report.items():
            flag = "; ".join(problems) + " (nbgrader restores it before grading)" if problems else "ok"
            print(f"{student:20s} -> {course.submitted(student, args.assignment)}  {flag}")
        print(f"collected {len(report)} submissions; next: nbgrader autograde {args.assignment}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ttlib", description="The Trajectory Transformer course library.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("make-dataset", help="build a local offline dataset (no download)")
    p.add_argument("--dataset", default=ttdata.DEFAULT_DATASET, help=f"one of {ttdata.buildable()}")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--episodes", type=int, default=None, help="episode count (default: the full size)")
    p.add_argument("--force", action="store_true", help="rebuild even if it exists")
    p.set_defaults(func=_cmd_make_dataset)

    p = sub.add_parser("datasets", help="list local datasets")
    p.set_defaults(func=_cmd_datasets)

    p = sub.add_parser("lab", help="open the course in JupyterLab (the student notebooks, no instructor tools)")
    p.set_defaults(func=_cmd_lab, jupyter_options=[])  # every option after `lab` goes to `jupyter lab`

    _add_train(sub)
    _add_train_critic(sub)
    _add_evaluate(sub)
    _add_bench(sub)

    p = sub.add_parser("grade", help="hand out and grade the exercises with nbgrader (run from the repository root)")
    grade_sub = p.add_subparsers(dest="action", required=True)
    g = grade_sub.add_parser("release", help="nbgrader student versions of every graded notebook -> notebooks/student/")
    g.add_argument("--check", action="store_true", help="write nothing to notebooks/student/; fail if out of date")
    g = grade_sub.add_parser("collect", help="a flat folder of <student>.ipynb -> nbgrader's submitted/ folder")
    g.add_argument("assignment", help="the notebook's name without .ipynb, e.g. 01_attention")
    g.add_argument("folder", help="a folder holding one <student>.ipynb per student")
    grade_sub.add_parser("doctor", help="what the grading sandbox guarantees on this machine (Landlock, namespaces)")
    p.set_defaults(func=_cmd_grade)
    return parser


def _add_train(sub) -> None:
    from .train import TrainConfig

    p = sub.add_parser("train", help="train a Trajectory GPT")
    p.add_argument("--out", required=True, help="checkpoint path (written during training too)")
    p.add_argument("--resume", help="continue from this checkpoint")
    p.add_argument("--export", help="also write a slim copy (one model, no optimiser state) here")
    _which_arg(p, "the model --export copies")
    p.add_argument("--model", choices=["tt", "dt"], default="tt", help="Trajectory GPT or Decision Transformer")
    p.add_argument("--context", type=int, default=None, help="dt only: context K in triples (default 20)")
    p.add_argument("--rtg-scale", dest="rtg_scale", type=float, default=None, help="dt only: default 100")
    p.add_argument("--max-timestep", dest="max_timestep", type=int, default=None, help="dt only: default 1000")
    explain = {"early_stop": "stop after this many evaluations in a row more than 1%% above the best validation "
                             "loss (default 0: never)",
               "steps": "default: fitted to the dataset's size (said when training starts); --model dt: 1000",
               "eval_every": "default: fitted to the dataset's size; --model dt: 250"}
    for name, default in TrainConfig().settings().items():  # the model's settings among them (--n-layer, ...)
        fitted = default is None  # left to the data (train.fit_recipe)
        default_is = "default: fitted to the dataset's size" if fitted else f"default {default}"
        p.add_argument(f"--{name.replace('_', '-')}", dest=name, type=int if fitted else type(default), default=None,
                       help=explain.get(name, default_is))
    p.set_defaults(func=_cmd_train)


def _which_arg(p, what: str) -> None:
    p.add_argument("--which", choices=["best", "last"], default="best", help=f"{what}: the best evaluation's "
                   "(default) or the last step's")


def _add_train_critic(sub) -> None:
    from .critic import CriticConfig

    p = sub.add_parser("train-critic", help="add a Q critic (IQL) to a Trajectory GPT checkpoint, for the planner")
    p.add_argument("--checkpoint", required=True, help="Trajectory GPT checkpoint; the critic is written into it")
    p.add_argument("--out", help="write the checkpoint with its critic here instead (default: in place)")
    for name in ("expectile", "steps", "members", "batch_size", "learning_rate", "hidden", "seed", "val_fraction"):
        default = getattr(CriticConfig(), name)
        p.add_argument(f"--{name.replace('_', '-')}", dest=name, type=type(default), default=default,
                       help=f"default {default}")
    p.set_defaults(func=_cmd_train_critic)


def _cmd_train_critic(args):
    import time

    from .critic import CriticConfig
    from .train import add_critic

    config = CriticConfig(expectile=args.expectile, steps=args.steps, members=args.members,  # gamma: the checkpoint's
                          batch_size=args.batch_size, learning_rate=args.learning_rate, hidden=args.hidden,
                          seed=args.seed, val_fraction=args.val_fraction)
    t0 = time.perf_counter()
    _, history = add_critic(args.checkpoint, config, out=args.out)
    last = history[-1]
    print(f"critic trained {config.members} x {config.steps} steps in {time.perf_counter() - t0:.0f} s: V loss "
          f"{last['v_loss']:.2f}, Q loss {last['q_loss']:.2f}; checkpoint {args.out or args.checkpoint}")
    ends = [row for row in history if row["step"] == config.steps - 1 and "val_td_loss" in row]
    if ends:
        held, fitted = (sum(row[key] for row in ends) / len(ends) for key in ("val_td_loss", "train_td_loss"))
        print(f"TD loss on the held-out episodes {held:.2f}, on as many training transitions {fitted:.2f} "
              f"({held / fitted:.1f}x; members' mean at the last step)")
    else:
        print("no validation: the critic learnt from every episode (--val-fraction 0.05 holds some out to measure "
              "a TD loss on)")


def _add_evaluate(sub) -> None:
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
    _which_arg(p, "the checkpoint's model to play")
    p.add_argument("--video", help="save the first episode as a GIF/MP4 here")
    p.add_argument("--json", action="store_true")
    p.add_argument("--model", choices=["tt", "dt"], default=None, help="default: the checkpoint's kind (tt if none)")
    p.add_argument("--target-return", type=float, default=None, help="dt only: the return to ask for "
                   "(default: the dataset's expert reference score)")
    p.set_defaults(func=_cmd_evaluate)


def _add_bench(sub) -> None:
    p = sub.add_parser("bench", help="benchmarks (ratios measured side by side)")
    p.add_argument("which", choices=["decoding", "planning", "profile", "rollouts", "training", "distributed"])
    p.add_argument("--preset", default="halfcheetah", choices=["halfcheetah", "lunarlander", "tiny"])
    p.add_argument("--batch", type=int, default=1, help="environments planned at once")
    p.add_argument("--repeats", type=int, default=None, help="timed runs, median reported (default: 5; "
                   "rollouts: 3)")
    p.add_argument("--uncached-repeats", type=int, default=1)
    p.add_argument("--episodes", type=int, default=25)
    p.add_argument("--max-steps", type=int, default=50)
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4], help="distributed: Ray worker counts")
    p.add_argument("--device", default="cuda" if _cuda() else "cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16", "float64"])
    p.add_argument("--faster-tt", default=None, metavar="DIR", help="planning: also time faster-TT's "
                   "batch_beam_plan, from a checkout of github.com/Howuhh/faster-trajectory-transformer in DIR")
    p.add_argument("--faster-tt-repeats", type=int, default=1, help="planning: faster-TT plans timed (each "
                   "beside one of ours)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=_cmd_bench)


def _planner_args(p):
    from .planning import course_planner, critic_planner

    t, c = course_planner(), critic_planner()

    def default(name: str) -> str:
        return f"default {getattr(c, name)} with the critic, {getattr(t, name)} with the value token"

    p.add_argument("--value", choices=["token", "critic"], default=None, help="what scores plans: the "
                   "checkpoint's Q critic (the default when it has one) or the model's value token")
    p.add_argument("--beam-width", type=int, default=None, help=default("beam_width"))
    p.add_argument("--horizon", type=int, default=None, help=default("horizon"))
    p.add_argument("--expand", type=int, default=None, help=default("sample_expand"))
    p.add_argument("--context", type=int, default=None, help=default("context"))
    p.add_argument("--top-k", type=int, default=None, help=default("top_k_action") + "; 0: all bins")
    p.add_argument("--top-p", type=float, default=None, help="nucleus for actions (default: all bins)")


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def main(argv=None) -> int:
    from .ray_cluster import DistributedError
    from .train import CheckpointError

    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["lab"]:  # `ttlib lab --allow-root ...`: the options are JupyterLab's
        args = build_parser().parse_args(["lab"])
        args.jupyter_options = argv[1:]
    else:
        args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except (ttdata.DatasetError, CheckpointError, ValueError, DistributedError) as e:
        print(f"ttlib {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"ttlib {args.command}: interrupted{_where_to_resume(args)}", file=sys.stderr)
        return 130  # 128 + SIGINT, as a shell reports it
    return 0


def _where_to_resume(args) -> str:
    """After Ctrl-C in `ttlib train`: the last checkpoint (written atomically, so whole) and how to go on."""
    if args.command != "train":
        return ""
    from .train import CheckpointError, read_checkpoint

    try:
        step = read_checkpoint(args.out, kind=None)["step"]
    except CheckpointError:
        return f"; no checkpoint was written to {args.out} yet, so start again"
    model = " --model dt" if args.model == "dt" else ""
    return (f"; the last checkpoint is {args.out} (step {step}); go on with "
            f"`ttlib train{model} --out {args.out} --resume {args.out}`")


if __name__ == "__main__":
    sys.exit(main())
