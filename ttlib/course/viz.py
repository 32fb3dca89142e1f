"""Small plotting helpers the notebooks share: inline GIFs, token labels, attention maps and heatmaps.

Nothing here is needed to train or plan; it only helps to look at things.
"""

from __future__ import annotations

import io

import numpy as np
import torch

__all__ = ["attention_by_kind", "attention_maps", "baseline_line", "caption", "gif", "interactive_plot",
           "plot_attention", "plot_beam_tree", "plot_gpt_block", "plot_kv_cache", "plot_reorder", "plot_token_layout",
           "side_by_side", "token_labels"]


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


def caption(frames: list[np.ndarray], text: str, size: int = 24) -> list[np.ndarray]:
    """The frames with `text` written in their top-left corner (which agent a video shows, and its return), in
    letters `size` pixels high: still readable in a GIF shrunk by 2."""
    from PIL import Image, ImageDraw, ImageFont

    try:
        font = ImageFont.load_default(size=size)  # Pillow >= 10.1: a scalable font
    except TypeError:  # older Pillow: its small bitmap font
        font = ImageFont.load_default()
    out = []
    for frame in frames:
        image = Image.fromarray(np.ascontiguousarray(frame))
        ImageDraw.Draw(image).text((8, 6), text, font=font, fill=(255, 255, 255), stroke_width=2,
                                   stroke_fill=(0, 0, 0))
        out.append(np.asarray(image))
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


# ---- results -------------------------------------------------------------------------------------------------
def baseline_line(ax, returns, label: str = "%BC, best 25% (notebook 00)", color: str = "tab:olive"):
    """The line every result plot of the course draws: a baseline's mean return over the same seeds as the agents
    in the plot (dash-dotted), with its standard error as a band. `returns`: the baseline's per-episode returns,
    e.g. `ttlib.agents.baselines.course_baseline(seeds).returns`."""
    returns = np.asarray(returns, dtype=np.float64)
    mean = float(returns.mean())
    error = float(returns.std(ddof=1) / np.sqrt(len(returns))) if len(returns) > 1 else 0.0
    ax.axhspan(mean - error, mean + error, color=color, alpha=0.15, lw=0)
    return ax.axhline(mean, color=color, ls="-.", lw=2, label=f"{label}: {mean:.1f}")


# ---- tokens and attention -------------------------------------------------------------------------------------
def token_labels(obs_dim: int, act_dim: int, n_tokens: int) -> list[str]:
    """Names of the first n_tokens of a trajectory: s0..s{O-1}, a0..a{A-1}, r, V, then the next transition's.
    The suffix is the transition: 's3.1' is observation dimension 3 of transition 1, 'V.0' the first value."""
    one = [f"s{i}" for i in range(obs_dim)] + [f"a{i}" for i in range(act_dim)] + ["r", "V"]
    return [f"{one[i % len(one)]}.{i // len(one)}" for i in range(n_tokens)]


_KIND_COLORS = {"s": "#9ecae1", "a": "#fdae6b", "r": "#a1d99b", "V": "#bcbddc"}  # observation, action, reward, value


