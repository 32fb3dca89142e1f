"""`--model bc` and `--model iql` of `ttlib train` and `ttlib evaluate`: the baselines (ttlib.agents.baselines).

    ttlib evaluate --model bc --episodes 60                   BC on every episode of the course dataset
    ttlib evaluate --model bc --top-percent 25 --episodes 60  %BC: the best quarter of the episodes
    ttlib evaluate --model iql --episodes 60                  IQL's policy (AWR) on the shipped checkpoint's critic
    ttlib evaluate --model bc --dataset ID ...                on another dataset; --critic CKPT for iql there
    ttlib train --model bc --top-percent 25 --out runs/pbc.safetensors a checkpoint, for `ttlib evaluate --checkpoint`

Without --checkpoint, `evaluate` trains the baseline first (seconds on a CPU) with the seed given by --train-seed,
so the same command gives the same policy on the same machine.
"""

from __future__ import annotations

import json

BASELINES = ("bc", "iql")


def add_baseline_options(p, evaluate: bool) -> None:
    """The options the baselines add to `ttlib train` (evaluate=False) or `ttlib evaluate`."""
    p.add_argument("--critic", default=None, help="iql: a checkpoint holding the critic to extract the policy "
                   "from (`ttlib train-critic`; default: the shipped checkpoint's, for the course dataset)")
    p.add_argument("--beta", type=float, default=None, help="iql: inverse temperature of the advantage weights "
                   "(default 1.0)")
    if evaluate:  # `ttlib train` has --top-percent and --dataset already (train.RunConfig)
        p.add_argument("--top-percent", type=float, default=None, help="bc, iql: learn from the best PERCENT of "
                       "the episodes by return (default 100: all; %%BC: e.g. 25)")
        p.add_argument("--dataset", default=None, help="bc, iql without --checkpoint: the dataset to learn from "
                       "(default: the course dataset)")
        p.add_argument("--train-seed", type=int, default=0, help="bc, iql without --checkpoint: the seed of the "
                       "policy's weights and batches")


def _config(kind: str, args, steps=None, seed: int = 0):
    from ttlib.agents.baselines import BaselineError, PolicyConfig

    config = PolicyConfig(kind=kind, seed=seed, top_percent=100.0 if args.top_percent is None else args.top_percent)
    if args.beta is not None:
        if kind != "iql":
            raise BaselineError("--beta weighs IQL's advantages: it is for --model iql")
        config.beta = args.beta
    if steps is not None:
        config.steps = steps
    config.validate()
    return config


def _critic_for(args, dataset_id: str):
    """The critic IQL's policy is extracted from: --critic's, or the shipped checkpoint's if it is of this data."""
    from ttlib.agents.baselines import BaselineError
    from ttlib.agents.critic import load_critic
    from ttlib.training.checkpoints import default_checkpoint, read_checkpoint

    path = args.critic
    if path is None:
        path = default_checkpoint()
        if read_checkpoint(path)["dataset"]["id"] != dataset_id:
            raise BaselineError(f"--model iql on {dataset_id}: give --critic CKPT, a checkpoint with a critic "
                                "of that dataset (`ttlib train --dataset ... --out CKPT` then `ttlib train-critic "
                                "--checkpoint CKPT`); the shipped one's is of the course dataset")
    payload = read_checkpoint(path, kind=None)
    if payload["dataset"]["id"] != dataset_id:
        raise BaselineError(f"the critic in {path} was trained on {payload['dataset']['id']}, not {dataset_id}")
    critic = load_critic(path, device="cpu", payload=payload)
    if critic is None:
        raise BaselineError(f"{path} holds no critic: add one with `ttlib train-critic --checkpoint {path}`")
    return critic


def trained_policy(kind: str, args, dataset_id: str, steps=None, seed: int = 0, progress: bool = True):
    """-> (policy, config, the dataset's summary, history): a baseline trained as the options say."""
    from ttlib.agents.baselines import train_policy
    from ttlib.data import trajectories as ttdata
    from ttlib.training.checkpoints import dataset_summary

    config = _config(kind, args, steps, seed)
    critic = _critic_for(args, dataset_id) if kind == "iql" else None  # before the data: a missing one fails fast
    data = ttdata.load(dataset_id, progress=progress)
    policy, history = train_policy(data, config, critic=critic, progress=progress)
    return policy, config, dataset_summary(data), history


