"""``python -m labsupport.train medusa``: Medusa heads on the frozen shipped target.

Same corpus and 97 % / 3 % split as :mod:`labsupport.train` (same seed, same document order),
the heads trained by :func:`labsupport.speculative.medusa.train_medusa`, saved to
``assets/models/tiny-gpt2-medusa`` and described in the model card (:func:`write_medusa_section`).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from .corpus import target_streams

MEDUSA_MARK = "## Medusa heads (`tiny-gpt2-medusa`)"


def write_medusa_section(stats: dict, path: Path) -> None:
    """Append (or replace) the Medusa section of the model card ``assets/models/README.md``.

    ``python -m labsupport.train`` rewrites the card without it; run the ``medusa`` command again
    afterwards (the heads belong to one target).
    """
    text = path.read_text() if path.exists() else "# Shipped models\n"
    if MEDUSA_MARK in text:
        text = text[:text.index(MEDUSA_MARK)].rstrip() + "\n"
    acc = stats["val_top1_by_head"]
    agree = stats.get("val_target_agreement_by_head", [float("nan")] * len(acc))
    rows = "\n".join(f"| {k + 1} | t+{k + 2} | {a:.3f} | {g:.3f} |" for k, (a, g) in enumerate(zip(acc, agree)))
    text += f"""
{MEDUSA_MARK}

Medusa-1 heads (Cai et al. 2024) for speculative decoding with `tiny-gpt2` (chapter 07):
{stats['num_heads']} heads, each one residual block `h + SiLU(W h + b)` on the target's final hidden
state (after `ln_f`), scored by the target's own LM head (shared and frozen: Medusa-1 trains a
separate output matrix per head; sharing keeps the file at
{stats['parameters'] * 4 / 1e6:.1f} MB). {stats['parameters']:,} trained parameters, safetensors.

Training: `{stats['command'].strip()}` — the target frozen, the same corpus and 97 % / 3 % split as
above, {stats['num_windows']} random windows of {stats['seq_len']} tokens whose target hidden states are
computed once, {stats['steps']} AdamW steps of {stats['batch_size']} windows, lr {stats['lr']} with cosine
decay, seed {stats['seed']}, loss weights 0.8^k per head,
{'self-distilled: the labels are the target' + chr(39) + 's own teacher-forced arg-max' if stats.get('distill') else 'labels from the text'};
{stats['seconds'] / 60:.1f} min on {stats['threads']} thread(s) of a 2-core machine shared with other work.

Held-out top-1 accuracy (teacher-forced over validation windows):

| head | predicts | vs the text | vs the target's arg-max |
|---|---|---|---|
{rows}

The second column is what greedy verification accepts. Heads this small on a 4-layer model
guess far less well than the paper's on a 7B model (head 1 ≈ 0.6 there); a token tree of their
top-k (chapter 07) recovers part of it.
"""
    path.write_text(text)


def medusa_main(argv: list[str] | None = None) -> int:
    """``python -m labsupport.train medusa``: heads on the frozen shipped target, same corpus and split."""
    from .models import load_model
    from .speculative.medusa import MEDUSA_DIR, train_medusa

    parser = argparse.ArgumentParser(prog="python -m labsupport.train medusa",
                                     description="Train Medusa heads on the frozen tiny-gpt2 target.")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent.parent / "assets" / "models" / MEDUSA_DIR)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--heads", type=int, default=3)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--smoke", action="store_true", help="a few steps on a small corpus, for CI")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    target = load_model("tiny-gpt2", device="cpu")
    train_ids, val_ids = target_streams(target.tokenizer, target.eos_token_id, args.seed, args.smoke)  # the base split
    steps = 3 if args.smoke else args.steps
    heads, stats = train_medusa(target, train_ids, val_ids, num_heads=args.heads, steps=steps,
                                batch_size=args.batch_size, num_windows=8 if args.smoke else 384, seed=args.seed)
    stats.update(threads=args.threads, total_seconds=round(time.perf_counter() - t0, 1),
                 command="python -m labsupport.train medusa " + " ".join(argv or []))
    heads.save(args.out, stats)
    if not args.smoke:
        write_medusa_section(stats, args.out.parent / "README.md")
    print(f"medusa heads: {stats['parameters'] / 1e6:.2f} M parameters, {stats['seconds']:.0f} s, "
          f"validation top-1 by head {stats['val_top1_by_head']}; saved to {args.out}")
    return 0
