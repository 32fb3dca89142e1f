"""Notebook 03's exercises: the Trajectory GPT's token ids, its block, its heads and its forward pass (the loss
and the learning-rate schedule it trains with are in `gpt_training`; EXERCISES lists all six).

The class answers (MLP, Block, GPT) are built as the notebook builds them and hold ttlib's weights
(`module_answers.load_weights`), so they must compute ttlib's function, not just something shaped like it. Where an
answer calls pieces the check can watch (the block's attention and MLP, the blocks and heads of the GPT), what it
feeds them is compared too, in the order the computation runs: "where it first differs" then names the step that
went wrong.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from ttlib.exercises import Exercise, Mistake
from ttlib.exercises.gpt_training import lr_schedule, training_loss
from ttlib.exercises.module_answers import argument, load_weights, randomized, snapshot, watching
from ttlib.model import gpt as ttlib_model
from ttlib.model.attention import CausalSelfAttention
from ttlib.model.gpt import GPTConfig, TrajectoryGPT, trajectory_mask

__all__ = ["EXERCISES", "GivenGPT", "TTLibBlock", "TTLibGPT", "TTLibMLP", "block_trial", "forward_pass", "gpt_trial",
           "heads_trial", "lent_heads", "lent_token_ids", "per_position_heads", "run_block", "run_gpt", "run_heads",
           "run_token_ids", "token_ids_trial", "token_offsets", "transformer_block", "ttlib_heads", "ttlib_token_ids"]


# ---- ttlib's pieces with the notebook's signatures: references, and lent to the later exercises -----------------
def ttlib_token_ids(bins, start, transition_dim, n_bins):
    """What TrajectoryGPT.forward adds to the bins: its token_offset buffer at positions start .. start+T-1."""
    T = bins.shape[1]
    config = GPTConfig(obs_dim=transition_dim - 3, act_dim=1, n_bins=n_bins, n_layer=1, n_head=1, n_embd=4,
                       n_transitions=(start + T) // transition_dim + 1)
    return bins + TrajectoryGPT(config).token_offset[start:start + T]


def lent_token_ids(bins, start, transition_dim, n_bins):
    """The same offsets computed directly: lent to exercise 4, whose GPT calls it on every forward pass."""
    positions = torch.arange(start, start + bins.shape[1], device=bins.device)  # (T,)
    return bins + (positions % transition_dim) * n_bins


class TTLibMLP(ttlib_model.MLP):
    """ttlib's MLP, built as the notebook builds its own: MLP(n_embd)."""

    def __init__(self, n_embd):
        super().__init__(n_embd, dropout=0.0)


class TTLibBlock(ttlib_model.Block):
    """ttlib's Block, built as the notebook builds its own: Block(n_embd, n_head)."""

    def __init__(self, n_embd, n_head):
        super().__init__(GPTConfig(obs_dim=1, act_dim=1, n_embd=n_embd, n_head=n_head, dropout=0.0))


_HEADS_CALLS: list = []  # (x, start) of every call of the lent heads, while a GPT answer runs


def ttlib_heads(x, weight, bias, start):
    """Position i of x (B, T, C) through head (start + i + 1) % td, one matmul per position: (B, T, K)."""
    td = weight.shape[0]
    return torch.stack([x[:, i] @ weight[(start + i + 1) % td] + bias[(start + i + 1) % td]
                        for i in range(x.shape[1])], dim=1)


def lent_heads(x, weight, bias, start):
    """ttlib's heads, lent to exercise 4: it records what the GPT gives them."""
    _HEADS_CALLS.append((snapshot(x), start))
    return ttlib_heads(x, weight, bias, start)


class TTLibGPT(TrajectoryGPT):
    """ttlib's TrajectoryGPT, called as the notebook's GPT is: GPT(config)(bins) -> logits."""

    def forward(self, bins):
        return super().forward(bins)[0]


# ---- exercise 1: token ids ---------------------------------------------------------------------------------------
def _dtype(x) -> str:
    return str(getattr(x, "dtype", type(x).__name__)).replace("torch.", "")


def token_ids_trial(rng):
    obs, act, n_bins = int(rng.integers(1, 9)), int(rng.integers(1, 4)), int(rng.integers(2, 101))
    start, T = int(rng.integers(0, 40)), int(rng.integers(1, 40))
    return torch.as_tensor(rng.integers(0, n_bins, size=(int(rng.integers(1, 5)), T))), start, obs + act + 2, n_bins


