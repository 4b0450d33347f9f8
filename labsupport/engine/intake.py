"""Request intake of :class:`~labsupport.engine.engine.LLMEngine`: everything that brings a request in or
takes one out between steps — ``add_request`` (checks, the context window, admission), ``add_prefilled_request``
(disaggregated serving), ``abort_request`` and ``fork`` (parallel sampling). The step loop itself is in
``engine.py``; the queues belong to the :class:`~labsupport.engine.scheduler.Scheduler`, which these methods
ask to place a request (``add``, ``start_running``, ``add_running_after``, ``add_waiting_at``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch

from ..sampling import GREEDY, SamplingParams
from ..stopping import StopRule, context_room
from ..validation import check_int, check_token_ids, check_type, is_real, renamed
from .block_pool import NoFreeBlocksError
from .metrics import RequestMetrics
from .outputs import RequestOutput
from .sequence import Sequence as Seq
from .sequence import SequenceStatus

__all__ = ["RequestIntake"]


class RequestIntake:
    """Mixed into :class:`~labsupport.engine.engine.LLMEngine` (which holds the state these methods use:
    ``requests``, ``scheduler``, ``block_manager``, ``runner``, ``config``, ``tokenizer``, ``generator``)."""

    def add_request(self, prompt: str | Sequence[int], params: SamplingParams = GREEDY,
                    max_tokens: int | None = None, request_id: str | None = None,
                    arrival_time: float | None = None, *, max_new_tokens: int | None = None) -> str:
        """Queue a request; returns its id.

        Args:
            prompt: text, or token ids.
            params: sampling settings (``params.max_tokens`` unless ``max_tokens`` is given;
                ``params.n > 1`` forks n samples sharing the prompt's blocks).
            max_tokens: most new tokens (overrides ``params.max_tokens``; vLLM's and
                ``SamplingParams``' name); cut to the context window (``n_positions`` − prompt length).
            request_id: default ``"0"``, ``"1"``, … in add order (skipping ids already taken).
            arrival_time: on the engine's clock, not later than now (the engine admits a request
                at once; it cannot hold one back until a future arrival); default now.
            max_new_tokens: the old name of ``max_tokens``, kept working with a ``DeprecationWarning``.

        Raises:
            TypeError: ``params`` not a SamplingParams, a prompt that is neither text nor ids.
            ValueError: empty prompt, ids outside the vocabulary, a text prompt without a
                tokenizer, ``max_tokens < 1``, both ``max_tokens`` and ``max_new_tokens``, a duplicate
                id, an arrival time in the future.
                A request that is valid but can never fit is *not* an exception: it finishes
                with ``"error"``.
        """
        check_type("params", params, SamplingParams)
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("prompt must be token ids when the engine has no tokenizer")
            ids, text = self.lm.encode(prompt), prompt
            check_token_ids("prompt", ids, self.runner.vocab_size)
        else:
            ids = check_token_ids("prompt", prompt, self.runner.vocab_size)
            text = self.tokenizer.decode(ids) if self.tokenizer is not None else ""
        max_tokens = renamed("max_tokens", max_tokens, "max_new_tokens", max_new_tokens)
        requested = params.max_tokens if max_tokens is None else check_int("max_tokens", max_tokens, 1)
        if request_id is None:
            request_id = str(next(self._ids))
            while request_id in self.requests:                    # the user took this one
                request_id = str(next(self._ids))
        request_id = str(request_id)
        if request_id in self.requests:
            raise ValueError(f"request_id {request_id!r} is already in use")
        now = self.config.clock()
        if arrival_time is not None and not (is_real(arrival_time) and arrival_time <= now):
            raise ValueError(f"arrival_time must be a time <= the engine clock now ({now}), got {arrival_time!r}")
        max_new, problem = self._admission(len(ids), requested)
        stop_rule = StopRule.from_params(params, self.eos_token_ids, max_new, self.runner.vocab_size)
        grammar = self._grammar(params)                             # compiled (bounded) before admission
        if grammar is not None:
            grammar.check_budget(max_new)
        seq = Seq(request_id, ids, max_new, params=params, prompt=text, generator=self._generator_for(params, 0),
                  stop_rule=stop_rule, metrics=RequestMetrics(now if arrival_time is None else arrival_time),
                  order=next(self._order), grammar=grammar)
        self.requests[request_id] = seq
        if problem is not None:
            self._fail(seq, problem, now)
        else:
            self.scheduler.add(seq)
        return request_id

    def _admission(self, prompt_len: int, requested: int) -> tuple[int, str | None]:
        """``(max_new_tokens cut to the context window, why the request can never run or None)``."""
        room = context_room(self.runner.max_positions, prompt_len)  # the context window's one rule
        max_new = max(1, min(requested, room))
        if room < 1:
            return max_new, (f"prompt of {prompt_len} tokens leaves no room in the context window "
                             f"(n_positions = {self.runner.max_positions})")
        return max_new, self.scheduler.why_never_fits(prompt_len, max_new)

    def add_prefilled_request(self, prompt_ids: Sequence[int], first_token: int, kv: torch.Tensor,
                              params: SamplingParams = GREEDY, max_tokens: int | None = None,
                              request_id: str | None = None, arrival_time: float | None = None,
                              first_token_time: float | None = None, *, max_new_tokens: int | None = None) -> str:
        """Admit a request another engine has prefilled (disaggregated serving, Zhong et al. 2024):
        its prompt's K/V are written into fresh blocks, ``first_token`` is its first output token,
        and it joins the running queue to decode. Prompt blocks this engine already caches
        (prefix caching) are reused and not overwritten.

        Args:
            prompt_ids: the prompt's token ids.
            first_token: the token the prefill engine sampled.
            kv: ``(num_layers, 2, len(prompt_ids), num_heads, head_dim)`` K/V of every prompt token.
            params, max_tokens, request_id, arrival_time: as :meth:`add_request` (``max_new_tokens``
                is ``max_tokens``' old name, with a ``DeprecationWarning``).
            first_token_time: when the first token was made (clock of this engine); default now.

        Raises:
            TypeError / ValueError: as :meth:`add_request`; a ``kv`` that is not a finite float
                tensor of the right shape.
            NoFreeBlocksError: no room now (``max_num_seqs`` running or too few blocks); nothing changes.
                A request that could never fit this engine is not an exception: it finishes with ``"error"``.
        """
        ids = check_token_ids("prompt_ids", prompt_ids, self.runner.vocab_size)
        first = check_token_ids("first_token", [first_token], self.runner.vocab_size)[0]
        r, bm = self.runner, self.block_manager
        expected = (r.num_layers, 2, len(ids), r.num_heads, r.head_dim)
        if not isinstance(kv, torch.Tensor):
            raise TypeError(f"kv must be a torch.Tensor, got {type(kv).__name__}")
        if tuple(kv.shape) != expected:
            raise ValueError(f"kv must be a tensor of shape {expected}, got {tuple(kv.shape)}")
        if not kv.is_floating_point():
            raise TypeError(f"kv must hold floating-point keys and values, got dtype {kv.dtype}")
        if not bool(torch.isfinite(kv).all()):
            raise ValueError("kv must be finite, got NaN or inf values")
        if r.quantized_kv:                                          # checked before anything is allocated
            from ..quant.kv import max_value
            top = max_value(r.kv_cache_dtype)
            if kv.numel() and float(kv.abs().max()) > top:
                raise ValueError(f"kv must hold values within ±{top:.3g} for kv_cache_dtype="
                                 f"{r.kv_cache_dtype!r}, got {float(kv.abs().max()):.3g}")
        max_tokens = renamed("max_tokens", max_tokens, "max_new_tokens", max_new_tokens)
        requested = params.max_tokens if max_tokens is None else check_int("max_tokens", max_tokens, 1)
        if self._admission(len(ids), requested)[1] is not None:    # can never run here: finishes with "error"
            return self.add_request(ids, params, max_tokens, request_id, arrival_time)
        if len(self.scheduler.running) >= self.config.max_num_seqs or not bm.can_allocate(ids):
            raise NoFreeBlocksError(f"no room for a prefilled request of {len(ids)} tokens now")
        rid = self.add_request(ids, params, max_tokens, request_id, arrival_time)
        seq = self.requests[rid]
        if seq.is_finished:                                       # could never fit: finished with "error"
            return rid
        cached = bm.allocate(rid, ids)
        r.write_kv(bm.block_table(rid), kv[:, :, cached:], start=cached)
        bm.mark_computed(rid, len(ids))
        seq.num_prefix_hit_tokens, seq.num_computed_tokens = cached, len(ids)
        self.scheduler.start_running(seq)
        now = self.config.clock() if first_token_time is None else first_token_time
        seq.metrics.first_scheduled_time = now
        if self._append_and_finish([(0, seq)], [first], now):
            self._reported.append(rid)
        return rid

    def abort_request(self, request_id: str | Sequence[str]) -> list[RequestOutput]:
        """Cancel requests in any state (waiting, running, mid chunked prefill, swapped out, a fork
        parent or child); their blocks are freed at once (registered prefix blocks stay reusable).

        Args:
            request_id: one id or a list of ids. Ids already finished are left as they are.

        Returns:
            the final :class:`RequestOutput` of each aborted request (``finish_reason="abort"``);
            they are not reported again by :meth:`step`.

        Raises:
            TypeError: ``request_id`` neither a str nor a list of str.
            ValueError: an unknown id (nothing is aborted then).
        """
        if not isinstance(request_id, (str, list, tuple)) or (
                not isinstance(request_id, str) and not all(isinstance(r, str) for r in request_id)):
            raise TypeError(f"request_id must be a request id (str) or a list of them, got {request_id!r}")
        ids = [request_id] if isinstance(request_id, str) else list(request_id)
        unknown = [r for r in ids if r not in self.requests]
        if unknown:
            raise ValueError(f"request_id {unknown[0]!r} is unknown")
        now, outs = self.config.clock(), []
        for rid in ids:
            seq = self.requests[rid]
            if seq.is_finished:
                continue
            self.scheduler.finish(seq, "abort")
            seq.metrics.finish_time = now
            outs.append(self.output(rid))
        return outs

    def _grammar(self, params: SamplingParams):
        """The compiled grammar of ``params.structured_output`` (cached per tokenizer and spec), or None.

        Raises:
            ValueError: structured output without a tokenizer.
        """
        if params.structured_output is None:
            return None
        if self.tokenizer is None:
            raise ValueError("structured_output needs a tokenizer (the engine was given a bare model)")
        from ..structured import compile_structured_output
        return compile_structured_output(params.structured_output, self.tokenizer, vocab_size=self.runner.vocab_size,
                                         eos_token_id=self.eos_token_id, device=self.runner.device)

    def _generator_for(self, params: SamplingParams, k: int) -> torch.Generator | None:
        if params.greedy:
            return None
        if params.seed is not None:
            return torch.Generator(device=self.runner.device).manual_seed(params.seed + k)
        return self.generator

    def fork(self, request_id: str, n: int) -> list[str]:
        """Add ``n`` copies of a running, decoding request that share its blocks (copy-on-write).

        Children beyond ``max_num_seqs`` wait at the front of the waiting queue and are
        recomputed when admitted (they never push the batch past the limit).
        The children ``"{id}.1"``, … continue from the same tokens with their own generators
        (child k seeded ``seed + k`` when the request has a seed). A name already taken by
        another request is skipped (``"{id}.{k+1}"``, …); the seed still follows k.

        Raises:
            TypeError / ValueError: ``n`` not an integer ≥ 1; unknown id, or a request that is
                not decoding right now.
        """
        n = check_int("n", n, 1)
        seq = self.requests.get(request_id)
        if seq is None:
            raise ValueError(f"request_id {request_id!r} is unknown")
        if seq.status != SequenceStatus.RUNNING or seq.is_prefill or not self.block_manager.has_seq(seq.seq_id):
            raise ValueError(f"request {request_id!r} must be running and decoding to fork, it is {seq.status}")
        return self._fork(seq, n)

    def _fork(self, parent: Seq, n: int, share_blocks: bool = True) -> list[str]:
        """``n`` children of ``parent``: sharing its blocks while the batch has room, else waiting at
        the front of the queue (always, with ``share_blocks=False``: each is prefilled on its own)."""
        new_ids = []
        last_running, waiting_at = parent, 0                          # children that wait go first in line
        for _ in range(n):
            k = len(parent.children) + 1                             # sample index: seed + k
            suffix = k
            while f"{parent.seq_id}.{suffix}" in self.requests:
                suffix += 1
            child_id = f"{parent.seq_id}.{suffix}"
            child = Seq(child_id, list(parent.prompt_ids), parent.max_new_tokens, list(parent.output_ids),
                        params=parent.params, prompt=parent.prompt, generator=self._generator_for(parent.params, k),
                        stop_rule=parent.stop_rule,
                        metrics=replace(parent.metrics, token_times=list(parent.metrics.token_times)),
                        order=next(self._order), forked=True, grammar=parent.grammar,
                        cursor=None if parent.cursor is None else parent.cursor.copy())
            if share_blocks and len(self.scheduler.running) < self.config.max_num_seqs:   # share the parent's blocks
                child.num_computed_tokens = parent.num_computed_tokens
                self.block_manager.fork(parent.seq_id, child_id)
                self.scheduler.add_running_after(child, last_running)
                last_running = child
            else:                                                      # full: it waits, recomputed when admitted
                self.scheduler.add_waiting_at(child, waiting_at)
                waiting_at += 1
            self.requests[child_id] = child
            parent.children.append(child_id)
            new_ids.append(child_id)
        parent.forked = True
        return new_ids