def cmd_train_policy(args) -> None:
    """`ttlib train --model bc|iql --out CKPT`."""
    from ttlib.agents.baselines import save_policy

    if args.resume or args.export:
        raise ValueError(f"--model {args.model} trains in seconds: there is nothing to --resume or --export")
    policy, config, info, history = trained_policy(args.model, args, args.dataset or _default_dataset(),
                                                   args.steps, args.seed or 0)
    save_policy(args.out, policy, config, info, history)
    print(f"{config.name}: {history['episodes']} episodes ({history['transitions']} transitions, returns from "
          f"{history['lowest_return_kept']:.1f}), {config.steps} steps in {history['seconds']:.0f} s, last loss "
          f"{history['losses'][-1]:.4f}; checkpoint {args.out}")


def _default_dataset() -> str:
    from ttlib.data.trajectories import DEFAULT_DATASET

    return DEFAULT_DATASET


def check_evaluate_args(args) -> None:
    """Options that belong to other models are refused before anything is loaded."""
    if args.model in BASELINES:
        others = {"--workers": args.workers, "--target-return": args.target_return, "--value": args.value,
                  "--beam-width": args.beam_width, "--horizon": args.horizon, "--expand": args.expand,
                  "--top-k": args.top_k, "--top-p": args.top_p, "--context": args.context, "--decoder": args.decoder}
        given = [name for name, value in others.items() if value is not None]
        if given:
            raise ValueError(f"--model {args.model} acts without planning, in one process: leave out "
                             f"{', '.join(given)}")
        if args.checkpoint and any(v is not None for v in (args.dataset, args.top_percent, args.critic, args.beta)):
            raise ValueError("--dataset, --top-percent, --critic and --beta say how to train a baseline; a "
                             "--checkpoint holds one trained already")
    elif any(v is not None for v in (args.top_percent, args.critic, args.dataset, args.beta)):
        raise ValueError("--top-percent, --critic, --beta and --dataset are for the baselines (--model bc or iql)")


def cmd_evaluate_policy(args, env_for) -> None:
    """`ttlib evaluate --model bc|iql`: a checkpoint's policy, or one trained now, played on the seeds in the
    environment env_for(args, dataset info) names (cli_evaluate's, as for every agent)."""
    from ttlib.agents.baselines import evaluate, load_policy

    if args.checkpoint:
        policy, config, payload = load_policy(args.checkpoint)
        info, trained = payload["dataset"], "checkpoint " + args.checkpoint
        if config.kind != args.model:
            raise ValueError(f"{args.checkpoint} holds a {config.kind} policy, not {args.model}")
    else:
        policy, config, info, history = trained_policy(args.model, args, args.dataset or _default_dataset(),
                                                       seed=args.train_seed, progress=not args.json)
        trained = f"trained now in {history['seconds']:.0f} s on {history['episodes']} episodes"
    env_id, env_kwargs = env_for(args, info)
    seeds = list(range(args.seed, args.seed + args.episodes))
    result = evaluate(policy, env_id, seeds, env_kwargs, vectorized=not args.sequential, n_envs=args.n_envs,
                      max_steps=args.max_steps, record=args.video is not None, progress=not args.json)
    report = {"model": args.model, "agent": config.name, "dataset": info["id"], **result.return_stats(),
              "returns": result.returns.tolist(), "steps": result.steps, "seconds": result.seconds,
              "dataset_mean_return": info["mean_return"],
              "expert_mean_return": info.get("mean_return_by_behaviour", {}).get("expert")}
    if args.video:
        from ttlib.evaluation.rollout import save_video

        report["video"] = save_video(result.frames, args.video)
    if args.json:
        print(json.dumps(report))
        return
    print(f"{config.name} ({trained}): {result.summary()}")
    print(f"dataset {info['id']}: mean return {info['mean_return']:.1f}")
