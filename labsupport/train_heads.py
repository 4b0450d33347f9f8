"""``python -m labsupport.train medusa`` and ``… eagle``: the draft heads of the frozen shipped target.

Same corpus and 97 % / 3 % split as :mod:`labsupport.train` (same seed, same document order,
:func:`labsupport.corpus.target_streams`). Medusa heads (:func:`labsupport.speculative.medusa.train_medusa`)
go to ``assets/models/tiny-gpt2-medusa``, the EAGLE head (:func:`labsupport.speculative.eagle.train_eagle`)
to ``assets/models/tiny-gpt2-eagle``; each is described in the model card
(:func:`write_medusa_section`, :func:`write_eagle_section`).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from .corpus import target_streams

MODELS = Path(__file__).resolve().parent.parent / "assets" / "models"


def _cli(name: str, description: str, out: str, steps: int, batch_size: int, windows: int, argv, extra=()):
    """The options both trainers take, parsed; the threads set; the frozen target and its corpus
    streams loaded. Returns ``(args, target, train_ids, val_ids, start time)``."""
    from .models import load_model

    def positive(text: str) -> int:
        value = int(text)
        if value < 1:
            raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text}")
        return value

    parser = argparse.ArgumentParser(prog=f"python -m labsupport.train {name}", description=description)
    parser.add_argument("--out", type=Path, default=None, help=f"default assets/models/{out}")
    parser.add_argument("--seed", type=int, default=1234)
    for flag, kind, default in extra:
        parser.add_argument(flag, type=kind, default=default)
    parser.add_argument("--steps", type=positive, default=steps)
    parser.add_argument("--batch-size", type=positive, default=batch_size)
    parser.add_argument("--windows", type=positive, default=windows,
                        help="training windows of 128 tokens whose target features are computed once")
    parser.add_argument("--threads", type=positive, default=2)
    parser.add_argument("--smoke", action="store_true", help="a few steps on a small corpus, for CI (needs --out)")
    args = parser.parse_args(argv)
    if args.smoke and args.out is None:
        parser.error("--smoke trains for 3 steps: give --out, or it would replace the shipped files in assets/models")
    args.out = args.out if args.out is not None else MODELS / out
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    target = load_model("tiny-gpt2", device="cpu")
    train_ids, val_ids = target_streams(target.tokenizer, target.eos_token_id, args.seed, args.smoke)  # the base split
    return args, target, train_ids, val_ids, start


def _finish_stats(stats: dict, args, start: float, name: str, argv) -> None:
    stats.update(threads=args.threads, total_seconds=round(time.perf_counter() - start, 1),
                 command=f"python -m labsupport.train {name} " + " ".join(argv or []))


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
    from .speculative.medusa import MEDUSA_DIR, train_medusa

    args, target, train_ids, val_ids, start = _cli("medusa", "Train Medusa heads on the frozen tiny-gpt2 target.",
                                                   MEDUSA_DIR, 2000, 8, 3072, argv, extra=[("--heads", int, 3)])
    heads, stats = train_medusa(target, train_ids, val_ids, num_heads=args.heads, steps=3 if args.smoke else args.steps,
                                batch_size=args.batch_size, num_windows=8 if args.smoke else args.windows, seed=args.seed)
    _finish_stats(stats, args, start, "medusa", argv)
    heads.save(args.out, stats)
    if not args.smoke:
        write_medusa_section(stats, args.out.parent / "README.md")
    print(f"medusa heads: {stats['parameters'] / 1e6:.2f} M parameters, {stats['seconds']:.0f} s, "
          f"validation top-1 by head {stats['val_top1_by_head']}; saved to {args.out}")
    return 0


EAGLE_MARK = "## EAGLE head (`tiny-gpt2-eagle`)"


def write_eagle_section(stats: dict, medusa_agreement: float | None, path: Path) -> None:
    """Append (or replace) the EAGLE section of the model card ``assets/models/README.md``."""
    text = path.read_text() if path.exists() else "# Shipped models\n"
    if EAGLE_MARK in text:
        start = text.index(EAGLE_MARK)
        rest = text[start + len(EAGLE_MARK):]
        end = rest.find("\n## ")
        text = text[:start].rstrip() + "\n" + (rest[end:] if end >= 0 else "")
    medusa = (f"Medusa's head 1 guesses the same token with {medusa_agreement:.3f} (same windows, same metric)."
              if medusa_agreement is not None else "")
    text = text.rstrip() + f"""

{EAGLE_MARK}

An EAGLE-1 draft head (Li et al. 2024) for speculative decoding with `tiny-gpt2` (chapter 07): a
fusion layer `fc([h_(t-1); e(x_t)])` (2E → E) and one pre-norm transformer block, predicting the
target's next feature (hidden state after `ln_f`); the target's own embedding and LM head (frozen)
turn features into tokens. {stats['parameters']:,} trained parameters, safetensors.

Training: `{stats['command'].strip()}` — the target frozen, the same corpus and 97 % / 3 % split as
above, {stats['num_windows']} random windows of {stats['seq_len']} tokens whose target features are
computed once, {stats['steps']} AdamW steps of {stats['batch_size']} windows, lr {stats['lr']} with cosine
decay, seed {stats['seed']}; loss: smooth-L1 on the feature + 0.1 × cross-entropy against the
target's arg-max (EAGLE-1's); {stats['seconds'] / 60:.1f} min on {stats['threads']} thread(s).

Held-out top-1 agreement of its first draft token with the target's arg-max (teacher-forced):
{stats['val_target_agreement']:.3f}. {medusa}
"""
    path.write_text(text + "\n")


def eagle_main(argv: list[str] | None = None) -> int:
    """``python -m labsupport.train eagle``: the head on the frozen shipped target, same corpus and split."""
    from .speculative.eagle import EAGLE_DIR, train_eagle
    from .speculative.medusa import head_accuracy, load_medusa

    args, target, train_ids, val_ids, start = _cli("eagle", "Train an EAGLE draft head on the frozen tiny-gpt2 target.",
                                                   EAGLE_DIR, 600, 8, 384, argv)
    head, stats = train_eagle(target, train_ids, val_ids, steps=3 if args.smoke else args.steps,
                              batch_size=args.batch_size, num_windows=8 if args.smoke else args.windows, seed=args.seed)
    _finish_stats(stats, args, start, "eagle", argv)
    try:                                                       # the shipped Medusa heads, same metric
        medusa = head_accuracy(target, load_medusa(), val_ids, 128, against="target")[0]
    except FileNotFoundError:
        medusa = None
    stats["medusa_head1_target_agreement"] = None if medusa is None else round(medusa, 3)
    head.save(args.out, stats)
    if not args.smoke:
        write_eagle_section(stats, medusa, args.out.parent / "README.md")
    print(f"eagle head: {stats['parameters'] / 1e6:.2f} M parameters, {stats['seconds']:.0f} s, held-out agreement "
          f"{stats['val_target_agreement']} (Medusa head 1: {stats['medusa_head1_target_agreement']}); saved to {args.out}")
    return 0
