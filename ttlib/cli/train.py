"""`ttlib train` and `ttlib train-critic`: their options, what they print, and how a stopped run goes on."""

from __future__ import annotations

from ttlib.cli.baselines import add_baseline_options
from ttlib.cli.options import add_config_options, config_from, given_options
from ttlib.errors import ConfigError

__all__ = ["CRITIC_SKIP", "TRAIN_SKIP", "add_train", "add_train_critic", "train_configs", "where_to_resume",
           "which_arg"]

TRAIN_SKIP = ("obs_dim", "act_dim", "action_low", "action_high", "kind")  # the data's (train.FROM_DATA); --model


def train_configs() -> dict:
    """The configs whose fields are `ttlib train`'s options, by --model (TRAIN_SKIP: the fields that are not)."""
    from ttlib.agents.baselines import PolicyConfig
    from ttlib.agents.dt import DTTrainConfig
    from ttlib.training.train import TrainConfig

    return {"tt": TrainConfig(), "dt": DTTrainConfig(), "bc/iql": PolicyConfig()}


def _refuse_others(args, whose: str, allowed=()) -> None:
    """Options of the other models' configs, not of this one's, are refused, naming them."""
    configs = train_configs()
    mine = given_options(args, [configs[whose]]) | set(allowed)
    others = sorted(given_options(args, configs.values()) - mine)
    if others:
        owners = [f"{name} is for --model " + "/".join(who for who, config in configs.items()
                                                      if name in given_options(args, [config])) for name in others]
        raise ConfigError(f"--model {args.model} has no option {', '.join(others)} ({'; '.join(owners)})")


def _cmd_train(args):
    from ttlib.training.train import TrainConfig, train

    if args.model == "dt":
        if args.workers != 1 or args.ray is not None:
            raise ConfigError("--workers and --ray train the Trajectory GPT; the Decision Transformer trains in one "
                              "process (leave them out with --model dt)")
        return _cmd_train_dt(args)
    if args.model in ("bc", "iql"):
        return _cmd_train_baseline(args)
    if args.critic is not None or args.beta is not None:
        raise ConfigError("--critic and --beta are for --model iql (a TT checkpoint gets its critic from `ttlib "
                          "train-critic`)")
    _refuse_others(args, "tt")
    config = config_from(args, _resumed_config(args, TrainConfig(), "trajectory-gpt"))
    parallel = args.workers != 1 or args.ray is not None
    if parallel:  # torchrun's workers, each a slice of every batch (ttlib.training.data_parallel)
        from ttlib.training import data_parallel, ray_training

        launch = ray_training.on_cluster(args.ray) if args.ray is not None else None
        result = data_parallel.train(config, out=args.out, resume=args.resume, workers=args.workers, launch=launch,
                                     max_restarts=args.max_restarts)
    else:
        result = train(config, out=args.out, resume=args.resume)
    last = result.history[-1]
    on = f" on {args.workers} workers" if parallel else ""
    _trained(args, result, f"train loss {last['train_loss']:.3f}, validation loss {last['val_loss']:.3f} at the last "
             f"step, {result.tokens_per_second:,.0f} tokens/s{on}", result.config)
    if result.restarts:
        print(f"a worker died: the workers started again {result.restarts} time(s) from the last checkpoint (the "
              f"last time from step {result.resumed_from})")


def _trained(args, result, losses: str, config) -> None:
    """Say how training went (how far, the last losses, the model kept, overfitting), and write the slim copy
    --export asks for."""
    from ttlib.training.best_model import best_line, overfitting
    from ttlib.training.checkpoints import export_checkpoint

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


def _resumed_config(args, config, kind: str):
    """--resume continues the checkpoint's run: its own settings are the defaults (a flag that differs from them
    is refused by the training's check_resume, naming it), so no flag has to be repeated."""
    if args.resume is None:
        return config
    from ttlib.training.checkpoints import read_checkpoint

    saved = read_checkpoint(args.resume, kind=kind).get("train_config")
    return type(config).from_settings(saved) if saved else config