def run_token_ids(answer, trial):
    bins, start, td, n_bins = copy.deepcopy(trial)
    small = answer.token_ids(torch.tensor([[3, 3, 3, 3, 3]]), 2, 4, 10)
    ids = answer.token_ids(bins, start, td, n_bins)
    return {"token_ids([[3, 3, 3, 3, 3]], start=2, transition_dim=4, n_bins=10)": small,
            f"token_ids(bins of shape {tuple(bins.shape)}, start={start}, transition_dim={td}, n_bins={n_bins})": ids,
            "the dtype of your token ids (nn.Embedding looks up integer ids)": _dtype(ids)}


def _token_ids_with(shift=0, with_start=True, modulo=True, swapped=False):
    def token_ids(bins, start, transition_dim, n_bins):
        first = start if with_start else 0
        positions = torch.arange(first, first + bins.shape[1]) + shift  # (T,)
        if swapped:
            return bins + (positions % n_bins) * transition_dim
        return bins + ((positions % transition_dim) if modulo else positions) * n_bins

    return {"token_ids": token_ids}


token_offsets = Exercise(
    id="03-token-ids", number=1, what="your token_ids", names=("token_ids",), trial=token_ids_trial,
    run=run_token_ids, reference={"token_ids": ttlib_token_ids},
    forbid=(TrajectoryGPT.__init__, TrajectoryGPT, trajectory_mask, ttlib_token_ids, lent_token_ids,
            _token_ids_with()["token_ids"]), trials=8, hidden_trials=12,
    passed="your token ids are the ones the model embeds.",
    mistakes=[
        Mistake("the offsets ignore `start`: column j sits at absolute position start + j, so its dimension is "
                "(start + j) % transition_dim -- torch.arange(start, start + T).", _token_ids_with(with_start=False)),
        Mistake("each token gets the *next* token's dimension: the token at position p is a bin of dimension "
                "p % transition_dim (the + 1 belongs to the heads, which predict the next token).",
                _token_ids_with(shift=1)),
        Mistake("the position is not taken modulo transition_dim: the dimensions repeat every transition, so the "
                "offset is (position % transition_dim) * n_bins.", _token_ids_with(modulo=False)),
        Mistake("transition_dim and n_bins are swapped: the dimension is position % transition_dim, and each "
                "dimension's slice of the vocabulary is n_bins rows wide, so add (position % transition_dim) * n_bins.",
                _token_ids_with(swapped=True)),
    ],
)


# ---- exercise 2: MLP and Block -----------------------------------------------------------------------------------
def block_trial(rng):
    """ttlib's weights of a random block (LayerNorms and biases random too), an input, a trajectory mask, an input
    for the MLP alone, and what ttlib's block feeds its attention and its MLP."""
    H, td = int(rng.integers(1, 4)), int(rng.integers(4, 8))
    C, T = H * int(rng.integers(2, 7)), int(rng.integers(2, 3 * td))
    block = randomized(TTLibBlock(C, H)).eval()
    x, allowed = torch.randn(int(rng.integers(1, 4)), T, C), trajectory_mask(T, td)
    with torch.no_grad(), watching(attn=block.attn, mlp=block.mlp) as seen:
        block(x, allowed)
    return block.state_dict(), H, x, allowed, torch.randn(2, 3, C), seen


def run_block(answer, trial):
    state, H, x, allowed, mlp_x, ttlibs = copy.deepcopy(trial)
    C = x.shape[-1]
    mlp = load_weights(answer.MLP(C), {k.removeprefix("mlp."): v for k, v in state.items() if k.startswith("mlp.")},
                       "MLP")
    block = load_weights(answer.Block(C, H), state, "Block")
    with torch.no_grad():
        mlp_out = mlp(mlp_x)
        with watching(attn=block.get_submodule("attn"), mlp=block.get_submodule("mlp")) as seen:
            out = block(x, allowed)
    attention, feed = seen.get("attn", ttlibs["attn"]), seen.get("mlp", ttlibs["mlp"])  # not called: not compared
    return {"MLP(x) with ttlib's weights": mlp_out,
            "what your Block feeds its attention (ln_1(x))": argument(attention, 0, "x"),
            "the mask your Block gives its attention (allowed)": argument(attention, 1, "allowed"),
            "what your Block feeds its MLP (ln_2 of x after the attention's residual)": argument(feed, 0, "x"),
            f"your Block(x of shape {tuple(x.shape)}, allowed) with ttlib's weights": out}


