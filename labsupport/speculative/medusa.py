"""Medusa heads: extra heads on the target's last hidden state guess tokens t+2 … t+K+1.

Cai et al., "Medusa: Simple LLM Inference Acceleration Framework with Multiple Decoding
Heads" (ICML 2024). After the target's forward at position ``t`` its LM head gives token
``t+1``; head ``k`` (k = 1..K) reads the same final hidden state ``h_t`` (after ``ln_f``) and
guesses token ``t+k+1``:

    p_k(· | h_t) = softmax(W_out · (h_t + SiLU(W_k h_t + b_k)))        (one residual block)

The draft therefore costs K small matrix products on a hidden state the target computed
anyway — no draft forward, no second KV cache. Medusa-1 gives every head its own output
matrix initialised from the LM head; to keep the shipped file small (≈ 0.8 MB instead of
4 MB per head at vocabulary 4,096 × 256) ours share the target's frozen LM head and train only
the residual blocks (``python -m labsupport.train medusa``; the model card gives the
per-head top-1 accuracy).
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ..models import LoadedModel
from ..validation import check_int
from .head_files import read_head, save_head
from .proposers import Proposer

__all__ = ["MedusaHeads", "head_accuracy", "load_medusa", "train_medusa"]

MEDUSA_DIR = "tiny-gpt2-medusa"


class MedusaHeads(nn.Module):
    """K residual blocks over the target's final hidden state, scored by the target's LM head.

    Args:
        n_embd: hidden size E of the target. num_heads: K ≥ 1.

    Shapes: :meth:`forward` ``(N, E)`` hidden → ``(K, N, E)`` head features;
    :meth:`logits` ``(N, E)`` → ``(K, N, V)`` with the LM head ``(V, E)``.
    """

    def __init__(self, n_embd: int, num_heads: int = 3):
        super().__init__()
        self.n_embd = check_int("n_embd", n_embd, 1)
        self.num_heads = check_int("num_heads", num_heads, 1)
        self.blocks = nn.ModuleList(nn.Linear(n_embd, n_embd) for _ in range(num_heads))
        for b in self.blocks:                       # start as identity: every head = the LM head's guess
            nn.init.zeros_(b.weight)
            nn.init.zeros_(b.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.stack([hidden + F.silu(b(hidden)) for b in self.blocks])

    def logits(self, hidden: torch.Tensor, lm_head: torch.Tensor) -> torch.Tensor:
        """``(N, E)`` hidden after ``ln_f`` → ``(K, N, V)`` logits of tokens t+2 … t+K+1."""
        return F.linear(self(hidden.to(lm_head.dtype)), lm_head).float()

    @property
    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def save(self, path: str | Path, stats: dict | None = None) -> None:
        """Write ``model.safetensors`` and ``config.json`` (with ``stats``) under ``path``."""
        save_head(self, path, {"n_embd": self.n_embd, "num_heads": self.num_heads,
                               "architecture": "medusa-1 residual heads, LM head shared with the target"}, stats)


def load_medusa(name_or_path: str | Path = MEDUSA_DIR, device: torch.device | str = "cpu") -> MedusaHeads:
    """Load heads saved by :meth:`MedusaHeads.save` (a shipped name under ``assets/models`` or a path).

    Raises:
        FileNotFoundError: no such folder.
    """
    cfg, state = read_head(name_or_path, "Medusa heads", "python -m labsupport.train medusa")
    heads = MedusaHeads(cfg["n_embd"], cfg["num_heads"])
    heads.load_state_dict(state)
    heads.stats = cfg.get("stats", {})
    return heads.to(device).eval()


@torch.no_grad()
def _final_hidden(target: LoadedModel, batch: torch.Tensor) -> torch.Tensor:
    """``(B, T)`` ids → ``(B, T, E)`` the target's hidden state after ``ln_f``."""
    out = target.model.transformer(batch)
    return out.last_hidden_state


@torch.no_grad()
def frozen_target_windows(target: LoadedModel, train_ids: torch.Tensor, seq_len: int, num_windows: int,
                          seed: int) -> tuple[torch.Generator, torch.Tensor, torch.Tensor]:
    """What training a draft head on a frozen target starts with (Medusa, EAGLE): seed torch and a
    generator, freeze the target, draw ``num_windows`` random windows of ``seq_len`` tokens and
    compute the target's hidden states once. Returns ``(generator, windows (W, T), hidden (W, T, E))``."""
    from tqdm.auto import tqdm

    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    for p in target.model.eval().parameters():
        p.requires_grad_(False)
    idx = torch.randint(0, len(train_ids) - seq_len - 1, (num_windows,), generator=gen).tolist()
    windows = torch.stack([train_ids[i:i + seq_len] for i in idx])                  # (W, T)
    hidden = torch.cat([_final_hidden(target, w) for w in tqdm(windows.split(32), desc="target features",
                                                                 mininterval=5)])   # (W, T, E)
    return gen, windows, hidden


