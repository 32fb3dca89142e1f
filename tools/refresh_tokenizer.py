"""Give a checkpoint's tokenizer what each of its bins holds (the mean of its data), without retraining anything.

A tokenizer saved before ttlib kept its bins' means decodes every bin to its centre (a leg contact's 0 then comes
back as 0.5). Its means can be computed again, exactly, from the data its edges were fitted on: the checkpoint
names the dataset and the split (its train_config), the edges are fitted again and must be the saved ones (else
the data is not the same, and nothing is written), and the means of the training split are kept beside them.

    python -m tools.refresh_tokenizer assets/tt_lunarlander.safetensors [--out PATH]

The model, its critic and everything else in the file stay as they were.
"""

from __future__ import annotations

import argparse

import numpy as np

from ttlib.model.tokenizer import TrajectoryTokenizer, joined
from ttlib.training.checkpoint_files import CheckpointError, write_payload
from ttlib.training.checkpoints import read_checkpoint
from ttlib.training.train import TrainConfig, load_and_split


def refreshed_tokenizer(payload: dict, progress: bool = True) -> dict:
    """The checkpoint's tokenizer state with every bin's mean, from the training split its edges were fitted on."""
    config = TrainConfig.from_settings(payload["train_config"])
    _, train_data, _ = load_and_split(config, None, config.gamma, progress)
    saved = TrajectoryTokenizer(np.asarray(payload["tokenizer"]["edges"]), payload["tokenizer"]["obs_dim"],
                                payload["tokenizer"]["act_dim"], payload["tokenizer"]["strategy"])
    t = train_data.transitions()
    rows = joined(t["observations"], t["actions"], t["rewards"], t["values"])
    edges = TrajectoryTokenizer.fit(rows, saved.obs_dim, saved.act_dim, saved.n_bins, saved.strategy).edges
    if not np.array_equal(edges, saved.edges):
        raise CheckpointError(f"the edges fitted again on {config.dataset} (seed {config.seed}, top "
                              f"{config.top_percent}%) are not the checkpoint's: this is not the data it was "
                              "fitted on; rebuild that dataset, or retrain")
    return saved.fit_means(rows).state_dict()


def refresh(path: str, out: str | None = None, progress: bool = True) -> dict:
    """Write the checkpoint at `path` again (to `out`, default: in place, atomically) with its tokenizer's means."""
    payload = read_checkpoint(path)
    payload["tokenizer"] = refreshed_tokenizer(payload, progress)
    write_payload(out or path, payload)
    return payload["tokenizer"]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint")
    parser.add_argument("--out", help="where to write it (default: in place)")
    args = parser.parse_args(argv)
    state = refresh(args.checkpoint, args.out)
    means, edges = np.asarray(state["means"]), np.asarray(state["edges"])
    moved = np.abs(means - (edges[:, :-1] + edges[:, 1:]) / 2).max(axis=1)
    print(f"{args.out or args.checkpoint}: every bin now decodes to its mean; largest move from a centre per "
          f"dimension: {np.array2string(moved, precision=3)}")


if __name__ == "__main__":
    main()