def plot_token_layout(ax, obs_dim: int, act_dim: int, n_transitions: int = 2, n_bins: int | None = None,
                      title: str = ""):
    """A trajectory as the Trajectory GPT reads it: one box per token, transition after transition.

    Each box is labelled with its token's name (s3.1: observation dimension 3 of transition 1) and, below, its
    dimension d (the token id is bin + d * n_bins, with n_bins given). Value tokens are hatched: no query ever
    attends to them. A bracket spans each transition.
    """
    import matplotlib.patches as patches

    td = obs_dim + act_dim + 2
    labels = token_labels(obs_dim, act_dim, n_transitions * td)
    for i, label in enumerate(labels):
        kind, d = label[0], i % td
        ax.add_patch(patches.Rectangle((i, 0), 0.9, 1, facecolor=_KIND_COLORS[kind], edgecolor="#444444", lw=0.8,
                                       hatch="///" if kind == "V" else None))
        ax.text(i + 0.45, 0.5, label, ha="center", va="center", fontsize=7, rotation=90)
        below = f"+{d * n_bins}" if n_bins is not None else f"d={d}"
        ax.text(i + 0.45, -0.25, below, ha="center", va="top", fontsize=6, rotation=90)
    for t in range(n_transitions):
        left, right = t * td, (t + 1) * td - 0.1
        ax.plot([left, left, right, right], [1.15, 1.3, 1.3, 1.15], color="#444444", lw=1)
        ax.text((left + right) / 2, 1.4, f"transition {t}: s, a, r, V", ha="center", va="bottom", fontsize=8)
    handles = [patches.Patch(facecolor=c, edgecolor="#444444", label=name, hatch="///" if k == "V" else None)
               for k, c, name in zip(_KIND_COLORS, _KIND_COLORS.values(),
                                     ["observation", "action", "reward", "value (hidden from every query)"],
                                     strict=True)]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=4,
              fontsize=8, frameon=False)
    ax.set_xlim(-0.3, n_transitions * td + 0.2)
    ax.set_ylim(-1.6, 1.7)
    ax.axis("off")
    if title:
        ax.set_title(title)


def plot_gpt_block(ax, n_layer: int = 4):
    """The Trajectory GPT as a diagram, bottom to top: bins -> token ids -> embeddings + positions -> n_layer
    pre-norm blocks (LayerNorm -> masked self-attention -> add; LayerNorm -> MLP -> add) -> LayerNorm -> one head
    per position in the transition -> logits. The residual stream runs up the middle; each sub-layer branches off
    it and adds its output back."""
    import matplotlib.patches as patches

    def box(x, y, text, color, w=3.2, h=0.62):
        ax.add_patch(patches.FancyBboxPatch((x - w / 2, y - h / 2), w, h, boxstyle="round,pad=0.05",
                                            facecolor=color, edgecolor="#444444", lw=1))
        ax.text(x, y, text, ha="center", va="center", fontsize=8)

    def arrow(x0, y0, x1, y1):
        ax.annotate("", (x1, y1), (x0, y0), arrowprops=dict(arrowstyle="->", color="#444444", lw=1))

    def add(x, y):
        ax.add_patch(patches.Circle((x, y), 0.18, facecolor="white", edgecolor="#444444", lw=1))
        ax.text(x, y, "+", ha="center", va="center", fontsize=9)

    stream, side = 0.0, 2.7  # x of the residual stream and of the sub-layers
    box(stream, 0.0, "bins (B, T)", "#eeeeee")
    box(stream, 1.0, "token id = bin + d * n_bins,  d = position mod td", "#eeeeee", w=5.0)
    box(stream, 2.0, "token embedding + position embedding", "#c6dbef", w=5.0)
    arrow(stream, 0.31, stream, 0.69)
    arrow(stream, 1.31, stream, 1.69)
    # one block, drawn in a frame: x + attn(ln_1(x)), then x + mlp(ln_2(x))
    ax.add_patch(patches.FancyBboxPatch((-1.3, 2.6), 5.5, 4.7, boxstyle="round,pad=0.1", facecolor="none",
                                        edgecolor="#888888", lw=1.2, ls="--"))
    ax.text(4.1, 7.25, f"block, x {n_layer}", ha="right", va="top", fontsize=9, color="#555555")
    for y0, norm, layer, color in [(3.0, "LayerNorm ln_1", "self-attention\n(trajectory mask)", "#fdd0a2"),
                                   (5.2, "LayerNorm ln_2", "MLP: C -> 4C,\nGELU, -> C", "#c7e9c0")]:
        box(side, y0 + 0.4, norm, "#f2f2f2", w=2.6, h=0.5)
        box(side, y0 + 1.25, layer, color, w=2.6, h=0.75)
        ax.plot([stream, side], [y0 - 0.2, y0 - 0.2], color="#444444", lw=1)  # branch off the stream
        arrow(side, y0 - 0.2, side, y0 + 0.13)
        arrow(side, y0 + 0.67, side, y0 + 0.85)
        ax.plot([side, side], [y0 + 1.64, y0 + 1.75], color="#444444", lw=1)
        arrow(side, y0 + 1.75, stream + 0.2, y0 + 1.75)  # add the sub-layer's output back into the stream
        add(stream, y0 + 1.75)
    arrow(stream, 2.31, stream, 4.55)
    arrow(stream, 4.93, stream, 6.75)
    arrow(stream, 7.13, stream, 7.69)
    box(stream, 8.0, "LayerNorm ln_f", "#f2f2f2")
    box(stream, 9.0, "head d = (position + 1) mod td:  h W_d + b_d", "#dadaeb", w=5.0)
    box(stream, 10.0, "logits (B, T, n_bins): the next token's bin", "#eeeeee", w=5.0)
    arrow(stream, 8.31, stream, 8.69)
    arrow(stream, 9.31, stream, 9.69)
    ax.text(stream - 0.12, 3.9, "residual\nstream", ha="right", va="center", fontsize=7, color="#555555")
    ax.set_xlim(-2.7, 4.4)
    ax.set_ylim(-0.5, 10.5)
    ax.set_aspect("equal")
    ax.axis("off")


