"""The Trajectory GPT: a small GPT over trajectory tokens (Janner et al., 2021).

Three things set it apart from a text GPT:
1. Per-dimension vocabularies. Bin 7 of "height" and bin 7 of "torque" are different tokens: the embedding
   table has transition_dim * n_bins rows and a token's row is bin + dimension * n_bins. The dimension of a
   token follows from its position (position % transition_dim), so the model takes bins and adds the offset.
2. The value rule. The value token V_t summarises the *future* rewards of the data-collecting policy; if later
   tokens could attend to it, the model would learn to read the future off the dataset. So no token attends to
   any value token -- in training, in full decoding and in cached decoding alike.
3. One output head per position in the transition (head d predicts dimension d), applied to all positions at
   once with one batched matmul, and a loss that weights action tokens 5x (obs 1, action 5, reward 1, value 1).

`forward` serves training (full windows), planning's prefix pass, and cached decoding one token at a time.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parametrize

from ttlib.errors import ConfigError, MismatchError
from ttlib.model.attention import CausalSelfAttention, KVCache

__all__ = ["BinValues", "Block", "GPTConfig", "KINDS", "MLP", "TrajectoryGPT", "check_dims", "smoothed_targets",
           "trajectory_mask"]

KINDS = ("obs", "action", "reward", "value")  # what a token is (training logs the validation loss of each)


@dataclass
class GPTConfig:
    obs_dim: int = 0  # observation dimensions per transition (0 in a training config: the data decide)
    act_dim: int = 0  # action dimensions per transition (0 in a training config: the data decide)
    n_bins: int = 100  # bins (vocabulary size) per dimension
    n_layer: int = 4  # transformer blocks
    n_head: int = 4  # attention heads per block
    n_embd: int = 128  # width of the residual stream
    n_transitions: int = 10  # context the model is trained on, in transitions
    dropout: float = 0.1  # dropout on embeddings, attention weights and residual branches (training only)
    action_weight: float = 5.0  # loss weight of action tokens (obs, reward, value: 1)
    reward_weight: float = 1.0  # loss weight of reward tokens
    value_weight: float = 1.0  # loss weight of value tokens
    action_smoothing: float = 0.0  # training only: an action token's target is a Gaussian over its neighbouring bins
    #                                with this standard deviation, in bins, instead of its bin alone (0: the bin)
    value_embedding: bool = False  # a token's embedding also carries what its bin holds: a learned direction per
    #                               dimension times the bin's standardised value (BinValues)

    @property
    def transition_dim(self) -> int:
        return self.obs_dim + self.act_dim + 2

    @property
    def block_size(self) -> int:
        """Longest input: a window of n_transitions minus the last token (which is only ever a target)."""
        return self.n_transitions * self.transition_dim - 1


class MLP(nn.Module):
    def __init__(self, n_embd: int, dropout: float):
        super().__init__()
        self.up = nn.Linear(n_embd, 4 * n_embd)
        self.down = nn.Linear(4 * n_embd, n_embd)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.dropout(self.down(F.gelu(self.up(x))))


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd)
        self.attn = CausalSelfAttention(config.n_embd, config.n_head, config.dropout)
        self.ln_2 = nn.LayerNorm(config.n_embd)
        self.mlp = MLP(config.n_embd, config.dropout)

    def forward(self, x, allowed, cache=None, layer=0):
        x = x + self.attn(self.ln_1(x), allowed, cache, layer)
        return x + self.mlp(self.ln_2(x))


def check_dims(config) -> None:
    """A model needs its data's dimensions; a training config leaves them 0 until training reads the data."""
    if config.obs_dim < 1 or config.act_dim < 1:
        raise ConfigError(f"{type(config).__name__} needs obs_dim and act_dim of at least 1, got {config.obs_dim} and "
                          f"{config.act_dim}: set them from the data (train() does)")


def smoothed_targets(n_bins: int, std: float) -> torch.Tensor:
    """(n_bins, n_bins): row b is a Gaussian over the bins centred on bin b with standard deviation `std` (in bins),
    cut at the ends and summing to 1; the identity for std 0. Neighbouring quantile bins hold neighbouring values,
    so a near miss then costs less than a far one ("Stop Regressing", Farebrother et al. 2024)."""
    if std == 0:
        return torch.eye(n_bins)
    bins = torch.arange(n_bins, dtype=torch.float32)
    weights = torch.exp(-0.5 * ((bins[None, :] - bins[:, None]) / std) ** 2)  # (n_bins, n_bins)
    return weights / weights.sum(dim=1, keepdim=True)