def _target_labels(target: LoadedModel, batch: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
    """Self-distillation labels ``(B, T)``: position ``j`` holds the target's arg-max after ``j − 1``
    (teacher-forced), i.e. what the target would have said there — what verification checks."""
    top = F.linear(hidden, target.model.lm_head.weight).argmax(-1)                # (B, T): token j+1
    return torch.cat([batch[:, :1], top[:, :-1]], dim=1)


def _head_loss(heads: MedusaHeads, hidden: torch.Tensor, ids: torch.Tensor, lm_head: torch.Tensor,
               weight_decay: float = 0.8) -> tuple[torch.Tensor, list[float]]:
    """Cross-entropy of head k on token t+k+1 (weights 0.8^k as Medusa-1); also top-1 accuracy per head."""
    logits = heads.logits(hidden.reshape(-1, hidden.shape[-1]), lm_head)            # (K, B·T, V)
    b, t = ids.shape
    logits = logits.view(heads.num_heads, b, t, -1)
    loss, acc = 0.0, []
    for k in range(heads.num_heads):
        shift = k + 2                                                               # head k (0-based) → t+k+2
        pred, gold = logits[k, :, :t - shift], ids[:, shift:]
        loss = loss + weight_decay ** k * F.cross_entropy(pred.reshape(-1, pred.shape[-1]), gold.reshape(-1))
        acc.append(float((pred.argmax(-1) == gold).float().mean()))
    return loss, acc


@torch.no_grad()
def head_accuracy(target: LoadedModel, heads: MedusaHeads, ids: torch.Tensor, seq_len: int = 128,
                  max_windows: int = 32, against: str = "text") -> list[float]:
    """Top-1 accuracy of each head on held-out token windows, teacher-forced: head k at position t
    scored on token t+k+1 of the text (``against="text"``) or on the target's own arg-max there
    (``against="target"``, what greedy verification checks).

    Raises:
        ValueError: ``against`` not "text" or "target".
    """
    if against not in ("text", "target"):
        raise ValueError(f"against must be 'text' or 'target', got {against!r}")
    n = min(max_windows, (len(ids) - 1) // seq_len)
    windows = torch.stack([ids[i * seq_len:(i + 1) * seq_len] for i in range(n)])
    lm_head = target.model.lm_head.weight
    hidden = _final_hidden(target, windows)
    gold = windows if against == "text" else _target_labels(target, windows, hidden)
    _, acc = _head_loss(heads, hidden, gold, lm_head)
    return acc


def train_medusa(target: LoadedModel, train_ids: torch.Tensor, val_ids: torch.Tensor, *, num_heads: int = 3,
                 steps: int = 400, batch_size: int = 8, seq_len: int = 128, num_windows: int = 384,
                 lr: float = 3e-3, distill: bool = True, seed: int = 0) -> tuple[MedusaHeads, dict]:
    """Train Medusa-1 heads on a frozen target (AdamW, cosine schedule, fixed seed, tqdm).

    The target is frozen, so its hidden states are computed once for ``num_windows`` random
    windows of ``seq_len`` tokens; each step trains on ``batch_size`` of those windows.
    ``distill``: the labels are the target's own teacher-forced arg-max instead of the text
    (self-distillation, as Medusa-2 does with the target's outputs: verification accepts what
    the target would say, not what the corpus says).

    Returns:
        the heads (eval mode) and a stats dict (steps, seconds, parameters, per-head top-1 accuracy).
    """
    from tqdm.auto import tqdm

    start = time.perf_counter()
    gen, windows, hidden = frozen_target_windows(target, train_ids, seq_len, num_windows, seed)
    model = target.model
    labels = _target_labels(target, windows, hidden) if distill else windows
    heads = MedusaHeads(model.config.n_embd, num_heads)
    opt = torch.optim.AdamW(heads.parameters(), lr=lr, weight_decay=0.0)
    lm_head = model.lm_head.weight
    bar = tqdm(range(steps), desc="medusa heads", mininterval=5)
    for step in bar:
        for g in opt.param_groups:
            g["lr"] = lr * 0.5 * (1 + math.cos(math.pi * step / steps))
        pick = torch.randint(0, num_windows, (batch_size,), generator=gen)
        loss, acc = _head_loss(heads, hidden[pick], labels[pick], lm_head)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % 25 == 0:
            bar.set_postfix(loss=f"{loss.item():.3f}", top1=f"{acc[0]:.2f}")
    heads.eval()
    stats = {"num_heads": num_heads, "steps": steps, "batch_size": batch_size, "seq_len": seq_len,
             "num_windows": num_windows, "lr": lr, "distill": distill, "seed": seed,
             "seconds": round(time.perf_counter() - start, 1), "parameters": heads.num_parameters,
             "val_top1_by_head": [round(a, 3) for a in head_accuracy(target, heads, val_ids, seq_len)],
             "val_target_agreement_by_head": [round(a, 3) for a in head_accuracy(target, heads, val_ids, seq_len,
                                                                                 against="target")]}
    return heads, stats


class MedusaProposer(Proposer):
    """Draft from Medusa heads on the target's last accepted hidden state (no draft forward).

    Greedy settings: a static token tree from the heads' top-k (``choices``, Medusa's "tree
    choices"; default the full tree of ``widths``) verified in one forward. Sampling: a chain,
    head k's token drawn from its processed distribution ``q_k`` and verified with the exact
    rejection rule (the heads' q is independent of the earlier drafts, which the rule allows).

    Args:
        heads: trained :class:`MedusaHeads` of the target's hidden size.
        widths: top-k per depth, e.g. ``(3, 2, 1)``. choices: explicit tree paths instead.

    Attributes:
        num_speculative_tokens: γ = the tree's depth (one head per level).

    Raises:
        TypeError: ``heads`` not MedusaHeads.
        ValueError: no tree choice, a tree deeper than the number of heads, or (at :meth:`start`)
            heads whose hidden size is not the target's.
    """

    name = "Medusa heads"
    needs_paged_target = True

    def __init__(self, heads: MedusaHeads, widths=(3, 2, 1), choices=None):
        from ..validation import is_int
        from .tree import choices_from_widths
        if not isinstance(heads, MedusaHeads):
            raise TypeError(f"heads must be MedusaHeads, got {type(heads).__name__}")
        if choices is None:
            if isinstance(widths, (str, bytes)) or not hasattr(widths, "__iter__"):
                raise TypeError(f"widths must be a sequence of top-k sizes per depth, e.g. (3, 2, 1), got {widths!r}")
            choices = choices_from_widths(list(widths))
        elif isinstance(choices, (str, bytes)) or not hasattr(choices, "__iter__"):
            raise TypeError(f"choices must be a list of rank paths, e.g. [(0,), (1,), (0, 0)], got {choices!r}")
        paths = []
        for c in choices:
            if isinstance(c, (str, bytes)) or not hasattr(c, "__iter__") or not all(is_int(r) and r >= 0 for r in c):
                raise TypeError(f"choices must hold tuples of ranks (integers >= 0), got {c!r}")
            paths.append(tuple(int(r) for r in c))
        choices = paths
        if not choices or any(len(c) == 0 for c in choices):
            raise ValueError(f"choices must be a non-empty list of non-empty rank paths, got {choices!r}")
        depth = max(len(c) for c in choices)
        if depth > heads.num_heads:
            raise ValueError(f"the tree is {depth} deep but there are only {heads.num_heads} heads")
        super().__init__(depth)
        self.heads, self.choices = heads, choices
        self.width = max(c[-1] for c in self.choices) + 1
        self.head_seconds = 0.0

    @property
    def max_draft_tokens(self) -> int:
        return max(len(self.choices), self.num_speculative_tokens)

    def check_target(self, target) -> None:
        """The heads must match the target's hidden size, LM head dtype / device and vocabulary."""
        self._check_head(target.model.lm_head.weight)

    def start(self, engine, seqs) -> None:
        self._check_head(engine.runner.lm_head)
        for s in seqs:
            s.state["hidden"] = s.state.get("prefill_hidden")   # None for a one-token prompt: a plain first round

    def _check_head(self, lm_head: torch.Tensor) -> None:
        if self.heads.n_embd != lm_head.shape[1]:
            raise ValueError(f"heads have n_embd {self.heads.n_embd}, the target {lm_head.shape[1]}")
        p = next(self.heads.parameters())
        if (p.dtype, p.device) != (lm_head.dtype, lm_head.device):
            raise ValueError(f"heads must have the target's dtype and device ({lm_head.dtype}, {lm_head.device}), "
                             f"got ({p.dtype}, {p.device}): use heads.to(...)")
        if self.width > lm_head.shape[0]:
            raise ValueError(f"a tree rank {self.width - 1} needs more candidates than the vocabulary has "
                             f"({lm_head.shape[0]})")

    @torch.no_grad()
    def propose(self, engine, seqs):
        from ..sampling import sample_from
        from .rounds import Draft, draft_distribution
        from .tree import tree_from_choices
        t0 = time.perf_counter()
        ready = [s for s in seqs if s.state.get("hidden") is not None]
        if not ready:
            return {}
        hidden = torch.stack([s.state["hidden"] for s in ready])                    # (B, E)
        logits = self.heads.logits(hidden, engine.runner.lm_head)                   # (K, B, V)
        out = {}
        for b, s in enumerate(ready):
            if s.params.greedy:
                topk = logits[:self.num_speculative_tokens, b].topk(self.width, dim=-1).indices.tolist()
                tree = tree_from_choices(s.token_ids[-1], topk, self.choices)
                out[s.request_id] = Draft(tree.tokens[1:], tree.parents)
            else:
                tokens, rows = [], []
                for k in range(min(self.num_speculative_tokens, max(s.room, 0))):
                    q = draft_distribution(logits[k, b], s, tokens)
                    tokens.append(int(sample_from(q, s.generator)))
                    rows.append(q)
                out[s.request_id] = Draft(tokens, None, torch.stack(rows) if rows else None)
        self.head_seconds += time.perf_counter() - t0
        return out

    def observe(self, engine, s, draft, path, hidden, logits) -> None:
        """Keep the hidden state of the last accepted node: it predicts the next token and, through
        the heads, the ones after it."""
        s.state["hidden"] = hidden[path[-1] if path else 0]
