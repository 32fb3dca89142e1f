"""Wrong answers to notebook 03's exercises (see tests/test_exercises.py for the format)."""

REFUSED = "refuses to run"  # what a delegating answer's failure says (ttlib.exercises.refuse)
NOT_OWN = "not from this notebook"  # what an imported copy's failure says (ttlib.exercises: Exercise._own_code)


def imported(source: str, name: str) -> str:
    """An answer that runs a copy of the solution in a module of its own and imports the function from it."""
    return f'''import types

solutions = types.ModuleType("solutions")
exec({source!r}, solutions.__dict__)
{name} = solutions.{name}
'''


TOKEN_IDS = '''import torch


def token_ids(bins, start, transition_dim, n_bins):
    positions = torch.arange(start, start + bins.shape[1])
    return bins + (positions % transition_dim) * n_bins
'''

ANSWERS = [
    # exercise 1: token ids
    ("03-token-ids", "offsets from the column, ignoring start",
     ("torch.arange(start, start + bins.shape[1], device=bins.device)",
      "torch.arange(bins.shape[1], device=bins.device)"), "the offsets ignore `start`"),
    ("03-token-ids", "dimension off by one (the next token's)",
     ("(positions % transition_dim) * n_bins", "((positions + 1) % transition_dim) * n_bins"),
     "gets the *next* token's dimension"),
    ("03-token-ids", "delegates to the offsets of ttlib's model", '''def token_ids(bins, start, transition_dim, n_bins):
    T = bins.shape[1]
    config = GPTConfig(obs_dim=transition_dim - 3, act_dim=1, n_bins=n_bins, n_layer=1, n_head=1, n_embd=4,
                       n_transitions=(start + T) // transition_dim + 1)
    return bins + ttlib.model.gpt.TrajectoryGPT(config).token_offset[start:start + T]
''', REFUSED),
    ("03-token-ids", "a copy of the solution imported from a module", imported(TOKEN_IDS, "token_ids"), NOT_OWN),
    # not in the first catalogue
    ("03-token-ids", "no modulo: the offset grows with the position",
     ("(positions % transition_dim) * n_bins", "positions * n_bins"), "is not taken modulo transition_dim"),
    ("03-token-ids", "transition_dim and n_bins swapped",
     ("(positions % transition_dim) * n_bins", "(positions % n_bins) * transition_dim"), "are swapped"),
    # no diagnosis fits: the message says where the answer first differs
    ("03-token-ids", "float token ids", ("return bins + (positions % transition_dim) * n_bins",
                                          "return (bins + (positions % transition_dim) * n_bins).float()"),
     "the dtype of your token ids"),
    # exercise 2: the block
    ("03-block", "post-norm instead of pre-norm",
     ("""        x = x + self.attn(self.ln_1(x), allowed)  # (B, T, C): gather from earlier tokens
        x = x + self.mlp(self.ln_2(x))  # (B, T, C): then think about each token on its own""",
      """        x = self.ln_1(x + self.attn(x, allowed))
        x = self.ln_2(x + self.mlp(x))"""), "a post-norm block"),
    ("03-block", "no residual around attention",
     ("x = x + self.attn(self.ln_1(x), allowed)", "x = self.attn(self.ln_1(x), allowed)"),
     "the residual is dropped around attention"),
    ("03-block", "one LayerNorm for both sub-layers", ("self.mlp(self.ln_2(x))", "self.mlp(self.ln_1(x))"),
     "normalized with ln_1"),
    ("03-block", "ReLU instead of GELU in the MLP", ("self.down(F.gelu(self.up(x)))", "self.down(F.relu(self.up(x)))"),
     "the MLP uses ReLU"),
    ("03-block", "attention without the trajectory mask",
     ("self.attn(self.ln_1(x), allowed)",
      "self.attn(self.ln_1(x), torch.ones_like(allowed))"), "the attention ignores the mask"),
    ("03-block", "delegates to ttlib's Block and MLP",
     ("""        x = x + self.attn(self.ln_1(x), allowed)  # (B, T, C): gather from earlier tokens
        x = x + self.mlp(self.ln_2(x))  # (B, T, C): then think about each token on its own
        return x""", """        return ttlib.model.gpt.Block.forward(self, x, allowed)"""), REFUSED),
    ("03-block", "inherits ttlib's Block", '''class MLP(ttlib.model.gpt.MLP):
    def __init__(self, n_embd):
        super().__init__(n_embd, dropout=0.0)


class Block(ttlib.model.gpt.Block):
    def __init__(self, n_embd, n_head):
        super().__init__(GPTConfig(obs_dim=1, act_dim=1, n_embd=n_embd, n_head=n_head, dropout=0.0))
''', REFUSED),
    # not in the first catalogue
    ("03-block", "no residual around the MLP", ("x = x + self.mlp(self.ln_2(x))", "x = self.mlp(self.ln_2(x))"),
     "the residual is dropped around the MLP"),
    ("03-block", "no activation in the MLP", ("self.down(F.gelu(self.up(x)))", "self.down(self.up(x))"),
     "no activation between up and down"),
    ("03-block", "an extra LayerNorm in __init__ (ttlib's weights do not fit)",
     ("self.mlp = MLP(n_embd)", "self.mlp = MLP(n_embd)\n        self.ln_3 = nn.LayerNorm(n_embd)"),
     "unexpected in yours: ln_3.weight, ln_3.bias"),
    # no diagnosis fits: the message says where the answer first differs
    ("03-block", "GELU after down, not between up and down",
     ("self.down(F.gelu(self.up(x)))", "F.gelu(self.down(self.up(x)))"), "MLP(x) with ttlib's weights: "),
    # exercise 3: the heads
    ("03-heads", "each position uses its own dimension's head, not the next token's",
     ("+ start + 1) % td", "+ start) % td"), "each position uses its own dimension's head"),
    ("03-heads", "heads indexed by position in the window, ignoring start",
     ("+ start + 1) % td", "+ 1) % td"), "the head index ignores `start`"),
    ("03-heads", "no bias", (" + bias[dims]  # (B, T, K)", "  # (B, T, K)"), "the bias is missing"),
    ("03-heads", "delegates to ttlib's model (its heads, on these hidden states)", '''def heads(x, weight, bias, start):
    td, C, K = weight.shape
    B, T, _ = x.shape
    model = TrajectoryGPT(GPTConfig(obs_dim=td - 3, act_dim=1, n_bins=K, n_layer=1, n_head=1, n_embd=C,
                                    n_transitions=(start + T) // td + 1, dropout=0.0)).eval()
    model.head_weight.data, model.head_bias.data = weight, bias
    with torch.no_grad():
        cache = model.new_cache(B)
        if start:
            model(torch.zeros(B, start, dtype=torch.long), cache=cache)
        model.ln_f.register_forward_hook(lambda module, inputs, output: x)  # its heads on your hidden states
        return model(torch.zeros(B, T, dtype=torch.long), cache=cache)[0]
''', REFUSED),
    # not in the first catalogue
    ("03-heads", "no modulo: head indices past td", (" % td  # (T,)", "  # (T,)"), "not taken modulo td"),
    # no diagnosis fits: the message says where the answer first differs
    ("03-heads", "probabilities instead of logits",
     ('return torch.einsum("btc,tck->btk", x, weight[dims]) + bias[dims]  # (B, T, K)',
      'return torch.softmax(torch.einsum("btc,tck->btk", x, weight[dims]) + bias[dims], dim=-1)'),
     "heads of 5 positions, td=4, start=2"),
    # exercise 4: the forward pass
    ("03-gpt", "position embeddings counted from the end",
     ("self.pos_emb[:T]", "self.pos_emb[-T:]"), "counted from the end"),
    ("03-gpt", "no position embeddings", (" + self.pos_emb[:T]  # (B, T, C)", "  # (B, T, C)"),
     "the position embeddings are missing"),
    ("03-gpt", "no final LayerNorm", ("heads(self.ln_f(x), ", "heads(x, "), "the final LayerNorm is missing"),
    ("03-gpt", "the mask cut at the wrong corner",
     ("self.allowed[:T, :T]", "self.allowed[-T:, -T:]"), "cut at the wrong corner"),
    ("03-gpt", "bins embedded without their dimension's offset",
     ("x = self.tok_emb(ids) + self.pos_emb[:T]", "x = self.tok_emb(bins) + self.pos_emb[:T]"),
     "without their dimension's offset"),
    ("03-gpt", "delegates to ttlib's TrajectoryGPT.forward",
     ("""        B, T = bins.shape
        ids = token_ids""",
      """        model = ttlib.model.gpt.TrajectoryGPT(self.config).eval()  # ttlib's model, with these weights
        model.load_state_dict(self.state_dict())
        return model(bins)[0]
        ids = token_ids"""), REFUSED),
    # not in the first catalogue
    ("03-gpt", "every block reads the embeddings (blocks not chained)",
     ("""            x = block(x, self.allowed[:T, :T])  # (B, T, C)
        return heads(self.ln_f(x), """, """            h = block(x, self.allowed[:T, :T])  # (B, T, C)
        return heads(self.ln_f(h), """), "every block reads the embeddings"),
    ("03-gpt", "the whole mask, not cut to the window", ("self.allowed[:T, :T]", "self.allowed"),
     "the mask is not cut to the window"),
    # exercise 5: the loss
    ("03-loss", "each target weighted by the input's dimension, not the target's",
     ("(torch.arange(T, device=logits.device) + 1)", "(torch.arange(T, device=logits.device))"),
     "the dimension of the token *before* it"),
    ("03-loss", "divided by the sum of weights, not the number of real targets",
     ("/ mask.sum().clamp(min=1)", "/ (weight * mask).sum().clamp(min=1)"), "divided by the sum of the weights"),
    ("03-loss", "padding not masked out", ("(ce * weight * mask).sum()", "(ce * weight).sum()"),
     "padding counts in the loss"),
    ("03-loss", "a copy of the solution imported from a module", imported('''import torch
import torch.nn.functional as F


def weighted_cross_entropy(logits, targets, mask, dim_weight):
    B, T, K = logits.shape
    ce = F.cross_entropy(logits.reshape(B * T, K), targets.reshape(B * T), reduction="none").view(B, T)
    dims = (torch.arange(T) + 1) % dim_weight.shape[0]
    return (ce * dim_weight[dims][None, :] * mask).sum() / mask.sum().clamp(min=1)
''', "weighted_cross_entropy"), NOT_OWN),
    # not in the first catalogue
    ("03-loss", "no clamp: an all-padding batch gives NaN", ("/ mask.sum().clamp(min=1)", "/ mask.sum()"),
     "gives 0 / 0 = NaN"),
    ("03-loss", "divided by every position, padding included", ("/ mask.sum().clamp(min=1)", "/ (B * T)"),
     "divided by every position"),
    # no diagnosis fits: the message says where the answer first differs
    ("03-loss", "returns a Python float (.item()): no gradient for training",
     ("return (ce * weight * mask).sum() / mask.sum().clamp(min=1)",
      "return ((ce * weight * mask).sum() / mask.sum().clamp(min=1)).item()"), "gradients flow through"),
    # exercise 6: the schedule
    ("03-lr", "warmup off by one (0 at the first step)",
     ("lr * (step + 1) / warmup_steps", "lr * step / warmup_steps"), "the warmup starts at 0"),
    ("03-lr", "cosine not clamped after the last step",
     ("min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))",
      "(step - warmup_steps) / max(1, total_steps - warmup_steps)"), "climbs back up"),
    ("03-lr", "delegates to ttlib.training.train.learning_rate",
     '''def learning_rate(step, warmup_steps, total_steps, lr, min_lr):
    config = train.TrainConfig(steps=total_steps, warmup_steps=warmup_steps, lr=lr, min_lr=min_lr)
    return train.learning_rate(step, config)
''', REFUSED),
    # not in the first catalogue
    ("03-lr", "the cosine decays to 0, not to min_lr",
     ("return min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * progress))",
      "return 0.5 * lr * (1 + math.cos(math.pi * progress))"), "the cosine decays to 0"),
    ("03-lr", "the cosine's progress counted from step 0",
     ("(step - warmup_steps) / max(1, total_steps - warmup_steps)", "step / max(1, total_steps)"),
     "counts from step 0"),
    # no diagnosis fits: the message says where the answer first differs
    ("03-lr", "a linear decay instead of the cosine",
     ("min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * progress))", "lr - (lr - min_lr) * progress"),
     "(the cosine)"),
]
