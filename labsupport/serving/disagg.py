"""Prefill/decode disaggregation on real processes (DistServe, Zhong et al. 2024; Splitwise,
Patel et al. 2024).

Two :class:`~labsupport.engine.LLMEngine` instances run in two OS processes:

* the **prefill worker** runs only prompts (``max_new_tokens = 1``); when a prompt's first
  token is sampled its KV connector gathers the prompt's K/V from the blocks and ships them
  (``send_blocks``) — or, with ``serve(..., layerwise=True)``, it has already streamed each
  layer while the prefill ran (:class:`~labsupport.serving.kv_transfer.LayerwiseKVConnector`);
* the **decode worker** receives them (``recv_blocks``, on a receiver thread so a transfer
  never waits for a decode step), writes them into its own pool with
  ``LLMEngine.add_prefilled_request`` and decodes.

The client (this process) sends each request at its arrival time and collects the results.
TTFT is the prefill worker's first token (it streams to the client at once); every later
token comes from the decode worker, so the first inter-token gap contains the transfer.
:func:`run_colocated` drives one engine through the same workload in this process.

Processes: ``spawn`` start method, pipes only (no network), one torch thread each, bounded by
timeouts; :class:`DisaggregatedServer` is a context manager that always stops and joins them.
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import threading
import time
import types
from collections import deque
from dataclasses import dataclass, field

import numpy as np
import torch
from typing_extensions import Self

from ..sampling import GREEDY
from ..validation import check_bool, check_int, check_real
from ..quant.kv import check_compress
from .kv_transfer import KVPayload, LayerAssembler, LayerwiseKVConnector, recv_blocks

__all__ = ["DisaggregatedServer", "ServeRequest", "ServeResult", "latency_table", "mixed_workload", "run_colocated"]


@dataclass
class ServeRequest:
    """One request of a workload: ``arrival`` seconds after the start."""

    request_id: str
    prompt_ids: list[int]
    max_new_tokens: int
    arrival: float = 0.0


@dataclass
class ServeResult:
    """What the client saw of one request (times on ``time.perf_counter``).

    Attributes:
        token_ids: generated tokens; finish_reason: the engine's; arrival_time, token_times.
        kv_bytes: bytes of KV shipped for it (0 colocated).
        transfer_time: seconds from the first token (end of the prefill) until the decode side
            had the whole KV: the transfer time the prefill did not hide (0 colocated).
    """

    request_id: str
    token_ids: list[int]
    finish_reason: str | None
    arrival_time: float
    token_times: list[float] = field(default_factory=list)
    kv_bytes: int = 0
    transfer_time: float = 0.0
    error: str | None = None

    @property
    def ttft(self) -> float:
        return self.token_times[0] - self.arrival_time

    @property
    def itl(self) -> list[float]:
        return list(np.diff(self.token_times))


def mixed_workload(vocab_size: int, num_pairs: int = 4, long_prompt: int = 600, long_new: int = 4,
                   short_prompt: int = 16, short_new: int = 48, gap: float = 0.03, seed: int = 0) -> list[ServeRequest]:
    """Alternating requests: a short prompt with a long answer, then a long prompt with a short
    answer, ``gap`` seconds apart (random token ids from a seeded generator).

    Raises:
        TypeError / ValueError: a size < 1, a gap < 0.
    """
    num_pairs = check_int("num_pairs", num_pairs, 1)
    for name, v in (("long_prompt", long_prompt), ("long_new", long_new), ("short_prompt", short_prompt),
                    ("short_new", short_new), ("vocab_size", vocab_size)):
        check_int(name, v, 1)
    gap = check_real("gap", gap, 0.0)
    rng = np.random.default_rng(seed)
    out = []
    for i in range(num_pairs):
        for kind, plen, new in (("short", short_prompt, short_new), ("long", long_prompt, long_new)):
            ids = rng.integers(0, vocab_size, plen).tolist()
            out.append(ServeRequest(f"{kind}{i}", ids, new, gap * len(out)))
    return out


def _result(engine, rid: str, kv_bytes: int = 0, transfer: float = 0.0) -> ServeResult:
    o = engine.output(rid)
    return ServeResult(rid, list(o.token_ids), o.finish_reason, o.metrics.arrival_time, list(o.metrics.token_times),
                       kv_bytes, transfer, o.error)


def run_colocated(lm, requests: list[ServeRequest], timeout: float = 120.0, **engine_kwargs) -> dict[str, ServeResult]:
    """One engine serves the workload in this process, in real time (one torch thread).

    Requests are added when their arrival time has come; the engine steps while it has work.

    Raises:
        TimeoutError: the run took longer than ``timeout`` seconds.
    """
    from ..engine import LLMEngine

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        engine = LLMEngine(lm, **engine_kwargs)
        todo = deque(sorted(requests, key=lambda r: r.arrival))
        start = time.perf_counter()
        while todo or engine.has_unfinished_requests():
            now = time.perf_counter()
            if now - start > timeout:
                raise TimeoutError(f"colocated run took longer than {timeout} s")
            while todo and start + todo[0].arrival <= now:
                r = todo.popleft()
                engine.add_request(r.prompt_ids, GREEDY, r.max_new_tokens, r.request_id, start + r.arrival)
            if engine.has_unfinished_requests():
                engine.step()
            elif todo:
                time.sleep(max(0.0, start + todo[0].arrival - time.perf_counter()))
        return {r.request_id: _result(engine, r.request_id) for r in requests}
    finally:
        torch.set_num_threads(threads)


# ----------------------------------------------------------------------------- the two workers

def _weights_only_model(state: dict[str, torch.Tensor], config: dict) -> torch.nn.Module:
    """A module tree with the parameter names of ``GPT2LMHeadModel`` and a plain config, built
    from a state dict: all the model runner reads. A worker builds it in a fraction of a second
    instead of importing ``transformers`` (the slow part of starting a worker)."""
    root = torch.nn.Module()
    for key, tensor in state.items():
        *path, leaf = key.split(".")
        node = root
        for name, nxt in zip(path, path[1:] + [leaf]):
            if not hasattr(node, name):
                child = torch.nn.ModuleList() if nxt.isdigit() else torch.nn.Module()
                if name.isdigit():
                    node.append(child)
                else:
                    setattr(node, name, child)
            node = node[int(name)] if name.isdigit() else getattr(node, name)
        setattr(node, leaf, torch.nn.Parameter(tensor, requires_grad=False))
    for block in root.transformer.h:
        block.mlp.act = torch.nn.Identity()                        # the runner uses its own gelu
    root.config = types.SimpleNamespace(**config)
    return root


def _load(model: tuple[dict, dict], engine_kwargs: dict, connector=None):
    torch.set_num_threads(1)
    from ..engine import LLMEngine

    engine = LLMEngine(_weights_only_model(*model), **engine_kwargs)
    engine.kv_connector = connector
    return engine


def _prefill_worker(model: tuple[dict, dict], engine_kwargs: dict, req_conn, kv_conn, deadline: float,
                    compress: str | None = None) -> None:
    """Run prompts only; ship each prompt's KV and first token to the decode worker."""
    connector = LayerwiseKVConnector(kv_conn, compress)
    engine = _load(model, engine_kwargs)
    connector.attach(engine)
    req_conn.send("ready")
    while time.perf_counter() < deadline:
        busy = engine.has_unfinished_requests()
        while req_conn.poll(0 if busy else 0.02):
            msg = req_conn.recv()
            if msg is None:                                        # the client is done
                connector.close()
                kv_conn.send(None)
                return
            rid, ids, max_new, arrival, layerwise = msg
            connector.max_new_tokens[rid] = max_new
            if layerwise:
                connector.layerwise.add(rid)
            engine.add_request(ids, GREEDY, 1, rid, min(arrival, engine.config.clock()))
            out = engine.output(rid)
            if out.finish_reason == "error":                       # could never run here: tell the client
                kv = torch.zeros(0)
                connector.layerwise.discard(rid)
                connector.send(KVPayload(rid, ids, 0, kv, max_new, arrival, arrival, extra={"error": out.error}))
            busy = True
        if busy:
            engine.step()