class BinValues(nn.Module):
    """What GPTConfig.value_embedding adds to the token embeddings (a parametrization of tok_emb.weight, so every
    reader of the table -- training, the cached and the fused decoders -- sees the same rows): the row of bin b of
    dimension d is its own learned vector plus v[d, b] * direction[d], where v is what the bin decodes to,
    standardised per dimension (`set_bin_values`), and direction[d] is learned, starting at zero. Neighbouring
    bins hold neighbouring values, so what the model learns about one bin's value carries over to its neighbours
    from the first step, instead of being learned one bin at a time."""

    def __init__(self, transition_dim: int, n_bins: int, n_embd: int):
        super().__init__()
        self.register_buffer("values", torch.zeros(transition_dim, n_bins))  # (td, N): standardised bin values
        self.direction = nn.Parameter(torch.zeros(transition_dim, n_embd))  # (td, C): one per dimension

    def forward(self, weight):  # (td * N, C) the learned rows -> the rows the model reads
        td, N = self.values.shape
        return weight + (self.values[:, :, None] * self.direction[:, None, :]).reshape(td * N, -1)


def trajectory_mask(n_tokens: int, transition_dim: int) -> torch.Tensor:
    """(n_tokens, n_tokens) bool, query x key: causal, and no query ever attends to a value token (the last of each
    transition), because a value summarises rewards that come later."""
    is_value = torch.arange(n_tokens) % transition_dim == transition_dim - 1  # (n_tokens,)
    causal = torch.tril(torch.ones(n_tokens, n_tokens, dtype=torch.bool))
    return causal & ~is_value[None, :]


