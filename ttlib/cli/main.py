"""The `ttlib` command line: python -m ttlib <command> (or just `ttlib <command>`).

    ttlib make-dataset [--dataset ID] [--force]     build the offline course dataset (or the HalfCheetah one)
    ttlib datasets                                  list the Minari datasets on this machine
    ttlib train --out runs/tt.safetensors [--export assets/tt_lunarlander.safetensors]
    ttlib train --model dt --out runs/dt.safetensors [--export assets/dt_lunarlander.safetensors]
    ttlib evaluate [--checkpoint PATH] --episodes 10 [--env ENV_ID] [--workers K [--central] [--address HOST:PORT]]
                   [--which last]               the last step's model, not the best evaluation's
    ttlib evaluate --model dt [--target-return 280] --episodes 10
    ttlib bench {decoding,planning,profile,rollouts,training,distributed} [--json]
    ttlib convert-checkpoint OLD.pt NEW.safetensors  an older, pickled checkpoint as data only
    ttlib lab [JUPYTER LAB OPTIONS]                 JupyterLab on the student notebooks, without instructor tools
    ttlib grade release [--check]                   nbgrader student versions of the graded notebooks
    ttlib grade collect ASSIGNMENT FOLDER           a folder of <student>.ipynb into nbgrader's submitted/
    ttlib grade autograde ASSIGNMENT [--jobs N] [--ray ADDRESS] [--force]   the class graded N at a time
    ttlib grade doctor                              what the grading sandbox guarantees on this machine
"""

from __future__ import annotations

import argparse
import json
import sys

from ttlib.errors import TTLibError
from ttlib.grading import cli as grading_cli

__all__ = ["COMPUTES", "build_parser", "main"]
COMPUTES = ("train", "train-critic", "evaluate", "bench")  # the commands whose work is torch's, on CPU threads


def _cmd_make_dataset(args):
    from ttlib.data import trajectories as ttdata

    path = ttdata.build(args.dataset, seed=args.seed, n_episodes=args.episodes, force=args.force)
    print(f"dataset {args.dataset} ready at {path}")
    print(ttdata.load(args.dataset, progress=False).summary())


def _cmd_datasets(args):
    from ttlib.data import trajectories as ttdata

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
    from ttlib.course import lab

    code = lab.main(args.jupyter_options)
    if code:
        raise SystemExit(code)


def _cmd_convert_checkpoint(args):
    from ttlib.training.checkpoint_files import convert_pickled
    from ttlib.training.checkpoints import read_checkpoint

    print(f"reading the pickled checkpoint {args.old} with PyTorch's restricted unpickler (tensors and plain data "
          f"only; a file holding anything else is refused, unrun),\nand writing it as tensors + JSON to {args.new}",
          file=sys.stderr)
    convert_pickled(args.old, args.new)
    payload = read_checkpoint(args.new, kind=None)  # read back the way every ttlib command reads it
    tensors = sum(1 for _ in _tensors(payload))
    print(f"wrote {args.new}: a {payload['kind']} checkpoint, {tensors} tensors; every ttlib command reads it, and "
          "reading it runs nothing")


def _tensors(tree):
    import torch

    if isinstance(tree, torch.Tensor):
        yield tree
    elif isinstance(tree, dict):
        for value in tree.values():
            yield from _tensors(value)
    elif isinstance(tree, (list, tuple)):
        for value in tree:
            yield from _tensors(value)


def _cmd_bench(args):
    from ttlib.bench import decoding as bench
    from ttlib.bench import runs as bench_runs

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
        out = bench_runs.bench_rollouts(episodes=args.episodes, max_steps=args.max_steps, **repeats)
    elif args.which == "distributed":
        out = bench_runs.bench_distributed(workers=tuple(args.workers), episodes=args.episodes,
                                           max_steps=args.max_steps)
    elif args.which == "data-parallel":  # training tokens/s on 1 and more worker processes, CPU and GPUs
        from ttlib.training import data_parallel

        out = data_parallel.bench(workers=tuple(args.workers))
    else:
        out = bench_runs.bench_training(args.preset if args.preset != "halfcheetah" else "lunarlander",
                                   device=args.device)
    if args.json:
        print(json.dumps(out))
        return
    for k, v in out.items():
        if isinstance(v, dict) and "median" in v:  # repeated measurements: median (range)
            v = f"{v['median']:.3g} ({v['min']:.3g}-{v['max']:.3g}, {v['n']} runs)"
        print(f"{k:24s} {v:.4g}" if isinstance(v, float) else f"{k:24s} {v}")
    if args.which == "planning":
        print("\nside by side, " + "; ".join(
            f"{name}: {d['ms_per_plan']['median']:.1f} ms ({d['share_of_matmul_rate']['median']:.1%} of the matmul "
            f"rate" + (f", {d['speedup_vs_fused']['median']:.2f}x fused)" if "speedup_vs_fused" in d else ")")
            for name, d in out["decoders"].items()) + f"; beam_plan's default here: {out['default_decoder']}")
        print(f"one plan takes {out['plan_over_floor']['median']:.2f}x the float32 FLOP floor of this machine "
              f"({out['gflop_per_plan']:.2f} GFLOP at {out['matmul_gflops']:.0f} GFLOP/s = {out['floor_ms']:.0f} ms): "
              f"{out['share_of_matmul_rate']['median']:.0%} of its matmul rate")
        print(f"its matrix products alone, at their own sizes and with nothing between them, take "
              f"{out['products_alone_over_floor']['median']:.2f}x the floor; the plan takes "
              f"{out['plan_over_products_alone']['median']:.2f}x them (the rest: Python, softmax, GELU, copies)")
        if "speedup_vs_faster_tt" in out:
            print(f"{out['speedup_vs_faster_tt']['median']:.1f}x faster than faster-TT's batch_beam_plan, side by side")


