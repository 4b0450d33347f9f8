"""The course corpus: English text every machine with Python already has.

The docstrings and comment blocks of Python's own standard library plus the ``pydoc_data``
help topics (PSF licence). Paragraphs are re-flowed onto one line and whitespace is
collapsed, so greedy decoding repeats *words* (a useful lesson) instead of collapsing into runs
of spaces. Documents are joined with ``<|endoftext|>``. :func:`split_documents` is the one
97 % / 3 % split by document that every trained model and head uses (the same seed gives the
same split), :func:`encode_documents` the token stream of a split.
"""

from __future__ import annotations

import ast
import random
import re
import sysconfig
import textwrap
from pathlib import Path

import torch

EOT = "<|endoftext|>"
SKIP_DIRS = {"test", "tests", "idlelib", "lib2to3", "site-packages", "turtledemo",
             "ensurepip", "tkinter", "__pycache__", "dist-packages", "config-3"}


# ----------------------------------------------------------------------------- corpus

def _clean(text: str) -> str | None:
    """Dedent, re-flow each paragraph onto one line, drop paragraphs that are mostly symbols."""
    text = textwrap.dedent(text).strip()
    paragraphs = []
    for para in re.split(r"\n\s*\n", text):
        line = " ".join(para.split())
        if not line:
            continue
        letters = sum(ch.isalpha() for ch in line)
        if letters < 0.6 * len(line) or len(line) < 20:
            continue
        paragraphs.append(line)
    if not paragraphs:
        return None
    return "\n\n".join(paragraphs)


def _comment_blocks(source: str) -> list[str]:
    """Runs of two or more consecutive ``#`` comment lines, joined."""
    blocks, current = [], []
    for raw in source.splitlines():
        stripped = raw.strip()
        if stripped.startswith("#") and not stripped.startswith("#!"):
            current.append(stripped.lstrip("#").strip())
        else:
            if len(current) >= 2:
                blocks.append("\n".join(current))
            current = []
    if len(current) >= 2:
        blocks.append("\n".join(current))
    return blocks


def build_corpus(stdlib: Path | None = None, max_documents: int | None = None) -> list[str]:
    """Documents (str) from the standard library of the running Python, in a fixed order.

    Args:
        stdlib: the standard library folder (default: the running Python's).
        max_documents: stop early once this many raw documents are collected (smoke runs).

    Returns:
        A list of cleaned documents; each is one docstring, comment block or help topic.
    """
    stdlib = Path(stdlib or sysconfig.get_paths()["stdlib"])
    docs: list[str] = []
    for path in sorted(stdlib.rglob("*.py")):
        rel = path.relative_to(stdlib)
        if any(part in SKIP_DIRS or part.startswith("test") for part in rel.parts[:-1]):
            continue
        try:
            source = path.read_text(encoding="utf-8")
            tree = ast.parse(source)
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node, clean=True)
                if doc and len(doc) > 40:
                    docs.append(doc)
        docs.extend(_comment_blocks(source))
        if max_documents is not None and len(docs) >= max_documents:
            break
    try:
        from pydoc_data.topics import topics
        docs.extend(topics[k] for k in sorted(topics))
    except ImportError:  # pragma: no cover - some distributions strip pydoc_data
        pass
    cleaned = [c for c in (_clean(d) for d in docs) if c]
    return list(dict.fromkeys(cleaned))  # drop exact duplicates, keep order


# ----------------------------------------------------------------------------- tokenizer


def split_documents(docs: list[str], seed: int = 1234, val_fraction: float = 0.03) -> tuple[list[int], list[int]]:
    """``(train, validation)`` document indices: a seeded shuffle, the first ``val_fraction`` held out."""
    order = list(range(len(docs)))
    random.Random(seed).shuffle(order)
    n_val = max(1, int(val_fraction * len(docs)))
    return order[n_val:], order[:n_val]


def encode_documents(tokenizer, docs: list[str], which: list[int], eos_id: int) -> torch.Tensor:
    """The token stream of documents ``which``, each followed by ``eos_id``: ``(N,)`` long."""
    ids: list[int] = []
    for i in which:
        ids.extend(tokenizer(docs[i])["input_ids"])
        ids.append(eos_id)
    return torch.tensor(ids, dtype=torch.long)


def target_streams(tokenizer, eos_id: int, seed: int = 1234, smoke: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """``(train_ids, val_ids)``: the corpus split as the shipped models were trained on it, in a
    trained tokenizer's ids (what the draft heads for the frozen target train on); ``smoke``: a
    small corpus for CI."""
    docs = build_corpus(max_documents=600 if smoke else None)
    train_docs, val_docs = split_documents(docs, seed)
    return encode_documents(tokenizer, docs, train_docs, eos_id), encode_documents(tokenizer, docs, val_docs, eos_id)


_SPLIT_CACHE: dict = {}


def split_stream(tokenizer, eos_id: int, split: str = "validation", max_tokens: int | None = None,
                 seed: int = 1234) -> torch.Tensor:
    """The first ``max_tokens`` ids of one split of the shipped models' corpus (``"validation"``:
    held out from training; ``"train"``: for calibration), encoding only the documents needed.

    The documents are read once per process (≈ 7 s on a 2-core laptop) and kept.

    Raises:
        ValueError: ``split`` not ``"validation"`` / ``"train"``, ``max_tokens`` < 1.
    """
    from .validation import check_choice, check_int
    check_choice("split", split, ("validation", "train"))
    if max_tokens is not None:
        check_int("max_tokens", max_tokens, 1, hint=" or None")
    if "docs" not in _SPLIT_CACHE:
        _SPLIT_CACHE["docs"] = build_corpus()
    docs = _SPLIT_CACHE["docs"]
    train_docs, val_docs = split_documents(docs, seed)
    ids: list[int] = []
    for i in (val_docs if split == "validation" else train_docs):
        ids.extend(tokenizer(docs[i], verbose=False)["input_ids"])
        ids.append(eos_id)
        if max_tokens is not None and len(ids) >= max_tokens:
            break
    return torch.tensor(ids[:max_tokens], dtype=torch.long)
