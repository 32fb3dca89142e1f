"""`--model bc` and `--model iql` of `ttlib train` and `ttlib evaluate`: the baselines (ttlib.agents.baselines).

    ttlib evaluate --model bc --episodes 60                   BC on every episode of the course dataset
    ttlib evaluate --model bc --top-percent 25 --episodes 60  %BC: the best quarter of the episodes
    ttlib evaluate --model iql --episodes 60                  IQL's policy (AWR) on the shipped checkpoint's critic
    ttlib evaluate --model bc --dataset ID ...                on another dataset (iql: on the critic shipped for it,
                                                              or --critic CKPT)
    ttlib train --model bc --top-percent 25 --out runs/pbc.safetensors a checkpoint, for `ttlib evaluate --checkpoint`

Without --checkpoint, `evaluate` trains the baseline first (seconds on a CPU) with the seed given by --train-seed,
so the same command gives the same policy on the same machine.
"""

from __future__ import annotations

from ttlib.cli.options import add_config_options, given, given_options, option
from ttlib.errors import ConfigError

__all__ = ["BASELINES", "POLICY_NAMES", "add_baseline_options", "check_evaluate_args", "cmd_train_policy",
           "policy_options"]

BASELINES = ("bc", "iql")
POLICY_NAMES = {"seed": ("--train-seed",)}  # in `ttlib evaluate`, whose --seed is the first episode's


def add_baseline_options(p, evaluate: bool) -> None:
    """The options the baselines add to `ttlib train` (evaluate=False: PolicyConfig's fields are among its
    train_configs) or `ttlib evaluate`."""
    p.add_argument("--critic", default=None, help="iql: a checkpoint holding the critic to extract the policy "
                   "from (`ttlib train-critic`; default: the one shipped for the dataset)")
    if evaluate:  # (--dataset: `ttlib train`'s is train.RunConfig's, `ttlib evaluate`'s its own)
        from ttlib.agents.baselines import PolicyConfig

        group = p.add_argument_group("a baseline trained now (--model bc or iql without --checkpoint)")
        add_config_options(group, {"bc/iql": PolicyConfig()}, skip=("kind",), names=POLICY_NAMES)


def policy_options(args, kind: str, names: dict | None = None) -> dict:
    """The baseline's PolicyConfig fields given on the command line (`names`: POLICY_NAMES in `ttlib evaluate`);
    IQL's advantage weights are refused for bc."""
    from ttlib.agents.baselines import PolicyConfig

    options = given(args, PolicyConfig(), names)
    weights = [option(n, names) for n in ("beta", "max_weight") if n in options]
    if weights and kind != "iql":
        verb = "weighs" if len(weights) == 1 else "weigh"
        raise ConfigError(f"{' and '.join(weights)} {verb} IQL's advantages: for --model iql only")
    return options


def cmd_train_policy(args) -> None:
    """`ttlib train --model bc|iql --out CKPT`."""
    from ttlib.agents.baselines import PolicyConfig, save_policy, trained_policy

    if args.resume or args.export:
        raise ConfigError(f"--model {args.model} trains in seconds: there is nothing to --resume or --export")
    config = PolicyConfig(**{**policy_options(args, args.model), "kind": args.model})
    policy, config, info, history = trained_policy(config, args.dataset, args.critic)
    save_policy(args.out, policy, config, info, history)
    print(f"{config.name}: {history['episodes']} episodes ({history['transitions']} transitions, returns from "
          f"{history['lowest_return_kept']:.1f}), {config.steps} steps in {history['seconds']:.0f} s, last loss "
          f"{history['losses'][-1]:.4f}; checkpoint {args.out}")


def check_evaluate_args(args, planning: list[str]) -> None:
    """Options that belong to other models are refused before anything is loaded (`planning`: the planner's options
    given)."""
    from ttlib.agents.baselines import PolicyConfig

    training = sorted(given_options(args, [PolicyConfig()], POLICY_NAMES)) + [
        name for name, value in (("--critic", args.critic),) if value is not None]
    if args.model in BASELINES:
        others = planning + [name for name, value in (("--workers", args.workers),
                                                      ("--target-return", args.target_return)) if value is not None]
        if others:
            raise ConfigError(f"--model {args.model} acts without planning, in one process: leave out "
                              f"{', '.join(others)}")
        training += ["--dataset"] if args.dataset is not None else []
        if args.checkpoint and training:
            verb = "says" if len(training) == 1 else "say"
            raise ConfigError(f"{', '.join(training)} {verb} how to train a baseline; a --checkpoint holds one "
                              "trained already")
    elif training:
        raise ConfigError(f"{', '.join(training)}: for the baselines only (--model bc or iql)")
    elif args.model == "dt" and planning:
        raise ConfigError(f"--model dt acts without planning: leave out {', '.join(planning)}")
