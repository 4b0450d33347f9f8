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
import time

from typing_extensions import Self

from ..engine.config import make_config
from ..quant.kv import check_compress
from ..validation import check_bool, check_int, check_real, check_token_ids, check_type
from .disagg_workers import WorkerDied, decode_loop, prefill_loop, run_worker
from .workload import ServeRequest, ServeResult, latency_table, mixed_workload, run_colocated

__all__ = ["DisaggregatedServer", "ServeRequest", "ServeResult", "latency_table", "mixed_workload", "run_colocated"]


class DisaggregatedServer:
    """A prefill worker and a decode worker in two processes, wired by pipes.

    Args:
        model: a loaded GPT-2 (a :class:`~labsupport.models.LoadedModel` or the bare model);
            its weights and config are sent to both workers, which rebuild it without
            importing ``transformers`` (so they start in a second or two).
        prefill_kwargs / decode_kwargs: :class:`~labsupport.engine.EngineConfig` fields of each
            engine, checked here before any process starts.
        timeout: seconds the workers may live in all; each of them exits by then.
        kv_transfer_compress: ``None``, ``"int8"`` or ``"fp8"``: 8-bit KV on the wire between the
            workers (:class:`~labsupport.serving.kv_transfer.KVConnector`'s ``compress``).

    Use ``with DisaggregatedServer(...) as server: results = server.serve(requests)``.

    Raises:
        TypeError / ValueError: a bad setting (``prefill_kwargs`` / ``decode_kwargs`` named).
        TimeoutError: a worker did not start, or results did not come, in time.
        RuntimeError: "a worker died: ...", with the worker's own message (or its exit signal),
            as soon as it is seen; the server serves nothing after that.
    """

    def __init__(self, model, prefill_kwargs: dict | None = None,
                 decode_kwargs: dict | None = None, timeout: float = 120.0, kv_transfer_compress: str | None = None):
        model = getattr(model, "model", model)
        if getattr(getattr(model, "config", None), "model_type", None) != "gpt2":
            raise ValueError(f"model must be a GPT-2-family model, got {type(model).__name__}")
        for name, kw in (("prefill_kwargs", prefill_kwargs), ("decode_kwargs", decode_kwargs)):
            try:
                make_config(None, kw, name)                        # here, not in a worker process
            except (TypeError, ValueError) as err:
                raise type(err)(f"{name}: {err}") from None
        state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
        self.model = (state, model.config.to_dict())
        self.vocab_size = int(model.config.vocab_size)
        self.prefill_kwargs = dict(prefill_kwargs or {})
        self.decode_kwargs = dict(decode_kwargs or {})
        self.timeout = check_real("timeout", timeout, 1.0)
        self.kv_transfer_compress = check_compress("kv_transfer_compress", kv_transfer_compress)
        if self.prefill_kwargs.get("kv_cache_dtype", "auto") != "auto":      # here, not in a worker that would hang
            raise ValueError("prefill_kwargs['kv_cache_dtype'] must be 'auto': the prefill worker streams its cache "
                             f"layer by layer as stored (got {self.prefill_kwargs['kv_cache_dtype']!r}); ship 8-bit KV "
                             "with kv_transfer_compress='int8' instead")
        self._procs: list[mp.Process] = []
        self._served: set[str] = set()                             # request ids the workers have seen
        self._died: RuntimeError | None = None

    def __enter__(self) -> Self:
        ctx = mp.get_context("spawn")
        self.deadline = time.perf_counter() + self.timeout
        self._req, req_child = ctx.Pipe()
        kv_recv, kv_send = ctx.Pipe(duplex=False)
        self._out, out_child = ctx.Pipe()
        self._procs = [
            ctx.Process(target=run_worker, name="prefill-worker", daemon=True,
                        args=("prefill-worker", prefill_loop, req_child, self.model, self.prefill_kwargs, kv_send,
                              self.deadline, self.kv_transfer_compress)),
            ctx.Process(target=run_worker, name="decode-worker", daemon=True,
                        args=("decode-worker", decode_loop, out_child, self.model, self.decode_kwargs, kv_recv,
                              self.deadline)),
        ]
        try:
            for p in self._procs:
                p.start()
            for conn in (req_child, kv_recv, kv_send, out_child):   # the workers hold them now: a death is an EOF here
                conn.close()
            ready = {self._req: False, self._out: False}
            until = time.perf_counter() + min(60.0, self.timeout)
            while not all(ready.values()):
                for conn, done in list(ready.items()):
                    if not done and self._poll(conn, 0.02):
                        ready[conn] = self._recv(conn) == "ready"
                self._check_alive()
                if time.perf_counter() > until:
                    raise TimeoutError("a worker did not start in time")
        except BaseException:
            self.close()
            raise
        return self

    # -------------------------------------------------------------- a worker's death, seen at once
    def _dead(self, why: str) -> RuntimeError:
        self._died = self._died or RuntimeError(f"a worker died: {why}")
        return self._died

    def _poll(self, conn, wait: float) -> bool:
        try:
            return conn.poll(wait)
        except (EOFError, OSError):
            return True                                           # recv will say why

    def _recv(self, conn):
        """The next message; a worker's last words or a closed pipe raise "a worker died"."""
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            self._check_alive(wait=2.0)
            raise self._dead("its pipe closed with no message") from None
        if isinstance(msg, WorkerDied):
            raise self._dead(f"{msg.worker}: {msg.message}")
        return msg

    def _check_alive(self, wait: float = 0.0) -> None:
        """Raise "a worker died" if one has exited (its message first, if it sent one)."""
        for p in self._procs:
            p.join(timeout=wait) if wait else None
            if p.exitcode is None:
                continue
            conn = self._req if p.name == "prefill-worker" else self._out
            while self._poll(conn, 0.0):
                try:
                    msg = conn.recv()
                except (EOFError, OSError):
                    break
                if isinstance(msg, WorkerDied):
                    raise self._dead(f"{msg.worker}: {msg.message}")
            if p.exitcode == 0 and time.perf_counter() >= self.deadline:
                raise TimeoutError(f"{p.name} stopped at the server's deadline ({self.timeout:g} s after the start)")
            how = f"killed by signal {-p.exitcode}" if p.exitcode < 0 else f"exit status {p.exitcode}"
            raise self._dead(f"{p.name} ({how})")

    def _check_requests(self, requests) -> list[ServeRequest]:
        """Every request checked before any is sent (a refused call sends nothing)."""
        if not isinstance(requests, (list, tuple)):
            raise TypeError(f"requests must be a list of ServeRequest, got {type(requests).__name__}")
        seen: set[str] = set()
        for i, r in enumerate(requests):
            check_type(f"requests[{i}]", r, ServeRequest)
            rid = r.request_id
            if not isinstance(rid, str) or not rid:
                raise (TypeError if not isinstance(rid, str) else ValueError)(
                    f"request_id must be a non-empty str, got {rid!r} (requests[{i}])")
            if rid in seen or rid in self._served:
                where = "twice in this call" if rid in seen else "already, by an earlier call to this server"
                raise ValueError(f"request_id {rid!r} is used {where}; each request needs its own id")
            seen.add(rid)
            check_token_ids(f"prompt_ids of request {rid!r}", r.prompt_ids, self.vocab_size)
            check_int(f"max_new_tokens of request {rid!r}", r.max_new_tokens, 1)
            check_real(f"arrival of request {rid!r}", r.arrival, 0.0)
        return list(requests)

    def serve(self, requests: list[ServeRequest], layerwise: bool = False) -> dict[str, ServeResult]:
        """Send each request at its arrival time; the results, by request id.

        A request a worker refuses or can never run (e.g. a prompt that fills the context window)
        comes back with ``finish_reason="error"`` and its reason in ``error``; the others go on.

        Args:
            layerwise: stream each prompt's KV layer by layer while it is prefilled (else the
                whole prompt's KV is sent once its first token is sampled).

        Raises:
            TypeError / ValueError: a request with a bad ``request_id`` (empty, used twice, used by an
                earlier call), ``prompt_ids`` (empty, not ids in ``[0, vocab_size)``),
                ``max_new_tokens`` (< 1) or ``arrival`` (< 0); nothing is sent, the server goes on.
            RuntimeError: a worker died (now or before).
            TimeoutError: results did not come before the server's deadline.
        """
        layerwise = check_bool("layerwise", layerwise)
        requests = self._check_requests(requests)
        if self._died is not None:
            raise self._died
        results: dict[str, ServeResult] = {}

        def collect(wait: float) -> None:
            while self._poll(self._out, wait):
                r = self._recv(self._out)
                if r is None:
                    return
                results[r.request_id] = r
                wait = 0.0
            if self._poll(self._req, 0.0):                          # the prefill worker only ever says why it died
                self._recv(self._req)

        start = time.perf_counter() + 0.01
        for r in sorted(requests, key=lambda r: r.arrival):
            while time.perf_counter() < start + r.arrival:
                collect(max(0.0, min(0.002, start + r.arrival - time.perf_counter())))
            self._check_alive()
            try:
                self._req.send((r.request_id, list(r.prompt_ids), r.max_new_tokens, start + r.arrival, layerwise))
            except OSError:
                self._check_alive(wait=2.0)
                raise self._dead("the prefill worker's pipe is closed") from None
            self._served.add(r.request_id)
        while len(results) < len(requests):
            if time.perf_counter() > self.deadline:
                raise TimeoutError(f"{len(results)} of {len(requests)} results came in time")
            collect(0.05)
            if len(results) < len(requests):
                self._check_alive()
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
        for conn in (getattr(self, "_req", None), getattr(self, "_out", None)):
            if conn is not None:
                conn.close()
        self._procs = []

    def __exit__(self, *exc) -> None:
        self.close()