def _cmd_train_dt(args):
    from ttlib.agents import dt

    _refuse_others(args, "dt")
    config = config_from(args, _resumed_config(args, dt.DTTrainConfig(), dt.KIND))
    result = dt.train(config, out=args.out, resume=args.resume)
    last = result.history[-1]
    _trained(args, result, f"a Decision Transformer in {result.seconds:.0f} s, train loss "
             f"{last['train_loss']:.4f}, validation loss {last['val_loss']:.4f} at the last step", config)


def _cmd_train_baseline(args):
    from ttlib.cli.baselines import cmd_train_policy

    _refuse_others(args, "bc/iql", allowed={"--dataset"})  # the data to learn from: a TrainConfig field
    cmd_train_policy(args)


def add_train(sub) -> None:
    p = sub.add_parser("train", help="train a Trajectory GPT")
    p.add_argument("--out", required=True, help="checkpoint path (written during training too)")
    p.add_argument("--resume", help="continue from this checkpoint")
    p.add_argument("--export", help="also write a slim copy (one model, no optimiser state) here")
    which_arg(p, "the model --export copies")
    p.add_argument("--model", choices=["tt", "dt", "bc", "iql"], default="tt", help="Trajectory GPT, Decision "
                   "Transformer, or a baseline: behaviour cloning (%%BC with --top-percent) or IQL's policy")
    p.add_argument("--workers", type=int, default=1, help="data-parallel worker processes, each a slice of every "
                   "batch (torchrun; gloo on CPUs, one GPU each with nccl); default 1")
    p.add_argument("--ray", metavar="ADDRESS", default=None, help="run the --workers on the Ray cluster at ADDRESS "
                   "(HOST:PORT; --out must be on storage its machines share)")
    p.add_argument("--max-restarts", dest="max_restarts", type=int, default=3, help="with --workers: how often the "
                   "workers start again from the last checkpoint when one dies (default 3)")
    add_config_options(p.add_argument_group("what to train (each option's help says which --model takes it)"),
                       train_configs(), skip=TRAIN_SKIP, notes={"dataset": "bc/iql learn from it too;"})
    add_baseline_options(p, evaluate=False)
    p.set_defaults(func=_cmd_train)


def which_arg(p, what: str) -> None:
    p.add_argument("--which", choices=["best", "last"], default="best", help=f"{what}: the best evaluation's "
                   "(default) or the last step's")


CRITIC_SKIP = ("gamma",)  # --gamma of its own: None keeps the checkpoint's, which its value targets were made with


def add_train_critic(sub) -> None:
    from ttlib.agents.critic import CriticConfig

    p = sub.add_parser("train-critic", help="add a Q critic (IQL) to a Trajectory GPT checkpoint, for the planner")
    p.add_argument("--checkpoint", required=True, help="Trajectory GPT checkpoint; the critic is written into it")
    p.add_argument("--out", help="write the checkpoint with its critic here instead (default: in place)")
    group = p.add_argument_group("the critic")
    add_config_options(group, {"critic": CriticConfig()}, skip=CRITIC_SKIP)
    group.add_argument("--gamma", type=float, default=None,
                       help="discount of the TD target (default: the checkpoint's, which its value tokens were made "
                            "with; 1: the undiscounted return, for episodes that end)")
    p.set_defaults(func=_cmd_train_critic)


def _cmd_train_critic(args):
    import time

    from ttlib.agents.critic import CriticConfig, add_critic

    config = config_from(args, CriticConfig())
    t0 = time.perf_counter()
    _, history = add_critic(args.checkpoint, config, out=args.out, gamma=args.gamma)
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


def where_to_resume(args) -> str:
    """After Ctrl-C in `ttlib train`: the last checkpoint (written atomically, so whole) and how to go on."""
    if args.command != "train":
        return ""
    from ttlib.training.checkpoint_files import CheckpointError
    from ttlib.training.checkpoints import read_checkpoint

    try:
        step = read_checkpoint(args.out, kind=None)["step"]
    except CheckpointError:
        return f"; no checkpoint was written to {args.out} yet, so start again"
    model = " --model dt" if args.model == "dt" else ""
    return (f"; the last checkpoint is {args.out} (step {step}); go on with "
            f"`ttlib train{model} --out {args.out} --resume {args.out}`")
