"""Test helpers: small random GPT-2 models that load in milliseconds, fully offline."""

from __future__ import annotations

from functools import lru_cache

import torch

from labsupport.models import SHIPPED, LoadedModel

_FALLBACK_TEXT = (
    "Return the number of items in the list. If the value is not given, the default is used. "
    "This module provides functions for working with files and directories. Raise ValueError "
    "if the argument is negative. Hello, my dog is a little dog and it is a good dog. "
) * 20


@lru_cache(maxsize=1)
def shipped_tokenizer():
    """The shipped byte-level BPE tokenizer (or, before the assets exist, a small stand-in)."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    path = SHIPPED["tiny-gpt2"]
    if (path / "tokenizer.json").exists():
        tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    else:  # pragma: no cover - only while the models are being (re)built
        from tokenizers import ByteLevelBPETokenizer

        bpe = ByteLevelBPETokenizer()
        bpe.train_from_iterator([_FALLBACK_TEXT], vocab_size=300, special_tokens=["<|endoftext|>"],
                                show_progress=False)
        tok = PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, eos_token="<|endoftext|>",
                                      bos_token="<|endoftext|>", unk_token="<|endoftext|>")
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def make_tiny_lm(seed: int = 0, n_layer: int = 2, n_head: int = 2, n_embd: int = 64,
                 n_positions: int = 64, vocab_size: int | None = None) -> LoadedModel:
    """A random ``GPT2LMHeadModel`` (fp32, CPU, eval) with the shipped tokenizer (``vocab_size``
    other than the tokenizer's makes a model whose logits have another width)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    tok = shipped_tokenizer()
    torch.manual_seed(seed)
    cfg = GPT2Config(vocab_size=vocab_size or len(tok), n_layer=n_layer, n_head=n_head, n_embd=n_embd,
                     n_positions=n_positions, bos_token_id=tok.eos_token_id,
                     eos_token_id=tok.eos_token_id)
    model = GPT2LMHeadModel(cfg).eval()
    model.generation_config.pad_token_id = tok.pad_token_id
    return LoadedModel(model=model, tokenizer=tok, device=torch.device("cpu"), name=f"random-{seed}")


def prompts_for(lm, lengths, seed=0):
    """Random prompts (token id lists) of the given lengths, from a seeded generator."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, lm.model.config.vocab_size, (n,), generator=g).tolist() for n in lengths]


def pool_is_whole(engine) -> None:
    """Every request finished with a reason, the scheduler's queues are empty and the block
    pool is whole again (free + evictable = all GPU blocks, all CPU blocks free)."""
    bm = engine.block_manager
    bm.audit()
    assert bm.num_used_blocks == 0 and bm.num_free_blocks + bm.num_evictable_blocks == bm.num_blocks
    assert bm.num_free_cpu_blocks == bm.num_cpu_blocks
    sch = engine.scheduler
    assert not sch.running and not sch.waiting and not sch.swapped
    assert all(engine.output(r).finished and engine.output(r).finish_reason for r in engine.requests)
