"""EAGLE: a one-layer draft head that predicts the target's next *feature*, not its next token.

Li et al., "EAGLE: Speculative Sampling Requires Rethinking Feature Uncertainty" (ICML 2024).
Drafting at the level of the target's last hidden state (its "feature", here after ``ln_f``) is
easier than at the level of tokens: the feature sequence is smooth, and the token sampled at each
step resolves the uncertainty that a feature alone leaves. The head reads, at every position
``t``, the pair (feature ``h_{t-1}`` of the previous position, embedding of token ``x_t``) and
predicts ``h_t``; the target's own LM head turns it into a draft token:

    z_t = W_fc [h_{t-1}; e(x_t)]            (2E → E)
    ĥ_t = Block(z_{≤t})                      (one causal transformer block over the recent pairs)
    q(x_{t+1}) = softmax(W_LM ĥ_t)

Drafting γ tokens runs the head γ times, each time on its own last prediction (ĥ_t, the drafted
token) — a few small matrix products per token, no second KV cache of the target. This course's
simplifications: the block re-reads the last :data:`WINDOW` pairs each step (no KV cache of its
own: at E = 256 that is cheaper than the bookkeeping), the embedding and LM head are the target's
own (frozen, tied in GPT-2), and the training is self-distillation on the shipped corpus
(``python -m labsupport.train eagle``: regression on the feature + cross-entropy on the target's
arg-max, EAGLE-1's loss).
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
from .medusa import _final_hidden, frozen_target_windows
from .proposers import Proposer
from .rounds import Draft, draft_distribution

__all__ = ["EAGLE_DIR", "EagleHead", "EagleProposer", "eagle_accuracy", "load_eagle", "train_eagle"]

EAGLE_DIR = "tiny-gpt2-eagle"
WINDOW = 64
"""Most recent (feature, token) pairs the head's attention reads while drafting."""


class EagleHead(nn.Module):
    """The draft head: a fusion layer and one pre-norm transformer block (causal self-attention + MLP).

    Args:
        n_embd: E, the target's hidden size. n_head: attention heads (E divisible by it).

    Shapes: :meth:`forward` ``features (B, T, E)``, ``token_embeddings (B, T, E)`` → ``(B, T, E)``
    predicted next features.
    """

    def __init__(self, n_embd: int, n_head: int = 4):
        super().__init__()
        self.n_embd = check_int("n_embd", n_embd, 1)
        self.n_head = check_int("n_head", n_head, 1)
        if n_embd % n_head:
            raise ValueError(f"n_embd must be divisible by n_head, got {n_embd} and {n_head}")
        self.fc = nn.Linear(2 * n_embd, n_embd)
        self.ln_1, self.ln_2 = nn.LayerNorm(n_embd), nn.LayerNorm(n_embd)
        self.qkv, self.proj = nn.Linear(n_embd, 3 * n_embd), nn.Linear(n_embd, n_embd)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 2 * n_embd), nn.GELU(approximate="tanh"), nn.Linear(2 * n_embd, n_embd))

    def forward(self, features: torch.Tensor, token_embeddings: torch.Tensor) -> torch.Tensor:
        """Training: whole windows at once, causal. ``(B, T, E)`` twice → ``(B, T, E)``."""
        x = self.fc(torch.cat([features, token_embeddings], dim=-1))                # (B, T, E)
        b, t, e = x.shape
        q, k, v = self.qkv(self.ln_1(x)).view(b, t, 3, self.n_head, e // self.n_head).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, e)
        x = x + self.proj(a)
        return x + self.mlp(self.ln_2(x))

    def extend(self, features: torch.Tensor, token_embeddings: torch.Tensor,
               past: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, tuple]:
        """Drafting: ``n`` new pairs after the cached ones — the head's own KV cache, so a draft step
        costs one row, not the whole window. ``(n, E)`` twice and ``past = (K, V)`` of shape
        ``(m, H, D)`` → ``(n, E)`` predicted features and the ``(m + n, H, D)`` cache.
        Equal to :meth:`forward` on the whole sequence (tested)."""
        x = self.fc(torch.cat([features, token_embeddings], dim=-1))                # (n, E)
        n, e = x.shape
        q, k, v = self.qkv(self.ln_1(x)).view(n, 3, self.n_head, e // self.n_head).unbind(1)   # (n, H, D)
        if past is not None:
            k, v = torch.cat([past[0], k]), torch.cat([past[1], v])
        m = k.shape[0] - n
        sees = None if n == 1 else torch.ones(n, m + n, dtype=torch.bool, device=x.device).tril(m)   # row i: keys 0 … m + i
        a = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None],
                                           v.transpose(0, 1)[None], attn_mask=sees)[0]
        x = x + self.proj(a.transpose(0, 1).reshape(n, e))
        return x + self.mlp(self.ln_2(x)), (k, v)

    @property
    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def save(self, path: str | Path, stats: dict | None = None) -> None:
        """Write ``model.safetensors`` and ``config.json`` (with ``stats``) under ``path``."""
        save_head(self, path, {"n_embd": self.n_embd, "n_head": self.n_head, "architecture": "EAGLE-1 head: "
                               "fc(2E→E) + one transformer block; the target's embedding and LM head"}, stats)


