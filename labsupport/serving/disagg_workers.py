"""The two processes of disaggregated serving (:class:`~labsupport.serving.disagg.DisaggregatedServer`).

* the **prefill worker** runs only prompts (``max_new_tokens = 1``) and ships each prompt's KV and
  first token to the decode worker through its KV connector;
* the **decode worker** receives them on a receiver thread, installs them with
  ``LLMEngine.add_prefilled_request`` and decodes, sending each finished result to the client.

A request an engine refuses or can never run ends alone, as a result with ``finish_reason="error"``
and the reason. An exception a worker cannot handle ends the worker, but first goes to the client
as a :class:`WorkerDied` message, so the client says at once which worker died and why.
"""

from __future__ import annotations

import queue
import threading
import time
import types
from collections import deque
from dataclasses import dataclass

import torch

from ..sampling import GREEDY
from .kv_transfer import KVPayload, LayerAssembler, LayerwiseKVConnector, recv_blocks
from .workload import ServeResult, result_of

__all__ = ["WorkerDied", "decode_loop", "prefill_loop", "run_worker"]


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


@dataclass
class WorkerDied:
    """A worker's last message to the client: why it stops (the exception it could not handle)."""

    worker: str
    message: str


def run_worker(name: str, loop, client_conn, *args) -> None:
    """A worker process's target: ``loop(client_conn, *args)``. An exception it raises goes to the
    client as a :class:`WorkerDied` (reported at once, with this message) instead of ending the
    process silently."""
    try:
        loop(client_conn, *args)
    except BaseException as err:                                    # noqa: BLE001 - reported, then exit
        try:
            client_conn.send(WorkerDied(name, f"{type(err).__name__}: {err}"))
        except (OSError, ValueError):
            pass
        raise SystemExit(1) from None


def _error_payload(rid: str, ids: list[int], max_new: int, arrival: float, text: str) -> KVPayload:
    return KVPayload(rid, ids, 0, torch.zeros(0), max_new, arrival, arrival, extra={"error": text})


def prefill_loop(req_conn, model: tuple[dict, dict], engine_kwargs: dict, kv_conn, deadline: float,
                  compress: str | None = None) -> None:
    """Run prompts only; ship each prompt's KV and first token to the decode worker. A request this
    engine refuses or can never run goes on to the decode worker as an error payload (it reports it)."""
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
            try:
                engine.add_request(ids, GREEDY, 1, rid, min(arrival, engine.config.clock()))
                error = engine.output(rid).error if engine.output(rid).finish_reason == "error" else None
            except (TypeError, ValueError) as err:                 # refused: this request only
                error = f"{type(err).__name__}: {err}"
            if error is not None:                                  # could never run here: tell the client
                connector.send(_error_payload(rid, ids, max_new, arrival, error))
                continue
            connector.max_new_tokens[rid] = max_new
            if layerwise:
                connector.layerwise.add(rid)
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


def decode_loop(out_conn, model: tuple[dict, dict], engine_kwargs: dict, kv_conn, deadline: float) -> None:
    """Receive prefilled requests, install their KV, decode, send each finished result to the client.
    A request this engine refuses (or can never fit) comes back as a result with ``"error"``."""
    from ..engine import NoFreeBlocksError

    engine = _load(model, engine_kwargs)
    inbox: queue.Queue = queue.Queue()
    threading.Thread(target=_receiver, args=(kv_conn, inbox, deadline), daemon=True).start()
    out_conn.send("ready")
    pending: deque[KVPayload] = deque()
    transfers: dict[str, tuple[int, float]] = {}
    stopping = False

    def fail(p: KVPayload, text: str) -> None:
        out_conn.send(ServeResult(p.request_id, [], "error", p.arrival_time, error=text))

    while time.perf_counter() < deadline:
        busy = engine.has_unfinished_requests() or bool(pending)
        try:
            while True:
                payload = inbox.get_nowait() if busy else inbox.get(timeout=0.02)
                if payload is None:
                    stopping = True
                    break
                if payload.extra.get("error"):
                    fail(payload, payload.extra["error"])
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
            except (TypeError, ValueError) as err:                 # refused: this request only
                fail(p, f"{type(err).__name__}: {err}")
            else:
                transfers[p.request_id] = (p.num_bytes, p.recv_time - p.first_token_time)
            pending.popleft()
        if engine.has_unfinished_requests():
            for o in engine.step():
                if o.finished:
                    out_conn.send(result_of(engine, o.request_id, *transfers.pop(o.request_id, (0, 0.0))))
        elif stopping and not pending:
            out_conn.send(None)
            return



