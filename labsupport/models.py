"""Loading the shipped tiny GPT-2 models (or any GPT-2-family checkpoint) onto a device.

``load_model("tiny-gpt2")`` needs no network: the weights and tokenizer ship in
``assets/models/``. A Hugging Face id such as ``"gpt2"`` works when it is cached locally or
the machine is online; offline it fails with a message naming the shipped models.
"""

from __future__ import annotations

import functools
import inspect
import os
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

ASSETS = Path(__file__).resolve().parent.parent / "assets"
MODELS_DIR = ASSETS / "models"
SHIPPED = {
    "tiny-gpt2": MODELS_DIR / "tiny-gpt2",
    "tiny-gpt2-draft": MODELS_DIR / "tiny-gpt2-draft",
}


@dataclass
class LoadedModel:
    """A causal LM with its tokenizer and device.

    Attributes:
        model: a ``transformers`` causal LM in eval mode (GPT-2 family for the engine).
        tokenizer: its (fast) tokenizer; ``pad_token`` is set (to EOS when the model has none).
        device: where the weights live; every tensor the package makes follows it.
        name: the name or path it was loaded from.
    """

    model: torch.nn.Module
    tokenizer: object
    device: torch.device
    name: str

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    @property
    def eos_token_id(self) -> int:
        return int(self.tokenizer.eos_token_id)

    @property
    def eos_token_ids(self) -> frozenset[int]:
        """Every end-of-sequence id: the tokenizer's and those of the model's config and
        generation config (instruction-tuned checkpoints often list several)."""
        from .stopping import model_eos_ids

        return model_eos_ids(self.model, self.tokenizer)

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (no special tokens added).

        Raises:
            TypeError: ``text`` is not a str.
            ValueError: ``text`` holds a character that has no UTF-8 form (a lone surrogate, as
                a broken copy-paste can leave), named with its position.
        """
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as err:
            bad = text[err.start]
            raise ValueError(f"text has a character that cannot be encoded, U+{ord(bad):04X} (a lone surrogate) at "
                             f"position {err.start}: {text[max(0, err.start - 12):err.start]!r} ← here; "
                             "retype that part of the text") from None
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def decode(self, ids) -> str:
        """Text of a sequence of token ids."""
        return self.tokenizer.decode(list(ids))

    def token_str(self, token_id: int) -> str:
        """One token rendered for display (spaces shown as '␣', newlines as '⏎')."""
        return self.tokenizer.decode([int(token_id)]).replace(" ", "␣").replace("\n", "⏎")

    def __iter__(self):  # allows ``model, tokenizer, device = load_model(...)``
        return iter((self.model, self.tokenizer, self.device))


def pick_device(device: str | torch.device = "auto") -> torch.device:
    """``"auto"`` → cuda if available, else mps, else cpu; anything else is passed to torch.

    Raises:
        ValueError: ``device`` names a backend that is not available here.
    """
    if isinstance(device, torch.device):
        return device
    if device == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ValueError(f"device must be 'auto', 'cpu', 'cuda', 'mps' or a torch.device, got {device!r}") from err
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device must be one available here ('auto', 'cpu'), got {device!r}: "
                         "CUDA is not available")
    if dev.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"device must be one available here ('auto', 'cpu'), got {device!r}: "
                         "MPS is not available")
    return dev


def resolve_path(name_or_path: str | os.PathLike) -> str:
    """A shipped name → its folder; a local folder → itself; anything else is a hub id."""
    key = str(name_or_path)
    if key in SHIPPED:
        path = SHIPPED[key]
        if not (path / "config.json").exists():
            raise FileNotFoundError(
                f"shipped model {key!r} is missing at {path}; restore assets/ from git or run "
                "`python -m labsupport.train` to rebuild it")
        return str(path)
    if _names_a_folder(name_or_path) and not Path(key).expanduser().is_dir():
        raise ValueError(f"name_or_path {key!r} names a local folder that does not exist "
                         f"(resolved: {Path(key).expanduser().resolve()}); give a folder saved with "
                         f"save_pretrained, a shipped model {sorted(SHIPPED)}, or a Hugging Face id")
    return str(Path(key).expanduser()) if key.startswith("~") else key


def _names_a_folder(name_or_path: str | os.PathLike) -> bool:
    """True when ``name_or_path`` can only be a local path, never a Hugging Face id (``org/name``):
    a ``PathLike``, an absolute path, one starting with ``.`` or ``~``, one with two or more
    separators, or one whose parent folder exists here (``assets/missing``)."""
    key = str(name_or_path)
    if isinstance(name_or_path, os.PathLike) or key.startswith((".", "~", os.sep)) or os.path.isabs(key):
        return True
    parts = Path(key).parts
    return len(parts) > 2 or (len(parts) == 2 and Path(parts[0]).is_dir())


@contextmanager
def _quiet_progress(active: bool):
    """Hide transformers' progress bars while loading a local model (hub downloads keep theirs)."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    if active and was_enabled:
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if active and was_enabled:
            hf_logging.enable_progress_bar()


