"""The planner with static shapes: every decoding step the same kernels on the same tensors, ready to replay.

`planning.beam_plan` with the fused decoder decides, for every token, in Python, where the token goes in the cache,
how many slots to read and which rows see what. That is cheap on a CPU, and on a GPU it is the whole cost: about a
hundred kernel launches a token, each waiting on the host. This module makes the same search out of a few *units*
of work whose shapes never change, so that each can be recorded once as a CUDA graph and replayed
(`graphs.CUDAGraphs`), with nothing between a plan's first token and its chosen action waiting on the host:

    start     the model over every environment's context, once; W identical beams per environment
    expand    every beam becomes X children (they share its cache row) and samples its first action
    step      one token for every row: the model, then the next token -- sampled from the plan's uniforms,
              or the likeliest bin -- written into the plan, and the expected reward read off where one is due
    select    score the children, keep the best W per environment, gather them and their cache rows
    finish    the best plan of every environment

What changes from one token to the next is read from tensors: the token counter `k` indexes a schedule made once
per plan shape (`plan_schedule`: each token's cache slot, the slots it may see, whether the next token is sampled
or the likeliest bin, where it goes in the plan); the position is `p0 + k`. The cache has the plan's full size:

    context  (L, heads*E, D, Kc) keys, (L, heads*E, Kc, D) values: the longest context the planner expects
             (config.context transitions), its value tokens left out; a shorter one's padding is masked
    past     (L, 2, heads, E*W, S, D) per beam row, twice (a selection gathers the survivors into the other one), laid
             out as `fast_decoder.FusedDecoder` lays it out: a step's X children share their beam's row and write
             their tokens side by side after its past, the selection moves each survivor's own tokens together,
             and a value token goes to the last slot, which nobody sees (the value rule)
    seen     (tokens, X, S) bool: which past slots child c sees at token k -- its beam's past and its own
             tokens, never a sibling's; added to the scores as 0 or -inf

Masked slots get weight exactly 0, so the plan is the fused decoder's, token for token in float64
(tests/test_static_decoder.py). Run eagerly (`graphs.Eager`, the CPU) the steps read only the slots in use.
"""

from __future__ import annotations

from dataclasses import astuple
from functools import partial

import torch
import torch.nn.functional as F

from ttlib.errors import MismatchError
from ttlib.planning.fast_decoder import BufferPool, LayerWeights, min_slots, norm_args
from ttlib.planning.graphs import CUDAGraphs, Eager, compiled
from ttlib.planning.search import Plan, best_children, counter_uniform, decode_plan, sample_bins

__all__ = ["COLUMN", "REWARD", "Rows", "SAMPLE", "SLOT", "StaticPlanner", "UNIFORM", "generated_length",
           "plan_schedule", "slots", "static_plan"]

SLOT, SAMPLE, UNIFORM, COLUMN, REWARD = range(5)  # the columns of a schedule row


