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

from ttlib.errors import ConfigError

__all__ = ["BASELINES", "add_baseline_options", "check_evaluate_args", "cmd_train_policy"]

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


def cmd_train_policy(args) -> None:
    """`ttlib train --model bc|iql --out CKPT`."""
    from ttlib.agents.baselines import save_policy, trained_policy

    if args.resume or args.export:
        raise ConfigError(f"--model {args.model} trains in seconds: there is nothing to --resume or --export")
    policy, config, info, history = trained_policy(args.model, args.dataset, args.top_percent,
                                                   args.beta, args.critic, args.steps, args.seed or 0)
    save_policy(args.out, policy, config, info, history)
    print(f"{config.name}: {history['episodes']} episodes ({history['transitions']} transitions, returns from "
          f"{history['lowest_return_kept']:.1f}), {config.steps} steps in {history['seconds']:.0f} s, last loss "
          f"{history['losses'][-1]:.4f}; checkpoint {args.out}")


def check_evaluate_args(args) -> None:
    """Options that belong to other models are refused before anything is loaded."""
    if args.model in BASELINES:
        others = {"--workers": args.workers, "--target-return": args.target_return, "--value": args.value,
                  "--beam-width": args.beam_width, "--horizon": args.horizon, "--expand": args.expand,
                  "--top-k": args.top_k, "--top-p": args.top_p, "--context": args.context}
        given = [name for name, value in others.items() if value is not None]
        if given:
            raise ConfigError(f"--model {args.model} acts without planning, in one process: leave out "
                              f"{', '.join(given)}")
        if args.checkpoint and any(v is not None for v in (args.dataset, args.top_percent, args.critic, args.beta)):
            raise ConfigError("--dataset, --top-percent, --critic and --beta say how to train a baseline; a "
                              "--checkpoint holds one trained already")
    elif any(v is not None for v in (args.top_percent, args.critic, args.dataset, args.beta)):
        raise ConfigError("--top-percent, --critic, --beta and --dataset are for the baselines (--model bc or iql)")