def _mlp_gelu(m, x):
    return m.down(F.gelu(m.up(x)))


def _pre_norm(b, x, allowed):
    x = x + b.attn(b.ln_1(x), allowed)
    return x + b.mlp(b.ln_2(x))


def _pieces(block_forward=_pre_norm, mlp_forward=_mlp_gelu):
    """An MLP and a Block with the notebook's __init__ and these forwards: a mistake's answer to exercise 2."""

    class MLP(nn.Module):
        def __init__(self, n_embd):
            super().__init__()
            self.up, self.down = nn.Linear(n_embd, 4 * n_embd), nn.Linear(4 * n_embd, n_embd)

        forward = mlp_forward

    class Block(nn.Module):
        def __init__(self, n_embd, n_head):
            super().__init__()
            self.ln_1, self.attn = nn.LayerNorm(n_embd), CausalSelfAttention(n_embd, n_head)
            self.ln_2, self.mlp = nn.LayerNorm(n_embd), MLP(n_embd)

        forward = block_forward

    return {"MLP": MLP, "Block": Block}


def _post_norm(b, x, allowed):
    x = b.ln_1(x + b.attn(x, allowed))
    return b.ln_2(x + b.mlp(x))


def _no_attention_residual(b, x, allowed):
    x = b.attn(b.ln_1(x), allowed)
    return x + b.mlp(b.ln_2(x))


def _no_mlp_residual(b, x, allowed):
    x = x + b.attn(b.ln_1(x), allowed)
    return b.mlp(b.ln_2(x))


def _one_layer_norm(b, x, allowed):
    x = x + b.attn(b.ln_1(x), allowed)
    return x + b.mlp(b.ln_1(x))


def _unmasked(b, x, allowed):
    x = x + b.attn(b.ln_1(x), torch.ones_like(allowed))
    return x + b.mlp(b.ln_2(x))


transformer_block = Exercise(
    id="03-block", number=2, what="your MLP and Block", names=("MLP", "Block"), trial=block_trial, run=run_block,
    reference={"MLP": TTLibMLP, "Block": TTLibBlock},
    forbid=(ttlib_model.Block, ttlib_model.MLP, TrajectoryGPT, _pre_norm, _mlp_gelu), trials=6, hidden_trials=10,
    passed="your block computes ttlib's block.",
    mistakes=[
        Mistake("this is what a post-norm block gives: LayerNorm goes inside the residual branch, before "
                "attention and before the MLP -- x = x + attn(ln_1(x)), then x = x + mlp(ln_2(x)); the stream "
                "itself is never normalized.", _pieces(_post_norm)),
        Mistake("the residual is dropped around attention: x = attn(ln_1(x)) throws the stream away. Add to it: "
                "x = x + attn(ln_1(x), allowed).", _pieces(_no_attention_residual)),
        Mistake("the residual is dropped around the MLP: the block must return x + mlp(ln_2(x)), the stream plus "
                "what the MLP adds to it.", _pieces(_no_mlp_residual)),
        Mistake("the MLP's input is normalized with ln_1: each sub-layer has its own LayerNorm, with its own scale "
                "and shift -- ln_1 before attention, ln_2 before the MLP.", _pieces(_one_layer_norm)),
        Mistake("the attention ignores the mask: pass `allowed` on to self.attn, or tokens see the future and the "
                "value tokens.", _pieces(_unmasked)),
        Mistake("the MLP uses ReLU: ttlib's MLP, like GPT-2's, uses GELU (F.gelu) between up and down.",
                _pieces(mlp_forward=lambda m, x: m.down(F.relu(m.up(x))))),
        Mistake("the MLP has no activation between up and down: two linear layers in a row are just one linear "
                "layer; put F.gelu between them.", _pieces(mlp_forward=lambda m, x: m.down(m.up(x)))),
    ],
)


