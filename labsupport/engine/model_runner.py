"""The model runner: a GPT-2 forward pass over the paged KV cache.

It reads the weights of a loaded ``transformers`` GPT-2 (any GPT-2-family checkpoint:
the shipped tiny models, ``gpt2``, ``distilgpt2`` …) and runs the same maths as
``GPT2LMHeadModel`` — token + position embeddings, per layer ``x + attn(ln_1(x))`` and
``x + mlp(ln_2(x))``, final layer norm, LM head — but with attention over the paged cache
(:mod:`labsupport.engine.attention`) and on a flat batch of the new tokens of many
sequences at once, some in prefill, some in decode.

The cache is one tensor ``(num_layers, 2, num_blocks, block_size, num_heads, head_dim)``
(with ``kv_cache_dtype="int8"`` / ``"fp8"`` it holds 8-bit codes and a second tensor
``kv_scales`` holds their scales: :mod:`labsupport.quant.kv`);
the :class:`~labsupport.engine.block_manager.BlockManager` decides which blocks each
sequence uses. The runner never sees the block manager: it takes block tables, as vLLM's model
runner takes attention metadata. :meth:`ModelRunner.extend` (speculative decoding) runs
several new tokens per sequence and returns the logits of every one.

Three files, one concept each: :mod:`~labsupport.engine.gpt2` (the blocks' weights),
:mod:`~labsupport.engine.kv_cache` (the cache tensors and every block move: copy-on-write, swap,
read / write of whole sequences) and this one (the forward: embeddings, the blocks over the paged
cache with the chosen attention backend, the LM head).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from ..quant import kv as kvq
from ..quant.int8 import QUANTIZATIONS, Int8Linear
from ..validation import check_choice, check_int
from . import native_attention
from .attention import AttentionMetadata, build_metadata, check_metadata, paged_attention
from .batch_invariant import check_settings
from .gpt2 import gpt2_layers
from .kv_cache import PagedKVCache
from .linear import Linear, tune
from .memory import check_pool_fits
from .native_attention import resolve_backend


class ModelRunner(PagedKVCache):
    """Runs a GPT-2 ``transformers`` model over a paged KV cache.

    Args:
        model: a ``GPT2LMHeadModel`` or a :class:`~labsupport.models.LoadedModel` holding one.
        block_size: token slots per block.
        num_blocks: blocks in the device cache.
        num_cpu_blocks: blocks of CPU swap space (allocated on first use).
        device: where the cache lives; default the model's device.
        kv_cache_dtype: ``"auto"`` (the model's dtype) or ``"int8"`` / ``"fp8"`` / ``"fp8_e5m2"``:
            8-bit KV with a scale per token and head (vLLM's option).
        quantization: ``None`` or ``"int8"``: every matrix as an :class:`~labsupport.quant.int8.Int8Linear`
            (int8 weights and activations; vLLM's option name).
        attention_backend: ``None`` (the fastest that runs here), ``"TORCH_SDPA"`` (paged attention by
            gather, :mod:`~labsupport.engine.attention`) or ``"CPU_ATTN"`` (the blocks read in place,
            :mod:`~labsupport.engine.native_attention`; float32 KV on the CPU, decode and verification
            steps, :func:`~labsupport.engine.native_attention.takes_step`; prompts and token trees still run
            ``TORCH_SDPA``). vLLM's option name.
        batch_invariant: every row's logits independent of the rest of the step — fixed-tile matmuls with
            one kernel, attention one token at a time (:mod:`~labsupport.engine.batch_invariant`; vLLM's
            ``VLLM_BATCH_INVARIANT=1``). Slower; not with ``quantization`` or ``"CPU_ATTN"``.

    Raises:
        ValueError: not a GPT-2-family model, sizes < 1, an unknown ``kv_cache_dtype``, ``quantization`` or
            ``attention_backend``, or ``"CPU_ATTN"`` where it cannot run (the message says why);
            ``batch_invariant`` with ``quantization`` or ``"CPU_ATTN"``.
        TypeError: ``batch_invariant`` not a bool.

    Attributes:
        layer_hook: ``None``, or ``hook(layer_index, meta)`` called in every forward right after
            a layer's new K/V are written (vLLM's ``save_kv_layer`` point: a KV connector can
            stream that layer while the next ones compute).
    """

    def __init__(self, model, block_size: int, num_blocks: int, num_cpu_blocks: int = 0,
                 device: torch.device | str | None = None, *, kv_cache_dtype: str = "auto",
                 quantization: str | None = None, attention_backend: str | None = None,
                 batch_invariant: bool = False):
        model = getattr(model, "model", model)                       # LoadedModel → its model
        cfg = getattr(model, "config", None)
        if getattr(cfg, "model_type", None) != "gpt2":
            raise ValueError(f"model must be a GPT-2-family model (config.model_type 'gpt2'), "
                             f"got {getattr(cfg, 'model_type', type(model).__name__)!r}")
        block_size, num_blocks = check_int("block_size", block_size, 1), check_int("num_blocks", num_blocks, 1)
        num_cpu_blocks = check_int("num_cpu_blocks", num_cpu_blocks, 0)
        self.kv_cache_dtype = kvq.check_kv_cache_dtype(kv_cache_dtype)
        self.quantization = check_choice("quantization", quantization, QUANTIZATIONS)
        self.batch_invariant = check_settings(batch_invariant, quantization, attention_backend)
        first = next(model.parameters())
        if quantization == "int8" and (first.dtype != torch.float32 or first.device.type != "cpu" or
                                       (device is not None and torch.device(device).type != "cpu")):
            raise ValueError("quantization='int8' runs PyTorch's int8 CPU kernels: it needs a float32 model on "
                             f"the CPU, got {first.dtype} on {first.device}")
        self.model = model
        self.block_size, self.num_blocks, self.num_cpu_blocks = block_size, num_blocks, num_cpu_blocks
        self.device = torch.device(device) if device is not None else next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.num_layers, self.num_heads = cfg.n_layer, cfg.n_head
        self.head_dim = cfg.n_embd // cfg.n_head
        self.max_positions = cfg.n_positions
        self.vocab_size = cfg.vocab_size
        self.eps = cfg.layer_norm_epsilon
        kv_dtype = kvq.storage_dtype(kv_cache_dtype) or self.dtype
        per_block = block_size * kvq.kv_bytes_per_token(self.num_layers, self.num_heads, self.head_dim, kv_cache_dtype,
                                                        model_bytes=self.dtype.itemsize)
        check_pool_fits("num_blocks", num_blocks, per_block, self.device)
        check_pool_fits("num_cpu_blocks", num_cpu_blocks, per_block, torch.device("cpu"))
        t = model.transformer
        self.wte, self.wpe = t.wte.weight.detach(), t.wpe.weight.detach()
        self.ln_f = (t.ln_f.weight.detach(), t.ln_f.bias.detach())
        self.lm_head = model.lm_head.weight.detach()                 # (V, E), tied to wte in GPT-2
        self.lm_head_linear = Linear(self.lm_head, out_in=True)
        if quantization == "int8":
            self.lm_head_linear = Int8Linear(self.lm_head)
        self.layers = gpt2_layers(model, quantization)
        # each matrix shape's fastest kernel per row count, measured once per process (linear.py)
        self.kernel_choices = {} if quantization == "int8" or batch_invariant else tune(self.matrices())
        if batch_invariant:                                             # fixed tiles, one kernel (batch_invariant.py)
            for m in self.matrices():
                m.use_batch_invariant()
        self.kv_cache = torch.zeros(self.cache_shape(num_blocks), dtype=kv_dtype, device=self.device)
        self.kv_scales = None if kv_cache_dtype == "auto" else \
            torch.ones(self.cache_shape(num_blocks)[:-1], dtype=torch.float16, device=self.device)
        self.cpu_cache: torch.Tensor | None = None
        self._workspace = torch.empty(0, dtype=self.kv_cache.dtype, device=self.device)   # gathered K/V (attention.py)
        self.attention_backend = "TORCH_SDPA" if batch_invariant else \
            resolve_backend(attention_backend, self.device, self.dtype, self.kv_cache_dtype, self.head_dim)
        self._scores = torch.empty(0)                                         # CPU_ATTN's score rows
        self.cpu_scales: torch.Tensor | None = None
        self.layer_hook: Callable[[int, AttentionMetadata], None] | None = None   # layer-wise KV streaming
        self.num_forwards = 0
        self.num_token_forwards = 0

    def matrices(self) -> list:
        """Every weight matrix a step multiplies by: each layer's four, then the LM head."""
        return [m for layer in self.layers for m in (layer.c_attn, layer.attn_proj, layer.c_fc, layer.mlp_proj)] + \
            [self.lm_head_linear]

    # ------------------------------------------------------------------ the forward pass
    @torch.inference_mode()
    def forward(self, token_ids: Sequence[Sequence[int]], start_positions: Sequence[int],
                block_tables: Sequence[Sequence[int]], all_logits: bool = False,
                tree_parents: Sequence[Sequence[int] | None] | None = None, *, num_layers: int | None = None,
                return_hidden: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """One forward step over the new tokens of several sequences.

        Args:
            token_ids: the new tokens of each sequence (a prefill chunk, or one token to decode).
            start_positions: each sequence's tokens already in the cache (position of its
                first new token).
            block_tables: each sequence's physical blocks, covering ``start + len(new)`` slots.
            all_logits: return a row for every new token instead of only each sequence's last.
            tree_parents: per sequence ``None`` or its new tokens' parents — a token tree
                verified in one forward (:func:`~labsupport.engine.attention.build_metadata`).
            num_layers: run only the first blocks (early exit: a self-speculative draft), then
                ``ln_f`` and the LM head; their K/V land in the cache like a full forward's.
            return_hidden: also return the hidden states after ``ln_f`` (the rows of the logits):
                Medusa heads and EAGLE read them.

        Returns:
            float32 logits: ``(B, vocab)`` (last new token of each sequence), or with
            ``all_logits`` ``(N, vocab)`` with the rows of sequence 0 first; with
            ``return_hidden`` the pair ``(hidden (rows, E), logits (rows, vocab))``.

        Raises:
            ValueError: an empty batch, a token id outside the vocabulary, a position past the
                model's ``n_positions``, or bad metadata.
        """
        if len(token_ids) == 0:
            raise ValueError("token_ids must hold at least one sequence, got an empty batch")
        query_lens = [len(t) for t in token_ids]
        ends = [s + q for s, q in zip(start_positions, query_lens)]
        if max(ends) > self.max_positions:
            raise ValueError(f"positions must be < n_positions={self.max_positions}, got a sequence of {max(ends)} tokens")
        self._check_blocks("block_tables", [b for t in block_tables for b in t], self.num_blocks)
        ids = [t for seq in token_ids for t in seq]
        if min(ids) < 0 or max(ids) >= self.vocab_size:                      # checked on the list: no tensor ops
            raise ValueError(f"token ids must be in [0, {self.vocab_size}), got {min(ids)}..{max(ids)}")
        in_place = self.attention_backend == "CPU_ATTN" and native_attention.takes_step(
            query_lens, tree=tree_parents is not None and any(p is not None for p in tree_parents))
        meta = build_metadata(query_lens, start_positions, block_tables, self.block_size, self.device, self.dtype,
                              tree_parents=tree_parents, num_heads=self.num_heads, mask=not in_place)
        flat = torch.tensor(ids, dtype=torch.long, device=self.device)
        hidden = self._blocks(flat, meta, num_layers, in_place)                   # (N, E)
        if not all_logits and len(ids) > len(query_lens):                     # pure decode: already one row each
            last = list(itertools.accumulate(query_lens, initial=-1))[1:]
            hidden = hidden.index_select(0, torch.tensor(last, device=self.device))   # (B, E)
        self.num_forwards += 1
        self.num_token_forwards += len(ids)
        hidden = F.layer_norm(hidden, hidden.shape[-1:], *self.ln_f, eps=self.eps)
        logits = self.lm_head_linear(hidden).float()
        return (hidden, logits) if return_hidden else logits

    def hidden_states(self, input_ids: torch.Tensor, meta: AttentionMetadata,
                      num_layers: int | None = None) -> torch.Tensor:
        """The transformer blocks on a flat batch: ``(N,)`` ids → ``(N, E)`` before ``ln_f``.

        ``num_layers`` runs only the first blocks (early exit: the self-speculative draft of
        LayerSkip, Elhoushi et al. 2024); their K/V land in the cache like a full forward's.

        Raises:
            ValueError: token ids outside the vocabulary, positions past ``n_positions``, or ``meta``
                addressing blocks outside the pool (:meth:`forward` builds ``meta`` itself and checks
                the lists it comes from instead).
        """
        ids = input_ids
        check_metadata(meta, self.num_blocks, self.block_size, self.device)
        if ids.numel() != meta.slot_mapping.numel() or ids.numel() != meta.positions.numel():
            raise ValueError(f"input_ids and meta must describe the same new tokens, got {ids.numel()} ids for "
                             f"{meta.slot_mapping.numel()} slots")
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.vocab_size):
            raise ValueError(f"token ids must be in [0, {self.vocab_size}), got {int(ids.min())}..{int(ids.max())}")
        if ids.numel() and int(meta.positions.max()) >= self.max_positions:
            raise ValueError(f"positions must be < n_positions={self.max_positions}, got {int(meta.positions.max())}")
        in_place = meta.mask is None and self.attention_backend == "CPU_ATTN" and \
            native_attention.takes_step(meta.query_lens, meta.tree)
        return self._blocks(input_ids, meta, num_layers, in_place)

    def _blocks(self, input_ids: torch.Tensor, meta: AttentionMetadata, num_layers: int | None,
                in_place: bool) -> torch.Tensor:
        """:meth:`hidden_states` without its checks (``forward`` checked the lists ``meta`` was built from);
        ``in_place``: attention by the ``CPU_ATTN`` kernel (``meta`` then has no mask)."""
        x = self.wte[input_ids] + self.wpe[meta.positions]                       # (N, E)
        n, e = x.shape
        workspace = None
        if in_place:                                                             # one plan for every layer
            need = meta.max_query_len * self.num_heads * meta.max_context_len
            if self._scores.numel() < need:
                self._scores = torch.empty(need)
            kernel, plan = native_attention.kernel(), native_attention.plan(meta, self.kv_cache.shape[1:],
                                                                            self._scores)
        elif self.kv_scales is None:                                             # one gather buffer for every layer
            need = 2 * meta.block_tables.numel() * self.block_size * self.num_heads * self.head_dim
            if self._workspace.numel() < need:
                self._workspace = torch.empty(need, dtype=self.kv_cache.dtype, device=self.device)
            workspace = self._workspace
        for i, layer in enumerate(self.layers[:num_layers]):
            h = F.layer_norm(x, (e,), *layer.ln_1, eps=self.eps)
            qkv = layer.c_attn(h)                                                 # (N, 3E)
            if in_place:                                     # the metadata was checked once, in forward()
                qkv = qkv if qkv.is_contiguous() else qkv.contiguous()
                a = torch.empty(n, e)                                             # (N, E)
                kernel(plan, qkv.data_ptr(), self.kv_cache[i].data_ptr(), layer.scale, a.data_ptr())
            else:
                q, k, v = qkv.view(n, 3, self.num_heads, self.head_dim).unbind(1)     # (N, H, D) each
                a = paged_attention(q, k, v, self.kv_cache[i], meta, layer.scale,
                                    None if self.kv_scales is None else self.kv_scales[i], self.kv_cache_dtype,
                                    workspace, self.batch_invariant)                                                         # (N, E)
            if self.layer_hook is not None:                                      # layer i's K/V are written
                self.layer_hook(i, meta)
            x = x + layer.attn_proj(a)
            h = F.layer_norm(x, (e,), *layer.ln_2, eps=self.eps)
            h = layer.act(layer.c_fc(h))                                          # (N, 4E)
            x = x + layer.mlp_proj(h)
        return x

    # ------------------------------------------------------------------ several tokens per sequence
    def extend(self, new_tokens: Sequence[Sequence[int]], start_positions: Sequence[int],
               block_tables: Sequence[Sequence[int]], all_logits: bool = True,
               tree_parents: Sequence[Sequence[int] | None] | None = None, *, num_layers: int | None = None,
               return_hidden: bool = False) -> list[torch.Tensor] | list[tuple[torch.Tensor, torch.Tensor]]:
        """:meth:`forward` with the rows split per sequence.

        Speculative decoding verifies a draft with it: feed ``[last, d_1 … d_γ]`` (or a token
        tree with ``tree_parents``), read ``γ + 1`` rows, then truncate the rejected slots in the
        block manager (``BlockManager.truncate``; nothing in the cache is zeroed, the next
        tokens overwrite them). The slots come from ``BlockManager.reserve``.

        Returns:
            per sequence its float32 logits ``(len(new_tokens[i]), vocab)`` (``(1, vocab)``
            without ``all_logits``), or with ``return_hidden`` the pair ``(hidden, logits)``.
        """
        out = self.forward(new_tokens, start_positions, block_tables, all_logits=all_logits,
                           tree_parents=tree_parents, num_layers=num_layers, return_hidden=return_hidden)
        sizes = [len(t) for t in new_tokens] if all_logits else [1] * len(new_tokens)
        if return_hidden:
            return list(zip(out[0].split(sizes), out[1].split(sizes)))
        return list(out.split(sizes))