def load_model(name_or_path: str | os.PathLike = "tiny-gpt2", device: str | torch.device = "auto",
               dtype: torch.dtype | None = None) -> LoadedModel:
    """Load a causal LM and its tokenizer, in eval mode, on ``device``.

    Args:
        name_or_path: ``"tiny-gpt2"`` (target), ``"tiny-gpt2-draft"`` (draft), a local folder
            saved with ``save_pretrained``, or a Hugging Face id (needs a cache or network).
        device: ``"auto"`` (cuda > mps > cpu), ``"cpu"``, ``"cuda"``, ``"mps"`` or a
            ``torch.device``.
        dtype: weight dtype; default float32 (the shipped models are fp32).

    Returns:
        A :class:`LoadedModel` (also unpacks as ``model, tokenizer, device``).

    Raises:
        ValueError: unknown name offline, or an unavailable device.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dev = pick_device(device)
    path = resolve_path(name_or_path)
    local = Path(path).is_dir()
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=local)
        with _quiet_progress(local):  # no "Loading weights" bar in chapter outputs for shipped models
            model = AutoModelForCausalLM.from_pretrained(path, local_files_only=local,
                                                         dtype=dtype or torch.float32)
    except (OSError, ValueError) as err:              # a folder that is not a model: the tokenizer
        raise ValueError(                              # backend raises ValueError, not OSError
            f"name_or_path must be a shipped model {sorted(SHIPPED)}, a local folder, or a "
            f"Hugging Face id that is cached or reachable online; got {str(name_or_path)!r} "
            f"({err.__class__.__name__}: {str(err).splitlines()[0]})") from err
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.to(dev).eval()
    return LoadedModel(model=model, tokenizer=tokenizer, device=dev, name=str(name_or_path))


@functools.cache
def _cache_kwarg_of(model_class: type) -> str:
    params = inspect.signature(model_class.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def _cache_kwarg(model: torch.nn.Module) -> str:
    """The name the model's ``forward`` uses for the KV cache (``cache`` in transformers 5.x).

    Looked up once per model class (not stored on the model object).
    """
    return _cache_kwarg_of(type(model))


def model_forward(model: torch.nn.Module, input_ids: torch.Tensor, cache=None, *,
                  use_cache: bool = True, attention_mask: torch.Tensor | None = None,
                  position_ids: torch.Tensor | None = None):
    """One forward pass; returns ``(logits, cache)``.

    Args:
        input_ids: ``(batch, new_tokens)``.
        cache: the KV cache returned by the previous call (``None`` at prefill).
        use_cache: return a KV cache (``False`` recomputes everything next time).
        attention_mask: ``(batch, past + new)`` 1 for real tokens, 0 for padding.
        position_ids: ``(batch, new_tokens)``.

    Returns:
        logits ``(batch, new_tokens, vocab)`` and the updated cache (or ``None``).
    """
    kwargs = {"use_cache": use_cache}
    if cache is not None:
        kwargs[_cache_kwarg(model)] = cache
    if attention_mask is not None:
        kwargs["attention_mask"] = attention_mask
    if position_ids is not None:
        kwargs["position_ids"] = position_ids
    out = model(input_ids, **kwargs)
    if not use_cache:  # don't touch out.past_key_values: transformers 5 logs a deprecation warning
        return out.logits, None
    new_cache = getattr(out, "cache", None)
    if new_cache is None:
        new_cache = getattr(out, "past_key_values", None)
    return out.logits, new_cache


def max_positions(model: torch.nn.Module) -> int:
    """Longest sequence (tokens) the model's position embeddings allow."""
    cfg = model.config
    return int(getattr(cfg, "n_positions", None) or getattr(cfg, "max_position_embeddings", 2 ** 31 - 1))