def _receiver(kv_conn, inbox: queue.Queue, deadline: float) -> None:
    assembler = LayerAssembler()
    while time.perf_counter() < deadline:
        try:
            payload = recv_blocks(kv_conn, 0.05)
        except EOFError:
            inbox.put(None)
            return
        if payload is not None and (payload := assembler.add(payload)) is not None:
            inbox.put(payload)


def _decode_worker(model: tuple[dict, dict], engine_kwargs: dict, kv_conn, out_conn, deadline: float) -> None:
    """Receive prefilled requests, install their KV, decode, send each finished result to the client."""
    from ..engine import NoFreeBlocksError

    engine = _load(model, engine_kwargs)
    inbox: queue.Queue = queue.Queue()
    threading.Thread(target=_receiver, args=(kv_conn, inbox, deadline), daemon=True).start()
    out_conn.send("ready")
    pending: deque[KVPayload] = deque()
    transfers: dict[str, tuple[int, float]] = {}
    stopping = False
    while time.perf_counter() < deadline:
        busy = engine.has_unfinished_requests() or bool(pending)
        try:
            while True:
                payload = inbox.get_nowait() if busy else inbox.get(timeout=0.02)
                if payload is None:
                    stopping = True
                    break
                if payload.extra.get("error"):
                    out_conn.send(ServeResult(payload.request_id, [], "error", payload.arrival_time,
                                              error=payload.extra["error"]))
                    continue
                pending.append(payload)
                busy = True
        except queue.Empty:
            pass
        while pending:
            p = pending[0]
            try:
                engine.add_prefilled_request(p.prompt_ids, p.first_token, p.kv, GREEDY, p.max_new_tokens, p.request_id,
                                             arrival_time=p.arrival_time, first_token_time=p.first_token_time)
            except NoFreeBlocksError:
                break
            pending.popleft()
            transfers[p.request_id] = (p.num_bytes, p.recv_time - p.first_token_time)
        if engine.has_unfinished_requests():
            for o in engine.step():
                if o.finished:
                    out_conn.send(_result(engine, o.request_id, *transfers.pop(o.request_id, (0, 0.0))))
        elif stopping and not pending:
            out_conn.send(None)
            return