def load_eagle(name_or_path: str | Path = EAGLE_DIR, device: torch.device | str = "cpu") -> EagleHead:
    """Load a head saved by :meth:`EagleHead.save` (a shipped name under ``assets/models`` or a path).

    Raises:
        FileNotFoundError: no such folder.
    """
    cfg, state = read_head(name_or_path, "EAGLE head", "python -m labsupport.train eagle")
    head = EagleHead(cfg["n_embd"], cfg["n_head"])
    head.load_state_dict(state)
    head.stats = cfg.get("stats", {})
    return head.to(device).eval()


# ---------------------------------------------------------------------------- training

def _loss(head: EagleHead, feats: torch.Tensor, ids: torch.Tensor, wte: torch.Tensor, lm_head: torch.Tensor,
          w_cls: float = 0.1) -> tuple[torch.Tensor, float]:
    """EAGLE-1's loss on teacher-forced windows: predict ``h_t`` from ``(h_{t-1}, x_t)``; smooth-L1 on the
    feature plus ``w_cls`` × cross-entropy of its token against the target's arg-max. Also top-1 agreement."""
    pred = head(feats[:, :-1], wte[ids[:, 1:]])                                 # ĥ_1 … ĥ_{T-1}
    true = feats[:, 1:]
    reg = F.smooth_l1_loss(pred, true)
    want = F.linear(true, lm_head).argmax(-1)                                    # the target's next token
    logits = F.linear(pred, lm_head)
    cls = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), want.reshape(-1))
    return reg + w_cls * cls, float((logits.argmax(-1) == want).float().mean())


@torch.no_grad()
def eagle_accuracy(target: LoadedModel, head: EagleHead, ids: torch.Tensor, seq_len: int = 128,
                   max_windows: int = 32) -> float:
    """Held-out top-1 agreement of the head's first draft token with the target's arg-max (teacher-forced):
    the token after ``x_t`` predicted from ``(h_{t-1}, x_t)`` — the same token Medusa's head 1 guesses."""
    n = min(max_windows, (len(ids) - 1) // seq_len)
    windows = torch.stack([ids[i * seq_len:(i + 1) * seq_len] for i in range(n)])
    wte, lm_head = target.model.transformer.wte.weight, target.model.lm_head.weight
    return _loss(head, _final_hidden(target, windows), windows, wte, lm_head)[1]


def train_eagle(target: LoadedModel, train_ids: torch.Tensor, val_ids: torch.Tensor, *, steps: int = 600,
                batch_size: int = 8, seq_len: int = 128, num_windows: int = 384, lr: float = 2e-3,
                seed: int = 0) -> tuple[EagleHead, dict]:
    """Train an EAGLE head on a frozen target (AdamW, cosine schedule, fixed seed, tqdm); the target's
    features of ``num_windows`` random windows are computed once.

    Returns:
        the head (eval mode) and a stats dict (steps, seconds, parameters, held-out top-1 agreement).
    """
    from tqdm.auto import tqdm

    start = time.perf_counter()
    gen, windows, feats = frozen_target_windows(target, train_ids, seq_len, num_windows, seed)
    model = target.model
    head = EagleHead(model.config.n_embd, model.config.n_head)
    opt = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=0.0)
    wte, lm_head = model.transformer.wte.weight, model.lm_head.weight
    bar = tqdm(range(steps), desc="eagle head", mininterval=5)
    for step in bar:
        for g in opt.param_groups:
            g["lr"] = lr * 0.5 * (1 + math.cos(math.pi * step / steps))
        pick = torch.randint(0, num_windows, (batch_size,), generator=gen)
        loss, acc = _loss(head, feats[pick], windows[pick], wte, lm_head)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % 25 == 0:
            bar.set_postfix(loss=f"{loss.item():.3f}", top1=f"{acc:.2f}")
    head.eval()
    stats = {"steps": steps, "batch_size": batch_size, "seq_len": seq_len, "num_windows": num_windows, "lr": lr,
             "seed": seed, "seconds": round(time.perf_counter() - start, 1), "parameters": head.num_parameters,
             "val_target_agreement": round(eagle_accuracy(target, head, val_ids, seq_len), 3)}
    return head, stats


