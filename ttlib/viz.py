"""Small plotting helpers the notebooks share: inline GIFs, token labels, attention maps and heatmaps.

Nothing here is needed to train or plan; it only helps to look at things.
"""

from __future__ import annotations

import io

import numpy as np
import torch


# ---- videos ---------------------------------------------------------------------------------------------------
def side_by_side(*episodes: list[np.ndarray], gap: int = 4) -> list[np.ndarray]:
    """Put several episodes' rgb frames (H, W, 3) next to each other; a finished episode holds its last frame."""
    n = max(len(frames) for frames in episodes)
    height = max(frames[0].shape[0] for frames in episodes)
    out = []
    for t in range(n):
        row = []
        for frames in episodes:
            frame = frames[min(t, len(frames) - 1)]
            pad = np.full((height - frame.shape[0], frame.shape[1], 3), 255, np.uint8)  # bottom-pad short frames
            row += [np.concatenate([frame, pad]), np.full((height, gap, 3), 255, np.uint8)]
        out.append(np.concatenate(row[:-1], axis=1))
    return out


def gif(frames: list[np.ndarray], fps: int = 25, every: int = 1, shrink: int = 1):
    """An in-memory GIF of rgb frames, shown inline by Jupyter. every=2 keeps every other frame (shorter file);
    shrink=2 halves the resolution."""
    import imageio.v2 as imageio
    from IPython.display import Image

    kept = [np.ascontiguousarray(f[::shrink, ::shrink]) for f in frames[::every]]
    buffer = io.BytesIO()
    imageio.mimsave(buffer, kept, format="GIF", duration=1000 * every / fps, loop=0)
    return Image(data=buffer.getvalue(), format="gif")


# ---- widgets ---------------------------------------------------------------------------------------------------
def interactive_plot(draw, **controls):
    """Controls (ipywidgets) above an Output that shows draw(**values) and redraws it whenever a control changes.

    Like `ipywidgets.interactive_output`, with one difference: an error in the *first* drawing is raised, not just
    printed inside the Output, so a notebook run without a browser (CI, nbval) fails loudly instead of hiding it.
    Returns the VBox to `display`.
    """
    import ipywidgets as widgets
    import matplotlib.pyplot as plt
    from IPython.display import clear_output

    out = widgets.Output()
    errors = []

    def redraw(change=None):
        with out:
            clear_output(wait=True)
            try:
                draw(**{name: control.value for name, control in controls.items()})
                plt.show()
            except Exception as error:
                errors.append(error)
                raise  # the Output shows the traceback

    for control in controls.values():
        control.observe(redraw, names="value")
    redraw()
    if errors:
        raise errors[0]
    row = widgets.HBox(list(controls.values()), layout=widgets.Layout(flex_flow="row wrap"))
    return widgets.VBox([row, out])


# ---- tokens and attention -------------------------------------------------------------------------------------
def token_labels(obs_dim: int, act_dim: int, n_tokens: int) -> list[str]:
    """Names of the first n_tokens of a trajectory: s0..s{O-1}, a0..a{A-1}, r, V, then the next transition's.
    The suffix is the transition: 's3.1' is observation dimension 3 of transition 1, 'V.0' the first value."""
    one = [f"s{i}" for i in range(obs_dim)] + [f"a{i}" for i in range(act_dim)] + ["r", "V"]
    return [f"{one[i % len(one)]}.{i // len(one)}" for i in range(n_tokens)]