class DisaggregatedServer:
    """A prefill worker and a decode worker in two processes, wired by pipes.

    Args:
        model: a loaded GPT-2 (a :class:`~labsupport.models.LoadedModel` or the bare model);
            its weights and config are sent to both workers, which rebuild it without
            importing ``transformers`` (so they start in a second or two).
        prefill_kwargs / decode_kwargs: :class:`~labsupport.engine.EngineConfig` fields of each engine.
        timeout: seconds the workers may live in all; each of them exits by then.
        kv_transfer_compress: ``None``, ``"int8"`` or ``"fp8"``: 8-bit KV on the wire between the
            workers (:class:`~labsupport.serving.kv_transfer.KVConnector`'s ``compress``).

    Use ``with DisaggregatedServer(...) as server: results = server.serve(requests)``.

    Raises:
        TimeoutError: a worker did not start, or results did not come, in time.
        RuntimeError: a worker died.
    """

    def __init__(self, model, prefill_kwargs: dict | None = None,
                 decode_kwargs: dict | None = None, timeout: float = 120.0, kv_transfer_compress: str | None = None):
        model = getattr(model, "model", model)
        if getattr(getattr(model, "config", None), "model_type", None) != "gpt2":
            raise ValueError(f"model must be a GPT-2-family model, got {type(model).__name__}")
        state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
        self.model = (state, model.config.to_dict())
        self.prefill_kwargs = dict(prefill_kwargs or {})
        self.decode_kwargs = dict(decode_kwargs or {})
        self.timeout = check_real("timeout", timeout, 1.0)
        self.kv_transfer_compress = check_compress("kv_transfer_compress", kv_transfer_compress)
        if self.prefill_kwargs.get("kv_cache_dtype", "auto") != "auto":      # here, not in a worker that would hang
            raise ValueError("prefill_kwargs['kv_cache_dtype'] must be 'auto': the prefill worker streams its cache "
                             f"layer by layer as stored (got {self.prefill_kwargs['kv_cache_dtype']!r}); ship 8-bit KV "
                             "with kv_transfer_compress='int8' instead")
        self._procs: list[mp.Process] = []

    def __enter__(self) -> Self:
        ctx = mp.get_context("spawn")
        self.deadline = time.perf_counter() + self.timeout
        self._req, req_child = ctx.Pipe()
        kv_recv, kv_send = ctx.Pipe(duplex=False)
        self._out, out_child = ctx.Pipe()
        self._procs = [
            ctx.Process(target=_prefill_worker, name="prefill-worker", daemon=True,
                        args=(self.model, self.prefill_kwargs, req_child, kv_send, self.deadline,
                              self.kv_transfer_compress)),
            ctx.Process(target=_decode_worker, name="decode-worker", daemon=True,
                        args=(self.model, self.decode_kwargs, kv_recv, out_child, self.deadline)),
        ]
        try:
            for p in self._procs:
                p.start()
            for conn in (self._req, self._out):
                if not conn.poll(min(60.0, self.timeout)) or conn.recv() != "ready":
                    raise TimeoutError("a worker did not start in time")
        except BaseException:
            self.close()
            raise
        return self

    def serve(self, requests: list[ServeRequest], layerwise: bool = False) -> dict[str, ServeResult]:
        """Send each request at its arrival time; the results, by request id.

        Args:
            layerwise: stream each prompt's KV layer by layer while it is prefilled (else the
                whole prompt's KV is sent once its first token is sampled).
        """
        layerwise = check_bool("layerwise", layerwise)
        results: dict[str, ServeResult] = {}

        def collect(wait: float) -> None:
            while self._out.poll(wait):
                r = self._out.recv()
                if r is None:
                    return
                results[r.request_id] = r
                wait = 0.0

        start = time.perf_counter() + 0.01
        for r in sorted(requests, key=lambda r: r.arrival):
            while time.perf_counter() < start + r.arrival:
                collect(max(0.0, min(0.002, start + r.arrival - time.perf_counter())))
            self._req.send((r.request_id, list(r.prompt_ids), r.max_new_tokens, start + r.arrival, layerwise))
        while len(results) < len(requests):
            if time.perf_counter() > self.deadline:
                raise TimeoutError(f"{len(results)} of {len(requests)} results came in time")
            if not all(p.is_alive() for p in self._procs):
                collect(0.0)
                if len(results) < len(requests):
                    raise RuntimeError("a worker died")
            collect(0.05)
        return results

    def close(self) -> None:
        """Tell the workers to stop, join them (a few seconds), terminate any still alive."""
        try:
            self._req.send(None)
        except (OSError, AttributeError, BrokenPipeError):
            pass
        started = [p for p in self._procs if p.pid is not None]
        for p in started:
            p.join(timeout=5.0)
        for p in started:
            if p.is_alive():
                p.terminate()
                p.join(timeout=2.0)
        self._procs = []

    def __exit__(self, *exc) -> None:
        self.close()


def latency_table(results: dict[str, ServeResult]) -> dict[str, float]:
    """TTFT and ITL of a run, p50 and p95, in milliseconds (numpy percentiles)."""
    ttft = [r.ttft for r in results.values() if r.token_times]
    itl = [g for r in results.values() for g in r.itl]
    pct = lambda v, q: 1e3 * float(np.percentile(v, q)) if v else float("nan")
    return {"ttft_p50": pct(ttft, 50), "ttft_p95": pct(ttft, 95), "itl_p50": pct(itl, 50), "itl_p95": pct(itl, 95)}