def static_plan(model, tokenizer, prefix: torch.Tensor, keys: torch.Tensor, config,
                buffers: BufferPool | None = None, planner_class=None) -> Plan:
    """`planning.beam_plan`'s search with static shapes (it calls this, after checking its arguments; the model
    in evaluation mode, under inference mode). With buffers, the StaticPlanner -- its tensors and, on CUDA, its
    graphs -- is kept there for the next plan of the same shape, and made again if the model's weights change.
    planner_class: StaticPlanner (None) or a subclass (triton_step.TritonPlanner: its step one Triton kernel)."""
    planner_class = planner_class or StaticPlanner
    graphs = buffers is not None and buffers.graphs and prefix.device.type == "cuda"
    weights = tuple((p.data_ptr(), p._version) for p in model.parameters())  # changed in place: a new version
    context = max(config.context, prefix.shape[1] // model.config.transition_dim + 1)  # (a longer prefix: room)
    key = (planner_class.__name__, id(model), id(tokenizer), weights, prefix.shape[0], context, astuple(config),
           graphs)

    def make():
        runner = CUDAGraphs() if graphs else Eager()
        return planner_class(model, tokenizer, config, prefix.shape[0], runner, context)

    planner = buffers.take_kept(key, make) if buffers is not None else make()
    try:
        return planner.plan(prefix, keys)
    finally:
        if buffers is not None:
            buffers.give_kept(key, planner)


def plan_schedule(A: int, O: int, H: int, X: int) -> tuple[list, torch.Tensor, list]:
    """Every token a plan feeds after its context, in order (act_dim A, obs_dim O, horizon H, X children) ->
    rows (slot, sample, uniform, column, reward), the slots each child sees (X, S) bool per token, and the past
    slots in use once the token is stored.

    A row says where the token's keys and values go (a value token: the last slot, which nobody sees) and what
    comes after it: the next token is sampled (sample 1, from uniform column `uniform`) or the likeliest bin, and
    goes into the plan's column `column`; the expected reward is read off the new logits into column `reward`.
    Column G of the plan and H of the rewards are scratch, for tokens after which nothing is read. The slots: a
    step's children write side by side after their beams' past (token j of child c at base + j*X + c); the
    selection moves each survivor's own tokens to base, base + 1, ...; the observations follow."""
    G, S = generated_length(A, O, H), slots(A, O, H, X)
    rows, seen, used, base = [], [], [], 0
    slot = torch.arange(S)
    for t in range(H):
        first = t * (A + 2 + O)  # the plan's column of this step's first action
        for j in range(A + 1):  # the actions, then the reward, on every child; after token j comes j + 1
            after = j + 1
            rows.append((base + j * X, int(after < A), t * A + min(after, A - 1),
                         first + after if after <= A else G, t if after == A else H))
            own = (slot >= base) & (slot <= base + j * X + torch.arange(X)[:, None]) & (
                (slot - base) % X == torch.arange(X)[:, None])  # (X, S) a child's own tokens, not its siblings'
            seen.append((slot < base) | own)
            used.append(base + after * X)
        base += A + 1  # (once the survivors' tokens are moved together)
        if t < H - 1:  # the value (never seen), then the observation, on the W survivors
            rows.append((S - 1, 0, 0, first + A + 2, H))
            seen.append((slot < base).expand(X, S))
            used.append(base)
            for i in range(O):
                rows.append((base + i, 0, 0, first + A + 3 + i if i + 1 < O else G, H))
                seen.append((slot <= base + i).expand(X, S))
                used.append(base + i + 1)
            base += O
    return rows, torch.stack(seen), used


def generated_length(A: int, O: int, H: int) -> int:
    """Tokens a plan generates: per step the action, reward and value, and the next observation between steps."""
    return H * (A + 2) + (H - 1) * O


def slots(A: int, O: int, H: int, X: int) -> int:
    """Past slots of a beam row: its steps' actions, rewards and observations, the last step's X children side by
    side, and one for the value tokens."""
    return (H - 1) * (A + 1 + O) + X * (A + 1) + 1


class Rows:
    """What the search keeps of every row of one kind: the W beams of every environment, or their X children."""

    def __init__(self, n: int, children: int, G: int, H: int, N: int, like: torch.Tensor):
        self.children = children  # X for the children, 1 for the beams
        self.bins = torch.zeros(n, dtype=torch.long, device=like.device)  # (n,) the token each row is fed next
        self.logits = like.new_zeros(n, N)  # (n, N) the logits of what follows the last token fed
        self.generated = torch.zeros(n, G + 1, dtype=torch.long, device=like.device)  # (n, G+1) the plan's bins
        self.rewards = like.new_zeros(n, H + 1)  # (n, H + 1) expected reward of every step (column H: scratch)
        self.values = like.new_zeros(n, H)  # (n, H) expected value after every step
        self.discounted = like.new_zeros(n)  # (n,) sum_k gamma^k E[r_k] so far
        self.score = like.new_zeros(n)  # (n,) the score of the last selection

    def gather(self, src: Rows, index: torch.Tensor) -> None:
        """These rows become src's rows `index`: what the search knows of them, not the cache."""
        for name in ("logits", "generated", "rewards", "values", "discounted"):
            torch.index_select(getattr(src, name), 0, index, out=getattr(self, name))


class StaticPlanner:
    """The search for one plan shape -- E environments, a model, a planner setting -- on tensors that stay where
    they are. `plan(prefix, keys)` plans; the runner (graphs.Eager or graphs.CUDAGraphs) runs its units."""

    def __init__(self, model, tokenizer, config, n_envs: int, runner, context: int | None = None):
        """context: the most transitions a prefix holds, its current observation's included (config.context)."""
        c, p = model.config, model.pos_emb
        self.model, self.tokenizer, self.config, self.runner = model, tokenizer, config, runner
        self.A, self.O, self.H, self.td, self.N = c.act_dim, c.obs_dim, config.horizon, c.transition_dim, c.n_bins
        self.E, self.W, self.X = n_envs, config.beam_width, config.sample_expand
        self.heads, self.D = c.n_head, c.n_embd // c.n_head
        E, W, X, H, A, O, D = self.E, self.W, self.X, self.H, self.A, self.O, self.D
        rows, seen, self.used = plan_schedule(A, O, H, X)
        self.S, self.G = slots(A, O, H, X), generated_length(A, O, H)
        self.schedule = torch.tensor(rows, dtype=torch.long, device=p.device)  # (tokens, 5)
        self.seen = seen.to(p.device)  # (tokens, X, S) bool: the past slots each child sees
        self.Kc = ((context or config.context) - 1) * (self.td - 1) + O  # context slots: value tokens left out

        self.layers = [LayerWeights.of(block, D) for block in model.blocks]
        self.norm_f, self.tok_emb, self.pos_emb = norm_args(model.ln_f), model.tok_emb.weight, model.pos_emb
        self.head_weight, self.head_bias = model.head_weight, model.head_bias  # (td, C, N), (td, N)
        self.reward_means, self.value_means = (torch.as_tensor(tokenizer.means[d], dtype=p.dtype,
                                                                   device=p.device) for d in (-2, -1))  # (N,)
        self.beams = Rows(E * W, 1, self.G, H, self.N, p)
        self.children = Rows(E * W * X, X, self.G, H, self.N, p)
        self.context_k = p.new_zeros(c.n_layer, self.heads * E, D, self.Kc)  # zeros: padding must be finite
        self.context_v = p.new_zeros(c.n_layer, self.heads * E, self.Kc, D)
        self.context_mask = p.new_zeros(self.Kc)  # (Kc,) 0 on the context's slots, -inf on padding
        self.past = [p.new_zeros(c.n_layer, 2, self.heads, E * W, self.S, D) for _ in range(2)]
        self.past_layers = [[(kv, kv[0].flatten(0, 1), kv[1].flatten(0, 1)) for kv in past] for past in self.past]
        self.context_layers = list(zip(self.context_k, self.context_v, strict=True))  # views, per layer
        self.zero, self.minus_inf = p.new_zeros(()), p.new_full((), float("-inf"))

        long = dict(dtype=torch.long, device=p.device)
        self.k, self.p0 = torch.zeros(1, **long), torch.zeros(1, **long)  # token counter; the first one's position
        self.keys = torch.zeros(E, **long)  # (E,) this plan's random keys
        self.uniforms = torch.zeros(E * W * X, H * A, dtype=torch.float64, device=p.device)  # (rows, H*A)
        self.child_slots = torch.arange(X, **long)  # (X,) a step's X children, side by side
        self.parent = torch.arange(E * W * X, **long) // X  # (E*W*X,) every child's beam
        self.env_of_beam = torch.arange(E * W, **long) // W  # (E*W,) every beam's environment
        self.env_first_row = torch.arange(E, **long) * W  # (E,)
        self.prefixes, self.attended = {}, {}  # per context length: the input, the context tokens attended to
        self.out = Rows(E, 1, self.G, H, 1, p)  # the best plan of every environment
        self.n_context = self.Kc  # context slots a step reads (eagerly, only the real ones)
        self.step = compiled(self._step, runner) if config.compile_step and runner.static else self._step

    # ---- the plan: units in a fixed order, each the same work every time -----------------------------------
    def plan(self, prefix: torch.Tensor, keys: torch.Tensor) -> Plan:
        """prefix (E, P) bins, keys (E,) int64 -> the best plan of every environment (as `beam_plan`)."""
        P = prefix.shape[1]
        if P not in self.prefixes:  # made outside any graph: creating a tensor from the host is no kernel
            attended = [i for i in range(P) if i % self.td != self.td - 1]  # the value tokens are never seen
            if len(attended) > self.Kc:
                raise MismatchError(f"a prefix of {P} tokens is longer than the {self.Kc} context slots this planner "
                                    "holds: make it with a larger context")
            self.attended[P] = torch.tensor(attended, dtype=torch.long, device=self.keys.device)
            self.prefixes[P] = torch.zeros(self.E, P, dtype=torch.long, device=self.keys.device)
        self.prefixes[P].copy_(prefix)
        self.keys.copy_(keys)
        run, static, S, A, O, H = self.runner.run, self.runner.static, self.S, self.A, self.O, self.H
        self.n_context = self.Kc if static else len(self.attended[P])
        run(("start", P), partial(self._start, P))
        k = 0
        for t in range(H):
            run(("expand", t), partial(self._expand, t))
            for _ in range(A + 1):
                n = S if static else self._reads(k, self.X)
                run(("step", "children", t % 2), partial(self.step, self.children, t % 2, n))
                k += 1
            run(("select", t), partial(self._select, t))
            for _ in range(1 + O if t < H - 1 else 0):
                n = S if static else self._reads(k, 1)
                run(("step", "beams", (t + 1) % 2), partial(self.step, self.beams, (t + 1) % 2, n))
                k += 1
        run(("finish",), self._finish)
        out = self.out  # copied: the next plan writes into the same tensors
        return decode_plan(self.tokenizer, out.generated[:, :self.G].clone(), out.rewards[:, :H].clone(),
                           out.values.clone(), out.score.clone(), H)

    def _reads(self, k: int, children: int) -> int:
        """Past slots a step reads eagerly: those in use, at least ATen's matrix kernel's minimum (fast_decoder)."""
        return min(self.S, max(self.used[k], min_slots(children, self.D)))

    def _start(self, P: int) -> None:
        """The model over every environment's context; the context's keys and values into the cache; the plan's
        uniforms; W identical beams with nothing generated."""
        E, W, H, A, heads, D = self.E, self.W, self.H, self.A, self.heads, self.D
        context = self.model.new_cache(E, capacity=P)
        logits, _ = self.model(self.prefixes[P], cache=context, last_only=True)  # (E, 1, N)
        attended = self.attended[P]
        Pc = attended.shape[0]
        k = context.k.index_select(3, attended)  # (L, E, heads, Pc, D)
        self.context_k[..., :Pc] = k.permute(0, 2, 1, 4, 3).reshape(-1, heads * E, D, Pc)
        self.context_v[:, :, :Pc] = context.v.index_select(3, attended).transpose(1, 2).reshape(-1, heads * E, Pc, D)
        slot = torch.arange(self.Kc, device=attended.device)
        self.context_mask.copy_(torch.where(slot < Pc, self.zero, self.minus_inf))
        beams = self.beams
        torch.index_select(logits[:, 0], 0, self.env_of_beam, out=beams.logits)  # W copies of each environment's
        for tensor in (beams.rewards, beams.values, beams.discounted, self.k):
            tensor.zero_()
        self.p0.fill_(P)
        rows = torch.arange(E * W * self.X, device=attended.device) % (W * self.X)
        row_keys = self.keys.index_select(0, self.env_of_beam.index_select(0, self.parent))[:, None]  # (E*W*X, 1)
        self.uniforms.copy_(counter_uniform(row_keys, torch.arange(H * A, device=attended.device), rows[:, None]))

    def _expand(self, t: int) -> None:
        """Every beam becomes X children, which share its cache row; each samples its first action."""
        children = self.children
        children.gather(self.beams, self.parent)
        bins = self._sample(children.logits, self.uniforms[:, t * self.A])
        children.bins.copy_(bins)
        children.generated[:, t * (self.A + 2 + self.O)] = bins

    def _sample(self, logits: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
        c = self.config
        return sample_bins(logits, uniform, c.top_k_action, c.temperature, c.top_p_action)

    def _step(self, rows: Rows, parity: int, n: int) -> None:
        """Token k for every row: rows.bins in, rows.logits out; then the next token chosen, written into the
        plan, and the expected reward read where the schedule says."""
        token = self.schedule.index_select(0, self.k)[0]  # (5,)
        logits = self._feed(rows, token, parity, n)
        greedy = logits.argmax(dim=-1)
        if rows is self.children:  # actions are sampled; the reward is the likeliest bin
            uniform = self.uniforms.index_select(1, token[UNIFORM:UNIFORM + 1])[:, 0]
            bins = torch.where(token[SAMPLE].bool(), self._sample(logits, uniform), greedy)
            reward = torch.softmax(logits, dim=-1) @ self.reward_means  # (rows,)
            rows.rewards.index_copy_(1, token[REWARD:REWARD + 1], reward[:, None])
        else:  # observations: the likeliest bin
            bins = greedy
        rows.bins.copy_(bins)
        rows.generated.index_copy_(1, token[COLUMN:COLUMN + 1], bins[:, None])
        self.k.add_(1)

    def _feed(self, rows: Rows, token: torch.Tensor, parity: int, n: int) -> torch.Tensor:
        """The model on one token per row, at position p0 + k, on the static cache -> rows.logits (B, N)."""
        position = self.p0 + self.k  # (1,)
        x = F.embedding(rows.bins + position % self.td * self.N, self.tok_emb)  # (B, C): the dimension's tokens
        x = x + self.pos_emb.index_select(0, position)
        X = rows.children
        slots = token[SLOT] + self.child_slots[:X]  # (X,) where a beam's X children write, side by side
        seen = self.seen.index_select(0, self.k)[0, :X, :n]  # (X, n)
        mask = torch.where(seen, self.zero, self.minus_inf)  # (X, n) added to the scores: 0 or -inf
        for layer, (norm_1, w_qkv, b_qkv, w_proj, b_proj, norm_2, w_up, b_up, w_down, b_down) in enumerate(self.layers):
            h = torch.layer_norm(x, *norm_1)
            y = self._attend(layer, torch.addmm(b_qkv, h, w_qkv), slots, mask, self.past_layers[parity][layer], n)
            x = torch.addmm(x, y, w_proj).add_(b_proj)
            h = torch.layer_norm(x, *norm_2)
            x = torch.addmm(x, F.gelu(torch.addmm(b_up, h, w_up)), w_down).add_(b_down)
        x = torch.layer_norm(x, *self.norm_f)
        after = (position + 1) % self.td  # (1,) the dimension of the token that comes next
        return torch.addmm(self.head_bias.index_select(0, after), x, self.head_weight.index_select(0, after)[0],
                           out=rows.logits)

    def _attend(self, layer: int, qkv: torch.Tensor, slots: torch.Tensor, mask: torch.Tensor, past: tuple,
                n: int) -> torch.Tensor:
        """qkv (B, 3C) of the new tokens -> attention output (B, C). Their keys and values go into `slots` of their
        beam's row first; then every query attends to its environment's context and to the n past slots its row
        sees (mask (X, n), the same for every beam). past: this layer's cache (2, heads, E*W, S, D), and its keys
        and values (heads*E*W, S, D) each."""
        heads, D, E, Kn = self.heads, self.D, self.E, self.n_context
        B, X = qkv.shape[0], mask.shape[0]
        kv, past_k, past_v = past
        qkv = qkv.view(B, 3, heads, D).permute(1, 2, 0, 3)  # (3, heads, B, D)
        kv.index_copy_(3, slots, qkv[1:].reshape(2, heads, B // X, X, D))
        q = qkv[0].contiguous()  # (heads, B, D)
        context_k, context_v = self.context_layers[layer]  # (heads*E, D, Kc), (heads*E, Kc, D)
        q_env = q.view(heads * E, B // E, D)
        context = (torch.baddbmm(self.context_mask, q_env, context_k) if self.runner.static  # padding masked
                   else torch.bmm(q_env, context_k[..., :Kn]))  # (heads*E, B/E, Kn): eagerly, no padding is read
        own = torch.baddbmm(mask, q.view(-1, X, D), past_k[:, :n].transpose(1, 2))  # (heads*E*W, X, n)
        weights = torch.softmax(torch.cat([context.view(heads, B, Kn), own.view(heads, B, n)], dim=-1), dim=-1)
        y = torch.bmm(weights[..., :Kn].view(heads * E, B // E, Kn), context_v[:, :Kn]).view(heads, B, D)
        y.view(-1, X, D).baddbmm_(weights[..., Kn:].view(-1, X, n), past_v[:, :n])
        return y.transpose(0, 1).reshape(B, heads * D)

    def _select(self, t: int) -> None:
        """Score the children after step t, keep the best W of every environment, gather them -- with their value
        token, the next one fed -- and, unless this was the last step, their cache rows: their beams' past, then
        each survivor's own tokens moved together."""
        c, children, beams, A, X = self.config, self.children, self.beams, self.A, self.X
        logits = children.logits
        children.values[:, t] = torch.softmax(logits, dim=-1) @ self.value_means
        discounted = children.discounted + c.gamma**t * children.rewards[:, t]
        score = discounted + c.value_weight * c.gamma ** (t + 1) * children.values[:, t]
        keep = best_children(score, self.E, self.W)  # (E*W,)
        beams.gather(children, keep)
        torch.index_select(discounted, 0, keep, out=beams.discounted)
        torch.index_select(score, 0, keep, out=beams.score)
        torch.index_select(logits.argmax(dim=-1), 0, keep, out=beams.bins)  # the value token
        beams.generated[:, t * (A + 2 + self.O) + A + 1] = beams.bins
        if t == self.H - 1:
            return
        src, dst, n = self.past[t % 2], self.past[(t + 1) % 2], t * (A + 1 + self.O)  # n: the beams' past
        torch.index_select(src[..., :n, :], 3, keep // X, out=dst[..., :n, :])
        flat = src.flatten(3, 4)  # (L, 2, heads, E*W*S, D), the same memory
        first = keep // X * self.S + n + keep % X  # (E*W,) each survivor's first own token in that view
        for j in range(A + 1):  # token j of child c sits at slot n + j*X + c of its beam's row
            torch.index_select(flat, 3, first + j * X, out=dst[..., n + j, :])

    def _finish(self) -> None:
        """The best plan of every environment, into self.out."""
        beams = self.beams
        best = beams.score.view(self.E, self.W).argmax(dim=1) + self.env_first_row  # (E,)
        for name in ("generated", "rewards", "values", "score"):
            torch.index_select(getattr(beams, name), 0, best, out=getattr(self.out, name))