@torch.no_grad()
def attention_maps(model, bins: torch.Tensor) -> torch.Tensor:
    """Attention weights of every layer and head of a `ttlib.model.gpt.TrajectoryGPT` on bins (B, T).

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


def attention_by_kind(maps, obs_dim: int, act_dim: int) -> np.ndarray:
    """Where each kind of token looks, on average: a (4, 9) table to read attention maps at a glance.

    maps (..., T, T): attention weights whose last two dims are query x key, e.g. one layer of `attention_maps`,
    (B, n_head, T, T); the leading dims are averaged. Row q is a query kind (s, a, r, V); column j the share of that
    query's attention that lands on keys of kind s, a, r, V in the query's own transition (columns 0-3), in the
    transition before (4-7), and on everything older (8). Each row sums to 1. Only queries of the third transition
    on are counted, so that each has a transition before and something older; T must reach that far.
    """
    weights = torch.as_tensor(maps).detach().cpu().double()
    td = obs_dim + act_dim + 2
    if weights.dim() < 2 or weights.shape[-2] != weights.shape[-1] or weights.shape[-1] <= 2 * td:
        raise ValueError(f"attention_by_kind needs (..., T, T) maps with T > 2 * transition_dim = {2 * td}, "
                         f"got shape {tuple(weights.shape)}")
    T = weights.shape[-1]
    weights = weights.reshape(-1, T, T).mean(0)  # (T, T)
    one = torch.tensor([0] * obs_dim + [1] * act_dim + [2, 3])  # (td,) kind of each dimension: s, a, r, V
    kind = one.repeat(T // td + 1)[:T]  # (T,)
    step = torch.arange(T) // td  # (T,) the transition of each token
    back = (step[:, None] - step[None, :]).clamp(min=0)  # (T, T) transitions from key to query; future keys weigh 0
    column = torch.where(back <= 1, 4 * back + kind[None, :], 8)  # (T, T) the table column each key falls in
    per_query = torch.einsum("qk,qkc->qc", weights, torch.nn.functional.one_hot(column, 9).double())  # (T, 9)
    counted = step >= 2  # (T,)
    return torch.stack([per_query[counted & (kind == k)].mean(0) for k in range(4)]).numpy()  # (4, 9)


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
        from matplotlib.collections import PatchCollection

        ys, xs = np.nonzero(~np.asarray(allowed, dtype=bool))
        cells = [patches.Rectangle((x - 0.5, y - 0.5), 1, 1) for y, x in zip(ys, xs, strict=True)]
        # one collection, not a patch per masked cell: drawn in a fraction of the time
        ax.add_collection(PatchCollection(cells, facecolor="none", edgecolor="#9e9e9e", hatch="///", lw=0))
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


# ---- the KV cache ----------------------------------------------------------------------------------------------
def plot_kv_cache(ax, length: int, new: int, capacity: int, n_layer: int = 2, transition_dim: int | None = None,
                  title: str = ""):
    """The buffers of a KV cache as rows of slots: per layer one row for K and one for V, one cell per position.

    Slots [0, length) hold stored tokens (blue), [length, length + new) the tokens being written now (orange), the
    rest is preallocated and still empty. With `transition_dim`, value-token slots are hatched: stored like every
    other token, but no query may attend to them.
    """
    import matplotlib.patches as patches

    rows = [(layer, kind) for layer in range(n_layer) for kind in ("K", "V")]
    for r, (layer, kind) in enumerate(rows):
        y = len(rows) - 1 - r  # layer 0 at the top
        for s in range(capacity):
            color = "#6baed6" if s < length else "#fd8d3c" if s < length + new else "white"
            is_value = transition_dim is not None and s % transition_dim == transition_dim - 1
            ax.add_patch(patches.Rectangle((s, y), 0.92, 0.8, facecolor=color, edgecolor="#555555", lw=0.8,
                                           hatch="///" if is_value else None))
        ax.text(-0.4, y + 0.4, f"layer {layer} {kind}", ha="right", va="center", fontsize=8)
    ax.annotate("position = length", xy=(length + 0.46, len(rows) - 0.15),
                xytext=(length + 0.46, len(rows) + 0.5),
                ha="center", fontsize=8, arrowprops={"arrowstyle": "->"})
    ax.set_xlim(-3.2, capacity + 0.2)
    ax.set_ylim(-0.3, len(rows) + 1.1)
    ax.set_xticks([s + 0.46 for s in range(capacity)], [str(s) for s in range(capacity)], fontsize=7)
    ax.set_yticks([])
    ax.set_xlabel("slot (absolute position of the token)")
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    handles = [patches.Patch(facecolor="#6baed6", edgecolor="#555555", label="stored"),
               patches.Patch(facecolor="#fd8d3c", edgecolor="#555555", label="written now"),
               patches.Patch(facecolor="white", edgecolor="#555555", label="empty (preallocated)")]
    if transition_dim is not None:
        handles.append(patches.Patch(facecolor="white", edgecolor="#555555", hatch="///",
                                     label="value token: never attended to"))
    ax.legend(handles=handles, loc="upper right", fontsize=7, ncol=len(handles), frameon=False,
              bbox_to_anchor=(1.0, 1.12))
    if title:
        ax.set_title(title, pad=22)


def plot_reorder(ax, indices, batch: int, title: str = ""):
    """What `reorder(indices)` does to the rows of a cache: new row i is a copy of old row indices[i].

    Old rows on the left, new rows on the right, one colour per old row; an old row that no index names is dropped
    (grey), one named twice is duplicated. The same gather applies to every layer's K and V.
    """
    import matplotlib.patches as patches
    import matplotlib.pyplot as plt

    indices = [int(i) for i in indices]
    colors = plt.get_cmap("tab10")
    for row in range(batch):
        kept = row in indices
        ax.add_patch(patches.Rectangle((0, -row), 2.2, 0.7, facecolor=colors(row % 10) if kept else "#d9d9d9",
                                       edgecolor="#555555", alpha=0.85))
        ax.text(1.1, -row + 0.35, f"old row {row}" + ("" if kept else " (dropped)"), ha="center", va="center",
                fontsize=8)
    for new, old in enumerate(indices):
        ax.add_patch(patches.Rectangle((4.8, -new), 2.2, 0.7, facecolor=colors(old % 10), edgecolor="#555555",
                                       alpha=0.85))
        ax.text(5.9, -new + 0.35, f"new row {new} = old {old}", ha="center", va="center", fontsize=8)
        ax.annotate("", xy=(4.75, -new + 0.35), xytext=(2.25, -old + 0.35),
                    arrowprops={"arrowstyle": "->", "color": colors(old % 10), "lw": 1.5})
    lowest = -max(batch, len(indices)) + 0.6
    ax.set_xlim(-0.2, 7.2)
    ax.set_ylim(lowest - 0.3, 1.2)
    ax.text(1.1, 0.95, "cache before", ha="center", fontsize=9, weight="bold")
    ax.text(5.9, 0.95, f"after reorder({indices})", ha="center", fontsize=9, weight="bold")
    ax.axis("off")
    if title:
        ax.set_title(title)


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