# ---- exercise 3: the heads ---------------------------------------------------------------------------------------
def heads_trial(rng):
    """Hidden states of a random TrajectoryGPT after its final LayerNorm (what its heads read), fed `start` tokens
    earlier through its cache; its heads; and a small case."""
    obs, act, n_bins, C = int(rng.integers(1, 6)), int(rng.integers(1, 3)), int(rng.integers(2, 30)), 8
    gpt = TrajectoryGPT(GPTConfig(obs_dim=obs, act_dim=act, n_bins=n_bins, n_layer=1, n_head=2, n_embd=C,
                                  n_transitions=3, dropout=0.0)).eval()
    torch.nn.init.normal_(gpt.head_bias)  # non-zero biases, so that a bias mistake shows
    start = int(rng.integers(0, gpt.config.block_size))
    T, B = int(rng.integers(1, gpt.config.block_size - start + 1)), int(rng.integers(1, 4))
    seen = []
    hook = gpt.ln_f.register_forward_hook(lambda module, inputs, output: seen.append(output))
    with torch.no_grad():
        cache = gpt.new_cache(B)
        if start:
            gpt(torch.as_tensor(rng.integers(0, n_bins, size=(B, start))), cache=cache)
        gpt(torch.as_tensor(rng.integers(0, n_bins, size=(B, T))), cache=cache)
    hook.remove()
    small = (torch.randn(1, 5, 2), torch.randn(4, 2, 3), torch.randn(4, 3))
    return seen[-1], gpt.head_weight.detach(), gpt.head_bias.detach(), start, small


def run_heads(answer, trial):
    x, weight, bias, start, (x_small, w_small, b_small) = copy.deepcopy(trial)
    with torch.no_grad():
        return {"heads of 5 positions, td=4, start=2 (position i uses head (2 + i + 1) % 4)":
                answer.heads(x_small, w_small, b_small, 2),
                f"heads(x of shape {tuple(x.shape)}, weight of shape {tuple(weight.shape)}, start={start})":
                answer.heads(x, weight, bias, start)}


def _heads_with(shift=1, with_start=True, with_bias=True, modulo=True):
    def heads(x, weight, bias, start):
        dims = torch.arange(x.shape[1]) + (start if with_start else 0) + shift
        dims = dims % weight.shape[0] if modulo else dims
        return torch.einsum("btc,tck->btk", x, weight[dims]) + (bias[dims] if with_bias else 0)

    return {"heads": heads}


per_position_heads = Exercise(
    id="03-heads", number=3, what="your heads", names=("heads",), trial=heads_trial, run=run_heads,
    reference={"heads": ttlib_heads}, forbid=(TrajectoryGPT, ttlib_heads, lent_heads, _heads_with()["heads"]),
    trials=8, hidden_trials=12,
    passed="your heads give the model's logits.",
    mistakes=[
        Mistake("each position uses its own dimension's head: position start + i predicts the *next* token, of "
                "dimension (start + i + 1) % td, so it uses that head.", _heads_with(shift=0)),
        Mistake("the head index ignores `start`: column i sits at absolute position start + i, so it uses head "
                "(start + i + 1) % td.", _heads_with(with_start=False)),
        Mistake("the bias is missing: each position adds its head's bias, bias[d] of shape (K,), to its logits.",
                _heads_with(with_bias=False)),
        Mistake("the head index is not taken modulo td: there are only td heads, one per dimension, and position "
                "start + i uses head (start + i + 1) % td.", _heads_with(modulo=False)),
    ],
)


# ---- exercise 4: the forward pass --------------------------------------------------------------------------------
def gpt_trial(rng):
    """The weights of a random TrajectoryGPT (LayerNorms and biases random too), a batch of bins shorter than its
    block, and what it feeds its first block and its heads."""
    obs, act, n_bins = int(rng.integers(1, 5)), int(rng.integers(1, 3)), int(rng.integers(2, 20))
    config = GPTConfig(obs_dim=obs, act_dim=act, n_bins=n_bins, n_layer=2, n_head=2,
                       n_embd=2 * int(rng.integers(2, 6)), n_transitions=3, dropout=0.0)
    gpt = randomized(TTLibGPT(config)).eval()
    T = int(rng.integers(1, config.block_size))
    bins = torch.as_tensor(rng.integers(0, n_bins, size=(int(rng.integers(1, 4)), T)))
    final = []
    hook = gpt.ln_f.register_forward_hook(lambda module, inputs, output: final.append(output))
    with torch.no_grad(), watching(block=gpt.blocks[0]) as seen:
        gpt(bins)
    hook.remove()
    return config, gpt.state_dict(), bins, {**seen, "heads": (final[0], 0)}


