"""Reproduce the shipped tiny GPT-2 models: ``python -m labsupport.train``.

The corpus is English text that every machine with Python already has: the docstrings and
comment blocks of Python's own standard library plus the ``pydoc_data`` help topics
(PSF licence). Paragraphs are re-flowed onto one line and whitespace is collapsed, so
greedy decoding repeats *words* (a useful lesson) instead of collapsing into runs of
spaces. Documents are joined with ``<|endoftext|>``.

Steps (each seeded):

1. build the corpus (``build_corpus``), split 97 % / 3 % by document;
2. train a byte-level BPE tokenizer (Hugging Face ``tokenizers``, vocabulary 4,096);
3. train the target GPT-2 and the smaller draft GPT-2 on the same token stream;
4. save both with ``save_pretrained`` (safetensors) plus the shared tokenizer under
   ``assets/models/{tiny-gpt2,tiny-gpt2-draft}`` and write ``train_stats.json`` (numbers for
   the model card).

``--smoke`` runs a few steps into a temporary folder (used by CI).

``python -m labsupport.train medusa`` trains Medusa heads (Cai et al. 2024) on the frozen
shipped target, on the same corpus and split, and saves them to ``assets/models/tiny-gpt2-medusa``
(:func:`labsupport.train_heads.medusa_main`); ``python -m labsupport.train eagle`` an EAGLE draft
head (Li et al. 2024) the same way, saved to ``assets/models/tiny-gpt2-eagle``
(:func:`labsupport.train_heads.eagle_main`).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from .corpus import EOT, build_corpus, encode_documents, split_documents


def train_tokenizer(docs: list[str], vocab_size: int = 4096):
    """Byte-level BPE (GPT-2 style) wrapped as a ``PreTrainedTokenizerFast``."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    bpe = ByteLevelBPETokenizer(add_prefix_space=False)
    bpe.train_from_iterator(docs, vocab_size=vocab_size, min_frequency=2, special_tokens=[EOT],
                            show_progress=False)
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, bos_token=EOT, eos_token=EOT,
                                  unk_token=EOT, model_max_length=1024)
    return tok


# ----------------------------------------------------------------------------- training

@dataclass
class RunConfig:
    name: str
    n_layer: int
    n_embd: int
    n_head: int
    steps: int
    batch_size: int = 16
    seq_len: int = 256
    lr: float = 2e-3
    warmup: int = 100
    n_positions: int = 1024