def build_parser(grading_only: bool = False) -> argparse.ArgumentParser:
    """The command line; `grading_only`: only `ttlib grade`, whose commands need neither PyTorch nor the datasets
    (an instructor's `ttlib grade collect` starts in half the time without importing them)."""
    parser = argparse.ArgumentParser(prog="ttlib", description="The Trajectory Transformer course library.")
    sub = parser.add_subparsers(dest="command", required=True)
    if grading_only:
        grading_cli.add_grade(sub)
        return parser
    from ttlib.cli.evaluate import add_evaluate
    from ttlib.cli.train import add_train, add_train_critic
    from ttlib.data import trajectories as ttdata

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

    add_train(sub)
    add_train_critic(sub)
    add_evaluate(sub)
    _add_bench(sub)

    p = sub.add_parser("convert-checkpoint", help="rewrite an older, pickled checkpoint (.pt) as data only")
    p.add_argument("old", help="the pickled checkpoint (ttlib before safetensors)")
    p.add_argument("new", help="where to write it (e.g. NAME.safetensors)")
    p.set_defaults(func=_cmd_convert_checkpoint)

    grading_cli.add_grade(sub)
    return parser


def _add_bench(sub) -> None:
    p = sub.add_parser("bench", help="benchmarks (ratios measured side by side)")
    p.add_argument("which", choices=["decoding", "planning", "profile", "rollouts", "training", "distributed",
                                     "data-parallel"])
    p.add_argument("--preset", default="halfcheetah", choices=["halfcheetah", "lunarlander", "tiny"])
    p.add_argument("--batch", type=int, default=1, help="environments planned at once")
    p.add_argument("--repeats", type=int, default=None, help="timed runs, median reported (default: 5; "
                   "rollouts: 3)")
    p.add_argument("--uncached-repeats", type=int, default=1)
    p.add_argument("--episodes", type=int, default=25)
    p.add_argument("--max-steps", type=int, default=50)
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4], help="distributed: Ray worker counts; "
                   "data-parallel: training worker processes")
    p.add_argument("--device", default="cuda" if _cuda() else "cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16", "float64"])
    p.add_argument("--faster-tt", default=None, metavar="DIR", help="planning: also time faster-TT's "
                   "batch_beam_plan, from a checkout of github.com/Howuhh/faster-trajectory-transformer in DIR")
    p.add_argument("--faster-tt-repeats", type=int, default=1, help="planning: faster-TT plans timed (each "
                   "beside one of ours)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=_cmd_bench)


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def main(argv=None) -> int:
    """Run one command. A TTLibError (a mistake in what the user gave) prints as one line and exits with 2; any
    other exception is a bug and keeps its traceback."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(grading_only=argv[:1] == ["grade"])
    if argv[:1] == ["lab"]:  # `ttlib lab --allow-root ...`: the options are JupyterLab's
        args = parser.parse_args(["lab"])
        args.jupyter_options = argv[1:]
    elif argv[:2] == ["grade", "autograde"]:  # nbgrader's --Class.trait=value options pass through
        options = [a for a in argv if grading_cli.NBGRADER_OPTION.match(a)]
        args = parser.parse_args([a for a in argv if a not in options])
        args.nbgrader_options = options
    else:
        args = parser.parse_args(argv)
    if args.command in COMPUTES:  # the process is this command's: its torch threads, the cores others leave free
        from ttlib.course import threads

        threads.fit()
    try:
        args.func(args)
    except TTLibError as e:
        print(f"ttlib {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        from ttlib.cli.train import where_to_resume

        print(f"ttlib {args.command}: interrupted{where_to_resume(args)}", file=sys.stderr)
        return 130  # 128 + SIGINT, as a shell reports it
    return 0


if __name__ == "__main__":
    sys.exit(main())