def run_gpt(answer, trial):
    config, state, bins, ttlibs = copy.deepcopy(trial)
    mine = load_weights(answer.GPT(config), state, "TrajectoryGPT")
    _HEADS_CALLS.clear()
    with torch.no_grad(), watching(block=mine.get_submodule("blocks.0")) as seen:
        logits = mine(bins)
    first = seen.get("block", ttlibs["block"])  # what a part the answer did not call was fed is not compared
    heads_call = _HEADS_CALLS[-1] if _HEADS_CALLS else ttlibs["heads"]
    _HEADS_CALLS.clear()
    return {"what your GPT feeds its first Block (tok_emb(token ids) + pos_emb[:T])": argument(first, 0, "x"),
            "the mask your GPT gives its first Block": argument(first, 1, "allowed"),
            "what your GPT gives heads (ln_f of the last Block's output)": heads_call[0],
            "the start your GPT gives heads": heads_call[1],
            f"your GPT(bins of shape {tuple(bins.shape)})'s logits": logits}


class GivenGPT(nn.Module):
    """The notebook's GPT with its given __init__ (on ttlib's Block), for the mistakes' forwards."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        td, C, K = config.transition_dim, config.n_embd, config.n_bins
        self.tok_emb = nn.Embedding(td * K, C)
        self.pos_emb = nn.Parameter(torch.zeros(config.block_size, C))
        self.blocks = nn.ModuleList([TTLibBlock(C, config.n_head) for _ in range(config.n_layer)])
        self.ln_f = nn.LayerNorm(C)
        self.head_weight = nn.Parameter(torch.zeros(td, C, K))
        self.head_bias = nn.Parameter(torch.zeros(td, K))
        self.register_buffer("allowed", trajectory_mask(config.block_size, td), persistent=False)


def _gpt_with(positions="first", offsets=True, mask="first", final_norm=True, chained=True):
    """A GPT whose forward makes one of the mistakes (the rest as the notebook's solution)."""

    def forward(self, bins):
        B, T = bins.shape
        ids = lent_token_ids(bins, 0, self.config.transition_dim, self.config.n_bins) if offsets else bins
        position = {"first": self.pos_emb[:T], "last": self.pos_emb[-T:], None: 0}[positions]
        x = self.tok_emb(ids) + position  # (B, T, C)
        allowed = {"first": self.allowed[:T, :T], "last": self.allowed[-T:, -T:], None: self.allowed}[mask]
        h = x
        for block in self.blocks:
            h = block(h if chained else x, allowed)
        return lent_heads(self.ln_f(h) if final_norm else h, self.head_weight, self.head_bias, 0)

    return {"GPT": type("GPT", (GivenGPT,), {"forward": forward})}


forward_pass = Exercise(
    id="03-gpt", number=4, what="your GPT", names=("GPT",), trial=gpt_trial, run=run_gpt,
    reference={"GPT": TTLibGPT}, lends={"token_ids": lent_token_ids, "Block": TTLibBlock, "heads": lent_heads},
    forbid=(TrajectoryGPT, TTLibGPT, _gpt_with()["GPT"]), trials=6, hidden_trials=10,
    passed="your GPT computes ttlib's TrajectoryGPT.",
    mistakes=[
        Mistake("the position embeddings are counted from the end (pos_emb[-T:]): a window's first token sits at "
                "position 0, so it gets pos_emb[0] -- add pos_emb[:T].", _gpt_with(positions="last")),
        Mistake("the position embeddings are missing: attention does not see order, so add pos_emb[:T] to the "
                "token embeddings.", _gpt_with(positions=None)),
        Mistake("the final LayerNorm is missing: the heads read ln_f(x), the last block's output normalized.",
                _gpt_with(final_norm=False)),
        Mistake("the mask is cut at the wrong corner: a window starts at position 0, so its tokens' rules are the "
                "mask's first rows and columns, allowed[:T, :T].", _gpt_with(mask="last")),
        Mistake("the mask is not cut to the window: a window of T tokens needs the (T, T) corner allowed[:T, :T] "
                "of the (block_size, block_size) mask.", _gpt_with(mask=None)),
        Mistake("the bins are embedded without their dimension's offset: embed token_ids(bins, 0, transition_dim, "
                "n_bins), so that bin 7 of one dimension is not bin 7 of another.", _gpt_with(offsets=False)),
        Mistake("every block reads the embeddings: the blocks are a stack, each reads the previous one's output "
                "(x = block(x, allowed)).", _gpt_with(chained=False)),
    ],
)


EXERCISES = [token_offsets, transformer_block, per_position_heads, forward_pass, training_loss, lr_schedule]
