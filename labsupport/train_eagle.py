"""``python -m labsupport.train eagle``: an EAGLE draft head on the frozen shipped target.

Same corpus and 97 % / 3 % split as :mod:`labsupport.train` (same seed, same document order),
the head trained by :func:`labsupport.speculative.eagle.train_eagle`, saved to
``assets/models/tiny-gpt2-eagle`` and described in the model card (:func:`write_eagle_section`).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from .corpus import target_streams

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
    from .models import load_model
    from .speculative.eagle import EAGLE_DIR, train_eagle
    from .speculative.medusa import head_accuracy, load_medusa

    parser = argparse.ArgumentParser(prog="python -m labsupport.train eagle",
                                     description="Train an EAGLE draft head on the frozen tiny-gpt2 target.")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent.parent / "assets" / "models" / EAGLE_DIR)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--smoke", action="store_true", help="a few steps on a small corpus, for CI")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    target = load_model("tiny-gpt2", device="cpu")
    train_ids, val_ids = target_streams(target.tokenizer, target.eos_token_id, args.seed, args.smoke)  # the base split
    head, stats = train_eagle(target, train_ids, val_ids, steps=3 if args.smoke else args.steps,
                              batch_size=args.batch_size, num_windows=8 if args.smoke else 384, seed=args.seed)
    stats.update(threads=args.threads, total_seconds=round(time.perf_counter() - t0, 1),
                 command="python -m labsupport.train eagle " + " ".join(argv or []))
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