# ---------------------------------------------------------------------------- the proposer

class EagleProposer(Proposer):
    """Draft γ tokens with an EAGLE head over the target's features (a chain; exact at any temperature).

    The engine hands it the target's features: of the prompt at admission (``needs_prompt_hidden``)
    and of every verified node after each round (:meth:`observe`). Per request it keeps the head's
    own KV cache over the last :data:`WINDOW` committed (feature, next token) pairs; a draft step
    then runs the head on one new row (and the target's LM head), and the drafted rows are dropped
    again once the target has verified them (their true features replace the predicted ones).

    Args:
        head: a trained :class:`EagleHead` of the target's hidden size.
        num_speculative_tokens: γ ≥ 1.

    Raises:
        TypeError: ``head`` not an EagleHead. ValueError: γ < 1, or (at :meth:`start`) a head whose
        hidden size is not the target's.
    """

    name = "EAGLE head"
    needs_paged_target = True
    needs_prompt_hidden = True

    def __init__(self, head: EagleHead, num_speculative_tokens: int = 3):
        if not isinstance(head, EagleHead):
            raise TypeError(f"head must be an EagleHead, got {type(head).__name__}")
        super().__init__(num_speculative_tokens)
        self.head = head.eval()

    @torch.no_grad()
    def _commit(self, engine, s, feats: torch.Tensor, tokens: list[int]) -> None:
        """Run the head over committed pairs and keep its cache (the last WINDOW rows) and last output."""
        if not tokens:
            return
        past = s.state.get("eagle_kv")
        out, (k, v) = self.head.extend(feats.float(), engine.runner.wte[torch.tensor(tokens)].float(), past)
        s.state["eagle_kv"] = (k[-WINDOW:], v[-WINDOW:])
        s.state["eagle_next"] = out[-1]                           # ĥ after the last committed token

    def check_target(self, target) -> None:
        """The head must be trained for the target's hidden size."""
        self._check_width(int(target.model.config.n_embd))

    def _check_width(self, e: int) -> None:
        if self.head.n_embd != e:
            raise ValueError(f"the EAGLE head has n_embd {self.head.n_embd}, the target {e}")

    def start(self, engine, seqs) -> None:
        self._check_width(engine.runner.lm_head.shape[1])
        for s in seqs:
            s.state["eagle_kv"] = s.state["eagle_next"] = None
            feats = s.state.get("prompt_hidden")                 # (len(prompt) − 1, E): h_0 … h_{n-2}
            if feats is not None and len(feats):                 # pairs (h_{t-1}, x_t): x = prompt[1:]
                self._commit(engine, s, feats[-WINDOW:], list(s.prompt_ids[1:])[-WINDOW:])

    @torch.no_grad()
    def propose(self, engine, seqs) -> dict[str, Draft]:
        from ..sampling import sample_from
        wte, lm_head = engine.runner.wte, engine.runner.lm_head_linear   # the runner's one-row kernel
        out = {}
        for s in seqs:
            pred, past = s.state.get("eagle_next"), s.state.get("eagle_kv")
            count = min(self.num_speculative_tokens, max(s.room, 0))
            if pred is None or count == 0:
                continue
            tokens, rows = [], []
            for i in range(count):
                logits = lm_head(pred[None])[0].float()          # the target's LM head on ĥ
                if s.params.is_plain_greedy:
                    tok = int(logits.argmax())
                else:
                    q = draft_distribution(logits, s, tokens)
                    tok = int(sample_from(q, s.generator))
                    rows.append(q)
                tokens.append(tok)
                self.forwards += 1
                if i + 1 < count:                                # draft on its own feature: one new row
                    nxt, past = self.head.extend(pred[None], wte[tok][None].float(), past)
                    pred = nxt[0]
            out[s.request_id] = Draft(tokens, None, torch.stack(rows) if rows else None)
        return out

    def observe(self, engine, s, draft, path, hidden, logits) -> None:
        """The committed tokens' true pairs replace the draft's: (feature of the root, first emitted
        token), (feature of each accepted draft, the token after it)."""
        emitted = s.rounds[-1].emitted
        nodes = [0, *path][:len(emitted)]
        self._commit(engine, s, hidden[nodes], list(emitted))