def _lr_at(step: int, cfg: RunConfig) -> float:
    """Linear warm-up, then cosine decay to 10 % of the peak."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    progress = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


@torch.no_grad()
def evaluate(model, data: torch.Tensor, seq_len: int, max_batches: int = 40) -> float:
    """Validation perplexity (per token, natural log base) over non-overlapping windows."""
    model.eval()
    n = (len(data) - 1) // seq_len
    windows = torch.stack([data[i * seq_len:(i + 1) * seq_len + 1] for i in range(n)])[: max_batches * 16]
    total, count = 0.0, 0
    for chunk in windows.split(16):
        out = model(chunk[:, :-1], labels=chunk[:, :-1].clone())
        # labels shifted inside HF: loss over seq_len-1 predictions
        total += out.loss.item() * chunk.shape[0] * (seq_len - 1)
        count += chunk.shape[0] * (seq_len - 1)
    model.train()
    return math.exp(total / count)


def train_model(cfg: RunConfig, train_ids: torch.Tensor, val_ids: torch.Tensor, vocab_size: int,
                eos_id: int, seed: int):
    """Train one GPT2LMHeadModel; returns (model, stats dict)."""
    from tqdm.auto import tqdm
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=vocab_size, n_positions=cfg.n_positions, n_embd=cfg.n_embd,
                        n_layer=cfg.n_layer, n_head=cfg.n_head, bos_token_id=eos_id,
                        eos_token_id=eos_id, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = GPT2LMHeadModel(config)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=cfg.lr, betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(seed)
    start = time.perf_counter()
    bar = tqdm(range(cfg.steps), desc=cfg.name, mininterval=5)
    for step in bar:
        for group in opt.param_groups:
            group["lr"] = _lr_at(step, cfg)
        idx = torch.randint(0, len(train_ids) - cfg.seq_len - 1, (cfg.batch_size,), generator=gen)
        batch = torch.stack([train_ids[i:i + cfg.seq_len] for i in idx.tolist()])
        loss = model(batch, labels=batch).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 50 == 0:
            bar.set_postfix(loss=f"{loss.item():.3f}")
    seconds = time.perf_counter() - start
    model.eval()
    stats = {**asdict(cfg), "seed": seed, "seconds": round(seconds, 1),
             "parameters": sum(p.numel() for p in model.parameters()),
             "val_perplexity": round(evaluate(model, val_ids, cfg.seq_len), 2)}
    return model, stats


@torch.no_grad()
def greedy_agreement(target, draft, val_ids: torch.Tensor, n_prompts: int = 20,
                     prefix_len: int = 16, new_tokens: int = 32, seed: int = 0) -> float:
    """Fraction of positions where the draft's argmax equals the target's greedy token.

    For each of ``n_prompts`` held-out prefixes the target decodes ``new_tokens`` greedily;
    the draft is teacher-forced on that same text and scored on argmax match per position.
    This is the acceptance rate α of greedy speculative decoding (Leviathan et al., 2023).
    """
    gen = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(val_ids) - prefix_len - 1, (n_prompts,), generator=gen).tolist()
    match = total = 0
    for s in starts:
        prompt = val_ids[s:s + prefix_len].unsqueeze(0)
        out = target.generate(prompt, max_new_tokens=new_tokens, do_sample=False,
                              pad_token_id=target.config.eos_token_id)
        n_new = out.shape[1] - prefix_len
        t_pred = target(out).logits[0, prefix_len - 1:prefix_len - 1 + n_new].argmax(-1)
        d_pred = draft(out).logits[0, prefix_len - 1:prefix_len - 1 + n_new].argmax(-1)
        match += int((t_pred == d_pred).sum())
        total += n_new
    return match / total


def write_model_card(stats: dict, path: Path) -> None:
    """Write ``assets/models/README.md`` from the numbers of a training run (``train_stats.json``)."""
    t, d = stats["models"]["tiny-gpt2"], stats["models"]["tiny-gpt2-draft"]

    def row(name: str, m: dict) -> str:
        return (f"| `{name}` | {m['n_layer']} | {m['n_embd']} | {m['n_head']} | {m['n_positions']} | "
                f"{m['parameters'] / 1e6:.2f} M | {m['steps']} × {m['batch_size']} × {m['seq_len']} | "
                f"{m['seconds'] / 60:.1f} min | {m['val_perplexity']} |")

    samples = "\n".join(f"| `{p}` | `{s!r}` |" for p, s in stats["greedy_samples"].items())
    text = f"""# Shipped models: `tiny-gpt2` (target) and `tiny-gpt2-draft` (draft)

Two GPT-2 models (`GPT2LMHeadModel`, fp32, safetensors) small enough to run every chapter on a
laptop CPU, sharing one byte-level BPE tokenizer ({stats['vocab_size']} tokens, one special token
`<|endoftext|>`, which is also EOS and padding). Loaded offline with
`labsupport.models.load_model("tiny-gpt2")` / `load_model("tiny-gpt2-draft")`.

## Corpus and licence

The docstrings (longer than 40 characters) and comment blocks (two or more consecutive `#`
lines) of the Python {stats['python']} standard library, outside tests, `idlelib`, `lib2to3`,
`tkinter`, `turtledemo` and `ensurepip`, plus the `pydoc_data` help topics. Paragraphs are
re-flowed onto one line and whitespace collapsed; paragraphs that are mostly symbols are dropped;
exact duplicates removed. {stats['documents']:,} documents, {stats['characters'] / 1e6:.2f} M
characters, {stats['train_tokens'] + stats['val_tokens']:,} tokens; 97 % / 3 % train / validation
split by document. The text is © Python Software Foundation, under the PSF licence
(Python Software Foundation License Version 2), which permits this use.

## How they were made

```bash
{stats['command'].strip()}
```

Seed {stats['models']['tiny-gpt2']['seed']} (draft: seed + 1), PyTorch {stats['torch']}, {stats.get('threads', 1)} CPU thread(s),
AdamW (lr 2e-3, betas 0.9 / 0.95, weight decay 0.1 on matrices), 100 warm-up steps then cosine
decay to 10 %, gradient clipping at 1.0, random {t['seq_len']}-token windows of the packed token stream.
Total time {stats['total_seconds'] / 60:.0f} min on a 2-core machine shared with other work.

| model | layers | n_embd | heads | n_positions | parameters | steps × batch × tokens | time | validation perplexity |
|---|---|---|---|---|---|---|---|---|
{row("tiny-gpt2", t)}
{row("tiny-gpt2-draft", d)}