@torch.no_grad()
def attention_maps(model, bins: torch.Tensor) -> torch.Tensor:
    """Attention weights of every layer and head of a `ttlib.model.TrajectoryGPT` on bins (B, T).

    Returns (n_layer, B, n_head, T, T): row i of a map is how query token i spreads its attention over the keys.
    The weights are recomputed from each block's own query/key projections; the blocks themselves move the
    residual stream forward, so the maps are exactly those the model uses.
    """
    was_training = model.training
    model.eval()
    B, T = bins.shape
    x = model.tok_emb(bins + model.token_offset[:T]) + model.pos_emb[:T]  # (B, T, C)
    allowed = model.allowed[:T, :T]  # (T, T)
    maps = []
    for block in model.blocks:
        attn = block.attn
        C, H = x.shape[-1], attn.n_head
        q, k, _ = attn.qkv(block.ln_1(x)).split(C, dim=2)  # each (B, T, C)
        q = q.view(B, T, H, C // H).transpose(1, 2)  # (B, H, T, D)
        k = k.view(B, T, H, C // H).transpose(1, 2)  # (B, H, T, D)
        scores = (q @ k.transpose(-2, -1)) / (C // H) ** 0.5  # (B, H, T, T)
        maps.append(torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1))
        x = block(x, allowed)
    model.train(was_training)
    return torch.stack(maps)  # (n_layer, B, H, T, T)


def plot_attention(ax, weights, allowed=None, labels=None, query: int | None = None, title: str = ""):
    """Heatmap of attention weights (T, S) on a matplotlib axis. Masked cells (allowed False) are grey and
    hatched; `query` outlines one row. Returns the image (for a colorbar)."""
    import matplotlib.patches as patches

    weights = np.asarray(torch.as_tensor(weights).detach().cpu(), dtype=np.float64)
    T, S = weights.shape
    shown = np.ma.masked_array(weights, mask=None if allowed is None else ~np.asarray(allowed, dtype=bool))
    ax.set_facecolor("#d9d9d9")  # what shows through masked cells
    image = ax.imshow(shown, cmap="viridis", vmin=0.0, vmax=max(float(weights.max()), 1e-9), interpolation="none")
    if allowed is not None:
        ys, xs = np.nonzero(~np.asarray(allowed, dtype=bool))
        for y, x in zip(ys, xs, strict=True):
            ax.add_patch(patches.Rectangle((x - 0.5, y - 0.5), 1, 1, fill=False, hatch="///", lw=0,
                                           edgecolor="#9e9e9e"))
    if query is not None:
        ax.add_patch(patches.Rectangle((-0.5, query - 0.5), S, 1, fill=False, edgecolor="red", lw=2))
    if labels is not None and len(labels) >= max(T, S) and max(T, S) <= 40:
        ax.set_xticks(range(S), labels[:S], rotation=90, fontsize=7)
        ax.set_yticks(range(T), labels[:T], fontsize=7)
    ax.set_xlabel("key (attended to)")
    ax.set_ylabel("query (attending)")
    if title:
        ax.set_title(title)
    return image


# ---- beam search -----------------------------------------------------------------------------------------------
def plot_beam_tree(ax, trace, beam_width: int, sample_expand: int, env: int = 0, title: str = ""):
    """The search tree of one environment from a beam search's trace (`beam_plan(..., trace=[])` fills one): a list
    of (score (E*W*X,) of every child, keep (E*W,) the rows kept), one pair per planned step.

    Column t holds step t's candidates, ranked by score (the best on top); each hangs from the beam it was expanded
    from. Kept candidates (the best W) are blue, dropped ones grey, and the plan finally chosen is red, from the
    present (the root) to its last step. Returns the best plan's scores, one per step."""
    W, X = beam_width, sample_expand
    R = W * X  # children per environment and step
    scores = [np.asarray(torch.as_tensor(score).double().cpu())[env * R:(env + 1) * R] for score, _ in trace]  # (R,)
    kept = [np.asarray(torch.as_tensor(keep).cpu())[env * W:(env + 1) * W] - env * R for _, keep in trace]  # (W,)
    ranks = [np.argsort(np.argsort(-score, kind="stable"), kind="stable") for score in scores]  # (R,) 0 = best
    for t, score in enumerate(scores):
        # child c of step t was expanded from beam c // X, which was child kept[t-1][c // X] of the step before
        parent_y = np.zeros(R) if t == 0 else ranks[t - 1][kept[t - 1][np.arange(R) // X]]
        is_kept = np.zeros(R, bool)
        is_kept[kept[t]] = True
        for group, color, lw in [(~is_kept, "0.8", 0.5), (is_kept, "tab:blue", 0.9)]:  # the kept ones on top
            xs = np.stack([np.full(group.sum(), t), np.full(group.sum(), t + 1), np.full(group.sum(), np.nan)])
            ys = np.stack([parent_y[group], ranks[t][group], np.full(group.sum(), np.nan)])
            ax.plot(xs.T.ravel(), ys.T.ravel(), color=color, lw=lw)
        ax.plot(np.full((~is_kept).sum(), t + 1), ranks[t][~is_kept], "o", color="0.7", ms=3,
                label="dropped" if t == 0 else None)
        ax.plot(np.full(is_kept.sum(), t + 1), ranks[t][is_kept], "o", color="tab:blue", ms=4,
                label=f"kept: the best {W} of {R}" if t == 0 else None)
        ax.annotate(f"best {score.max():.1f}\nworst {score.min():.1f}", (t + 1, -0.5), ha="center", va="bottom",
                    fontsize=7, annotation_clip=False)
    # the chosen plan, followed back from the last step's best kept child to the root
    child, path = int(kept[-1][np.argmax(scores[-1][kept[-1]])]), []
    for t in reversed(range(len(scores))):
        path.append((ranks[t][child], scores[t][child]))
        if t > 0:
            child = int(kept[t - 1][child // X])
    path.reverse()
    ax.plot(range(len(scores) + 1), [0, *(y for y, _ in path)], "-o", color="tab:red", lw=2, ms=5,
            label="the plan chosen")
    ax.plot([0], [0], "ks", ms=7, label="now: the context")
    ax.axhline(W - 0.5, color="tab:blue", ls=":", lw=1)
    ax.set_ylim(R - 0.5 + R / 30, -0.5 - R / 8)  # the best on top, room for the labels
    ax.set_xticks(range(len(scores) + 1), ["now"] + [f"step {t}" for t in range(len(scores))])
    ax.set(xlabel="planned step", ylabel="rank of the candidate's score in its step", title=title)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=4)
    return [score for _, score in path]
