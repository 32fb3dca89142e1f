"""Wrong answers to notebook 03's exercises (see tests/test_exercises.py for the format)."""

REFUSED = "refuses to run"  # what a delegating answer's failure says (ttlib.checks.forbidding)
NOT_OWN = "not from this notebook"  # what an imported copy's failure says (ttlib.checks.check_own_code)


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
      "torch.arange(bins.shape[1], device=bins.device)")),
    ("03-token-ids", "dimension off by one (the next token's)",
     ("(positions % transition_dim) * n_bins", "((positions + 1) % transition_dim) * n_bins")),
    ("03-token-ids", "delegates to the offsets of ttlib's model", '''def token_ids(bins, start, transition_dim, n_bins):
    T = bins.shape[1]
    config = GPTConfig(obs_dim=transition_dim - 3, act_dim=1, n_bins=n_bins, n_layer=1, n_head=1, n_embd=4,
                       n_transitions=(start + T) // transition_dim + 1)
    return bins + ttlib.model.TrajectoryGPT(config).token_offset[start:start + T]
''', REFUSED),
    ("03-token-ids", "a copy of the solution imported from a module", imported(TOKEN_IDS, "token_ids"), NOT_OWN),
    # exercise 2: the block
    ("03-block", "post-norm instead of pre-norm",
     ("""        x = x + self.attn(self.ln_1(x), allowed)  # (B, T, C): gather from earlier tokens
        x = x + self.mlp(self.ln_2(x))  # (B, T, C): then think about each token on its own""",
      """        x = self.ln_1(x + self.attn(x, allowed))
        x = self.ln_2(x + self.mlp(x))""")),
    ("03-block", "no residual around attention",
     ("x = x + self.attn(self.ln_1(x), allowed)", "x = self.attn(self.ln_1(x), allowed)")),
    ("03-block", "one LayerNorm for both sub-layers", ("self.mlp(self.ln_2(x))", "self.mlp(self.ln_1(x))")),
    ("03-block", "ReLU instead of GELU in the MLP", ("self.down(F.gelu(self.up(x)))", "self.down(F.relu(self.up(x)))")),
    ("03-block", "attention without the trajectory mask",
     ("self.attn(self.ln_1(x), allowed)",
      "self.attn(self.ln_1(x), torch.ones_like(allowed))")),
    ("03-block", "delegates to ttlib's Block and MLP",
     ("""        x = x + self.attn(self.ln_1(x), allowed)  # (B, T, C): gather from earlier tokens
        x = x + self.mlp(self.ln_2(x))  # (B, T, C): then think about each token on its own
        return x""", """        return ttlib.model.Block.forward(self, x, allowed)"""), REFUSED),
    ("03-block", "inherits ttlib's Block", '''class MLP(ttlib.model.MLP):
    def __init__(self, n_embd):
        super().__init__(n_embd, dropout=0.0)


class Block(ttlib.model.Block):
    def __init__(self, n_embd, n_head):
        super().__init__(GPTConfig(obs_dim=1, act_dim=1, n_embd=n_embd, n_head=n_head, dropout=0.0))
''', REFUSED),
    # exercise 3: the heads
    ("03-heads", "each position uses its own dimension's head, not the next token's",
     ("+ start + 1) % td", "+ start) % td")),
    ("03-heads", "heads indexed by position in the window, ignoring start",
     ("+ start + 1) % td", "+ 1) % td")),
    ("03-heads", "no bias", (" + bias[dims]  # (B, T, K)", "  # (B, T, K)")),
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
    # exercise 4: the forward pass
    ("03-gpt", "position embeddings counted from the end",
     ("self.pos_emb[:T]", "self.pos_emb[-T:]")),
    ("03-gpt", "no position embeddings", (" + self.pos_emb[:T]  # (B, T, C)", "  # (B, T, C)")),
    ("03-gpt", "no final LayerNorm", ("heads(self.ln_f(x), ", "heads(x, ")),
    ("03-gpt", "the mask cut at the wrong corner",
     ("self.allowed[:T, :T]", "self.allowed[-T:, -T:]")),
    ("03-gpt", "bins embedded without their dimension's offset",
     ("x = self.tok_emb(ids) + self.pos_emb[:T]", "x = self.tok_emb(bins) + self.pos_emb[:T]")),
    ("03-gpt", "delegates to ttlib's TrajectoryGPT.forward",
     ("""        B, T = bins.shape
        ids = token_ids""",
      """        model = ttlib.model.TrajectoryGPT(self.config).eval()  # ttlib's model, with these weights
        model.load_state_dict(self.state_dict())
        return model(bins)[0]
        ids = token_ids"""), REFUSED),
    # exercise 5: the loss
    ("03-loss", "each target weighted by the input's dimension, not the target's",
     ("(torch.arange(T, device=logits.device) + 1)", "(torch.arange(T, device=logits.device))")),
    ("03-loss", "divided by the sum of weights, not the number of real targets",
     ("/ mask.sum().clamp(min=1)", "/ (weight * mask).sum().clamp(min=1)")),
    ("03-loss", "padding not masked out", ("(ce * weight * mask).sum()", "(ce * weight).sum()")),
    ("03-loss", "a copy of the solution imported from a module", imported('''import torch
import torch.nn.functional as F


def weighted_cross_entropy(logits, targets, mask, dim_weight):
    B, T, K = logits.shape
    ce = F.cross_entropy(logits.reshape(B * T, K), targets.reshape(B * T), reduction="none").view(B, T)
    dims = (torch.arange(T) + 1) % dim_weight.shape[0]
    return (ce * dim_weight[dims][None, :] * mask).sum() / mask.sum().clamp(min=1)
''', "weighted_cross_entropy"), NOT_OWN),
    # exercise 6: the schedule
    ("03-lr", "warmup off by one (0 at the first step)",
     ("lr * (step + 1) / warmup_steps", "lr * step / warmup_steps")),
    ("03-lr", "cosine not clamped after the last step",
     ("min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))",
      "(step - warmup_steps) / max(1, total_steps - warmup_steps)")),
    ("03-lr", "delegates to ttlib.train.learning_rate",
     '''def learning_rate(step, warmup_steps, total_steps, lr, min_lr):
    config = train.TrainConfig(steps=total_steps, warmup_steps=warmup_steps, lr=lr, min_lr=min_lr)
    return train.learning_rate(step, config)
''', REFUSED),
]