Training windows are {t['seq_len']} tokens long: positions {t['seq_len']}–{t['n_positions'] - 1} exist (so long-context
timing experiments run) but were never trained, and text quality drops after about {t['seq_len']} tokens.

## Draft vs target

Greedy agreement of the draft with the target on 20 held-out prefixes of 16 tokens, 32
target-greedy tokens each (draft arg-max equals target arg-max, position by position):
**α ≈ {stats['greedy_agreement']:.2f}**. This is the acceptance rate of greedy speculative decoding.

## What the target writes (greedy, 24 tokens)

| prompt | continuation |
|---|---|
{samples}

Greedy decoding falls into repetition loops on many prompts — the sampling chapter uses this
as a live example.
"""
    path.write_text(text)


CARD_PROMPTS = ["Return the", "If the value is", "This module provides", "The default is",
                "Raise ValueError if"]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["medusa"]:
        from .train_heads import medusa_main
        return medusa_main(argv[1:])
    if argv[:1] == ["eagle"]:
        from .train_heads import eagle_main
        return eagle_main(argv[1:])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent.parent / "assets" / "models")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--target-steps", type=int, default=800)
    parser.add_argument("--draft-steps", type=int, default=1200)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--smoke", action="store_true", help="a few steps on a small corpus, for CI")
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)
    random.seed(args.seed)
    t0 = time.perf_counter()
    docs = build_corpus(max_documents=600 if args.smoke else None)
    if args.smoke:
        docs = docs[:400]
        args.target_steps, args.draft_steps = 3, 3
    train_idx, val_idx = split_documents(docs, args.seed)
    tok = train_tokenizer([docs[i] for i in train_idx], vocab_size=512 if args.smoke else 4096)
    eos = tok.eos_token_id
    train_ids, val_ids = (encode_documents(tok, docs, which, eos) for which in (train_idx, val_idx))
    corpus_chars = sum(len(d) for d in docs)
    print(f"corpus: {len(docs)} documents, {corpus_chars / 1e6:.2f} M characters, "
          f"{len(train_ids) + len(val_ids)} tokens ({corpus_chars / (len(train_ids) + len(val_ids)):.2f} chars/token)")

    runs = [RunConfig("tiny-gpt2", n_layer=4, n_embd=256, n_head=4, steps=args.target_steps),
            RunConfig("tiny-gpt2-draft", n_layer=2, n_embd=128, n_head=2, steps=args.draft_steps)]
    if args.smoke:
        runs = [RunConfig(r.name, r.n_layer, 64, 2, r.steps, batch_size=2, seq_len=32, warmup=1)
                for r in runs]
    models, stats = {}, {}
    for i, cfg in enumerate(runs):
        model, st = train_model(cfg, train_ids, val_ids, len(tok), eos, args.seed + i)
        models[cfg.name], stats[cfg.name] = model, st
        print(f"{cfg.name}: {st['parameters'] / 1e6:.2f} M parameters, {st['seconds']:.0f} s, "
              f"validation perplexity {st['val_perplexity']}")

    target, draft = models["tiny-gpt2"], models["tiny-gpt2-draft"]
    alpha = greedy_agreement(target, draft, val_ids, n_prompts=4 if args.smoke else 20)
    samples = {}
    for p in CARD_PROMPTS:
        ids = tok(p, return_tensors="pt")["input_ids"]
        out = target.generate(ids, max_new_tokens=24, do_sample=False, pad_token_id=eos)
        samples[p] = tok.decode(out[0, ids.shape[1]:])
    summary = {"python": sys.version.split()[0], "torch": torch.__version__,
               "documents": len(docs), "characters": corpus_chars,
               "train_tokens": len(train_ids), "val_tokens": len(val_ids),
               "vocab_size": len(tok), "greedy_agreement": round(alpha, 3), "threads": args.threads,
               "greedy_samples": samples, "models": stats,
               "total_seconds": round(time.perf_counter() - t0, 1),
               "command": "python -m labsupport.train " + " ".join(argv if argv is not None else sys.argv[1:])}
    out_dir = args.out
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, model in models.items():
        model.generation_config.pad_token_id = eos
        model.save_pretrained(out_dir / name, safe_serialization=True)
        tok.save_pretrained(out_dir / name)
    (out_dir / "train_stats.json").write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n")
    write_model_card(summary, out_dir / "README.md")
    print(f"draft/target greedy agreement α = {alpha:.3f}")
    for p, s in samples.items():
        print(f"  {p!r} → {s!r}")
    print(f"saved to {out_dir} in {summary['total_seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
