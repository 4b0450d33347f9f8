"""The first cell of every chapter: seed, thread count, the shipped model, ``show_source``.

Each chapter starts with::

    from labsupport.lab import setup_chapter, show_source
    lm = setup_chapter()          # seeds 0, one torch thread, loads and describes tiny-gpt2

and shows the real implementation of what it teaches with ``show_source(top_p_filter)``
(the package's own code, not a teaching copy).
"""

from __future__ import annotations

import inspect
import textwrap
from typing import Any

from .i18n import set_language, tr
from .validation import check_int

#: One torch thread: the shipped 4.5 M-parameter model runs fastest without thread contention,
#: and the chapters' timings are for one thread like ``python -m labsupport.bench``.
DEFAULT_THREADS = 1


def describe(lm) -> str:
    """One line about a loaded model: layers, heads, width, parameters, vocabulary, device."""
    cfg = lm.model.config
    n_params = sum(p.numel() for p in lm.model.parameters())
    return tr("{name}: GPT-2 with {layers} layers, {heads} heads of {head_dim}, d_model {d_model},\n"
              "{params:.2f} M parameters ({mb:.1f} MB in fp32), vocabulary |V| = {vocab:,} tokens, on {device}",
              name=lm.name, layers=cfg.n_layer, heads=cfg.n_head, head_dim=cfg.n_embd // cfg.n_head,
              d_model=cfg.n_embd, params=n_params / 1e6, mb=n_params * 4 / 1e6, vocab=cfg.vocab_size,
              device=lm.device)                                       # two lines: a slide's width


SETUP_DONE = False
"""True once :func:`setup_chapter` ran in this kernel."""


def setup_chapter(model: str = "tiny-gpt2", *, seed: int = 0, threads: int = DEFAULT_THREADS,
                  device: str = "auto", verbose: bool = True, lang: str | None = None):
    """Seed everything, set torch's thread count, choose the language, load ``model`` and print what it is.

    Args:
        model: a shipped name (``"tiny-gpt2"``), a local folder or a Hugging Face id
            (see :func:`labsupport.models.load_model`).
        seed: seeds Python's, NumPy's and torch's global generators
            (:func:`labsupport.seed_everything`).
        threads: ``torch.set_num_threads(threads)``.
        device: ``"auto"``, ``"cpu"``, ``"cuda"``, ``"mps"``.
        verbose: print :func:`describe` of the model.
        lang: the language of the package's panels, quizzes and checks from now on, ``"en"`` or
            ``"ko"`` (:func:`labsupport.i18n.set_language`; the English chapters pass ``"en"``, the
            Korean edition ``"ko"``). ``None`` keeps the current one (``$LABSUPPORT_LANG``, else English).

    Returns:
        The :class:`~labsupport.models.LoadedModel`.

    Raises:
        TypeError: ``seed`` or ``threads`` not an integer.
        ValueError: ``seed`` < 0, ``threads`` < 1, ``lang`` not a language of
            :data:`labsupport.i18n.LANGUAGES`, or what :func:`~labsupport.models.load_model` raises.
    """
    import torch

    from . import seed_everything
    from .models import load_model

    check_int("seed", seed, 0)
    check_int("threads", threads, 1)
    if lang is not None:
        set_language(lang)
    seed_everything(seed)
    torch.set_num_threads(threads)
    lm = load_model(model, device=device)
    global SETUP_DONE
    SETUP_DONE = True                               # labsupport.setup_hint: a later NameError is a typo
    if verbose:
        print(describe(lm))
    return lm


def show_source(obj: Any, start: str | None = None, stop: str | None = None):
    """Display the real implementation of ``obj`` (a function, class or module of the package).

    ``start`` / ``stop`` show only a part: from the first line that contains ``start`` to the
    first line after it that contains ``stop`` (both included), dedented — the lines a chapter
    talks about, still read from the code that runs.

    Returns an ``IPython.display.Code`` object, which Jupyter renders with syntax colours.

    Raises:
        ValueError: ``start`` or ``stop`` is in no line of the source.
    """
    from IPython.display import Code

    source = inspect.getsource(obj)
    if start is not None or stop is not None:
        lines = source.splitlines(keepends=True)
        first = 0 if start is None else next((i for i, line in enumerate(lines) if start in line), None)
        if first is None:
            raise ValueError(f"start={start!r} is in no line of {getattr(obj, '__qualname__', obj)!r}")
        last = len(lines) - 1 if stop is None else next(
            (i for i in range(first, len(lines)) if stop in lines[i]), None)
        if last is None:
            raise ValueError(f"stop={stop!r} is in no line of {getattr(obj, '__qualname__', obj)!r} after start")
        source = textwrap.dedent("".join(lines[first:last + 1]))
    return Code(source, language="python")