class TrajectoryGPT(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        check_dims(config)
        self.config = config
        td, C = config.transition_dim, config.n_embd
        self.tok_emb = nn.Embedding(td * config.n_bins, C)  # one vocabulary slice per dimension
        self.pos_emb = nn.Parameter(torch.zeros(config.block_size, C))  # learned absolute positions
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList([Block(config) for _ in range(config.n_layer)])
        self.ln_f = nn.LayerNorm(C)
        self.head_weight = nn.Parameter(torch.empty(td, C, config.n_bins))  # head d predicts dimension d
        self.head_bias = nn.Parameter(torch.zeros(td, config.n_bins))

        positions = torch.arange(config.block_size)
        allowed = trajectory_mask(config.block_size, td)
        self.register_buffer("allowed", allowed, persistent=False)  # (T, T) query x key
        self.register_buffer("token_offset", (positions % td) * config.n_bins, persistent=False)  # (block_size,)
        weights = torch.ones(td)
        weights[config.obs_dim:config.obs_dim + config.act_dim] = config.action_weight
        weights[td - 2], weights[td - 1] = config.reward_weight, config.value_weight
        self.register_buffer("dim_weight", weights, persistent=False)  # (td,) loss weight per dimension
        if config.action_smoothing < 0:
            raise ConfigError(f"action_smoothing must be >= 0 (a standard deviation in bins), got "
                              f"{config.action_smoothing}")
        self.register_buffer("smoothed_targets", smoothed_targets(config.n_bins, config.action_smoothing),
                             persistent=False)  # (n_bins, n_bins): row b is the target of bin b
        self.apply(self._init_weights)
        nn.init.normal_(self.pos_emb, std=0.02)
        nn.init.normal_(self.head_weight, std=0.02)
        if config.value_embedding:
            parametrize.register_parametrization(self.tok_emb, "weight", BinValues(td, config.n_bins, C))

    def set_bin_values(self, means) -> None:
        """With value_embedding: the values the bins carry, (transition_dim, n_bins) -- what each bin decodes to
        (`TrajectoryTokenizer.means`), standardised per dimension here (a dimension with one value carries 0)."""
        if not self.config.value_embedding:
            raise ConfigError("set_bin_values needs a model with value_embedding=True")
        values = torch.as_tensor(means, dtype=torch.float64)  # (td, N)
        if values.shape != (self.config.transition_dim, self.config.n_bins):
            raise MismatchError(f"bin values must be (transition_dim, n_bins) = "
                                f"{(self.config.transition_dim, self.config.n_bins)}, got {tuple(values.shape)}")
        spread = values.std(dim=1, keepdim=True)
        standard = torch.where(spread > 0, (values - values.mean(dim=1, keepdim=True)) / spread.clamp_min(1e-12), 0.0)
        bin_values = self.tok_emb.parametrizations.weight[0].values
        bin_values.copy_(standard.to(bin_values.dtype))

    @staticmethod
    def _init_weights(module):
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=0.02)
            nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, std=0.02)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def new_cache(self, batch: int, capacity: int | None = None) -> KVCache:
        """An empty KV cache for `batch` rows, long enough for the whole block by default."""
        c = self.config
        p = self.pos_emb
        return KVCache(c.n_layer, batch, c.n_head, c.n_embd // c.n_head, capacity or c.block_size,
                       dtype=p.dtype, device=p.device)

    def forward(self, bins, targets=None, mask=None, cache: KVCache | None = None, last_only: bool = False):
        """bins (B, T) in [0, n_bins) -> logits (B, T, n_bins) (or (B, 1, n_bins) with last_only), loss.

        The first input token sits at absolute position `cache.position` (0 without a cache). targets (B, T)
        are the next tokens' bins; mask (B, T) is 1 where a target is real and 0 on padding.
        """
        B, T = bins.shape
        td = self.config.transition_dim
        start = cache.position if cache is not None else 0
        if start + T > self.config.block_size:
            raise MismatchError(f"sequence of {start + T} tokens exceeds the model's block size "
                                f"{self.config.block_size} ({self.config.n_transitions} transitions)")
        positions = slice(start, start + T)
        x = self.tok_emb(bins + self.token_offset[positions]) + self.pos_emb[positions]  # (B, T, C)
        x = self.drop(x)
        allowed = self.allowed[positions, :start + T]  # (T, start+T): causal and never a value token
        for layer, block in enumerate(self.blocks):
            x = block(x, allowed, cache, layer)
        if cache is not None:
            cache.advance(T)
        x = self.ln_f(x)  # (B, T, C)

        if last_only:  # planning only needs the next token's distribution
            dim = (start + T) % td  # dimension of the token that comes next
            logits = x[:, -1:] @ self.head_weight[dim] + self.head_bias[dim]  # (B, 1, n_bins)
            return logits, None

        # every position's head at once: pad to whole transitions, then one batched matmul per dimension
        first = (start + 1) % td  # dimension predicted at the first position
        n = -(-(first + T) // td) * td  # round up to whole transitions
        padded = x.new_zeros(B, n, x.shape[-1])
        padded[:, first:first + T] = x
        padded = padded.view(B, n // td, td, -1)  # (B, K, td, C)
        logits = torch.einsum("bktc,tcn->bktn", padded, self.head_weight) + self.head_bias  # (B, K, td, n_bins)
        logits = logits.reshape(B, n, -1)[:, first:first + T]  # (B, T, n_bins)

        loss = None
        if targets is not None:
            ce = F.cross_entropy(logits.reshape(B * T, -1), targets.reshape(B * T), reduction="none").view(B, T)
            target_dims = (torch.arange(start + 1, start + T + 1, device=bins.device)) % td  # (T,)
            if self.training and self.config.action_smoothing > 0:  # action targets spread over their neighbours
                O, A = self.config.obs_dim, self.config.act_dim
                is_action = (target_dims >= O) & (target_dims < O + A)  # (T,)
                spread = -(self.smoothed_targets[targets] * F.log_softmax(logits, -1)).sum(-1)  # (B, T)
                ce = torch.where(is_action[None, :], spread, ce)
            weight = self.dim_weight[target_dims][None, :]  # (1, T)
            mask = torch.ones_like(ce) if mask is None else mask.to(ce.dtype)
            loss = (ce * weight * mask).sum() / mask.sum().clamp(min=1)
        return logits, loss

    def target_kinds(self, T: int) -> torch.Tensor:
        """(T,) what each of T training targets is, an index into KINDS: the target at position t is token t + 1
        of a window that starts with a transition."""
        c = self.config
        dims = torch.arange(1, T + 1, device=self.pos_emb.device) % c.transition_dim  # (T,)
        kinds = (dims >= c.obs_dim).long() + (dims >= c.obs_dim + c.act_dim).long()  # obs 0, action 1, reward 2
        return kinds + (dims == c.transition_dim - 1).long()  # value 3

    # ---- optimisation -------------------------------------------------------------------------------------
    def optimizer_groups(self, weight_decay: float):
        """AdamW groups: decay matrices (linear weights, heads); never biases, LayerNorms, embeddings."""
        decay, no_decay = [], []
        for name, p in self.named_parameters():
            is_matrix = (name.endswith("weight") and p.dim() >= 2 and "emb" not in name)
            (decay if is_matrix else no_decay).append(p)
        return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]

    def config_dict(self) -> dict:
        return asdict(self.config)
