"""Moving a request's KV cache between engines: the connector of disaggregated serving.

A prefill engine computes a prompt, samples its first token and, before it frees the
prompt's blocks, hands them to a *KV connector* that ships them to a decode engine
(DistServe, Zhong et al. 2024; Splitwise, Patel et al. 2024). The decode engine writes
them into blocks of its own pool and continues decoding. vLLM names this piece a KV
connector; here its two halves are::

    send_blocks(conn, payload)      # prefill side: K/V of every prompt token + first token
    recv_blocks(conn, timeout)      # decode side: the same payload, or None on timeout

The payload's tensor is ``(num_layers, 2, prompt_len, num_heads, head_dim)`` in the cache's
dtype, so the bytes on the wire are exactly the per-token KV size of chapter 03 times the
prompt length::

    bytes = prompt_len · 2 · L · H · D · bytes_per_element

(gathered from the blocks: the padding of the last block is not sent). The wire is a
``multiprocessing`` pipe (a local socket pair): one pickled header, then the raw tensor bytes.

``compress="int8"`` / ``"fp8"`` ships 8-bit codes with one fp16 scale per token and head — the
code of the engine's ``kv_cache_dtype`` (:mod:`labsupport.quant.kv`) — so the wire carries
``2·L·H·(D + 2)`` bytes per token instead of ``2·L·H·D·4``; the receiver dequantises.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from ..quant.kv import check_compress, dequantize_kv, quantize_kv
from ..validation import check_real

__all__ = ["KVConnector", "KVPayload", "LayerAssembler", "LayerwiseKVConnector", "recv_blocks", "send_blocks"]


@dataclass
class KVPayload:
    """One request's prefilled state on its way to a decode engine.

    Attributes:
        request_id: its id (kept on the decode side).
        prompt_ids: the prompt's token ids.
        first_token: the first output token (sampled by the prefill engine).
        kv: ``(num_layers, 2, len(prompt_ids), num_heads, head_dim)`` K/V of every prompt token.
        max_new_tokens: tokens the request may make in all (the first one included).
        arrival_time: when the request arrived (seconds, ``time.perf_counter``, system-wide on Linux).
        first_token_time: when the prefill engine sampled the first token (same clock).
        send_time / recv_time: when the transfer started / ended (same clock).
        extra: for a layer-wise piece ``{"layer": i or None (all layers), "start": first position,
            "prompt_len": P, "num_layers": L}`` (then ``kv`` is ``(1 or L, 2, n, H, D)``); ``{"layerwise": True}`` on the
            closing payload (empty ``kv``); ``{"error": text}`` when the prompt could not run.
    """

    request_id: str
    prompt_ids: list[int]
    first_token: int
    kv: torch.Tensor
    max_new_tokens: int
    arrival_time: float
    first_token_time: float
    send_time: float = 0.0
    recv_time: float = 0.0
    extra: dict = field(default_factory=dict)
    wire_bytes: int | None = None

    @property
    def num_bytes(self) -> int:
        """Bytes of K/V shipped: ``kv.numel() · element size``, or what a compressed send put on the wire."""
        return self.wire_bytes if self.wire_bytes is not None else self.kv.numel() * self.kv.element_size()

    @property
    def transfer_time(self) -> float:
        """Seconds from the start of the send to the end of the receive."""
        return self.recv_time - self.send_time


def _raw(t: torch.Tensor) -> memoryview:
    data = t.contiguous().view(torch.uint8).numpy() if t.numel() else np.zeros(0, np.uint8)
    return memoryview(data.reshape(-1))


def compress_kv(kv: torch.Tensor, compress: str) -> tuple[torch.Tensor, torch.Tensor, int]:
    """``(codes, scales, wire bytes)`` of a payload's K/V in 8 bits (:func:`labsupport.quant.kv.quantize_kv`)."""
    codes, scales = quantize_kv(kv, compress)
    return codes, scales, codes.numel() + 2 * scales.numel()


def send_blocks(conn, payload: KVPayload, compress: str | None = None) -> int:
    """Ship a payload over a ``multiprocessing`` connection; returns the KV bytes sent.

    The header (ids, times, shape, dtype) is pickled; the tensor goes as raw bytes with
    ``send_bytes`` (no pickling of the data). ``compress`` (``"int8"`` / ``"fp8"``): codes and
    scales go instead, two raw messages.
    """
    compress = check_compress("compress", compress)
    kv = payload.kv.detach().contiguous().cpu()
    payload.send_time = time.perf_counter()
    header = {"request_id": payload.request_id, "prompt_ids": list(payload.prompt_ids),
              "first_token": int(payload.first_token), "max_new_tokens": int(payload.max_new_tokens),
              "arrival_time": payload.arrival_time, "first_token_time": payload.first_token_time,
              "send_time": payload.send_time, "shape": tuple(kv.shape), "dtype": str(kv.dtype).split(".")[-1],
              "extra": payload.extra}
    if compress is None or kv.numel() == 0:
        conn.send(header)
        conn.send_bytes(_raw(kv))
        return kv.numel() * kv.element_size()
    codes, scales, wire = compress_kv(kv, compress)
    header.update(compress=compress, codes_dtype=str(codes.dtype).split(".")[-1])
    conn.send(header)
    conn.send_bytes(_raw(codes))
    conn.send_bytes(_raw(scales))
    return wire


def recv_blocks(conn, timeout: float = 30.0) -> KVPayload | None:
    """Receive one payload (blocking up to ``timeout`` seconds); ``None`` if nothing came.

    Raises:
        ValueError: ``timeout`` not a number ≥ 0.
        EOFError: the sender stopped (sent ``None``) or closed the connection.
    """
    timeout = check_real("timeout", timeout, 0.0)
    if not conn.poll(timeout):
        return None
    header = conn.recv()
    if header is None:
        raise EOFError("the sender has stopped")
    raw = conn.recv_bytes()
    dtype = getattr(torch, header["dtype"])
    wire = None
    if len(raw) == 0:                                        # an empty tensor (closing payload, error)
        kv = torch.zeros(header["shape"], dtype=dtype)
    elif "compress" in header:                               # codes, then scales: dequantise
        codes = torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(getattr(torch, header["codes_dtype"]))
        scales = torch.frombuffer(bytearray(conn.recv_bytes()), dtype=torch.uint8).view(torch.float16)
        codes, scales = codes.reshape(header["shape"]), scales.reshape(header["shape"][:-1])
        kv = dequantize_kv(codes, scales, header["compress"]).to(dtype)
        wire = codes.numel() + 2 * scales.numel()
    else:
        kv = torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dtype).reshape(header["shape"])
    return KVPayload(request_id=header["request_id"], prompt_ids=header["prompt_ids"],
                     first_token=header["first_token"], kv=kv, max_new_tokens=header["max_new_tokens"],
                     arrival_time=header["arrival_time"], first_token_time=header["first_token_time"],
                     send_time=header["send_time"], recv_time=time.perf_counter(), extra=header["extra"],
                     wire_bytes=wire)


class KVConnector:
    """The prefill side's hook: set as ``engine.kv_connector``; when a request finishes (its
    first token sampled) the engine calls :meth:`request_finished` *before* freeing its blocks,
    and the connector gathers the prompt's K/V from them and ships it with :func:`send_blocks`.

    Args:
        conn: a ``multiprocessing`` connection to the decode side, or ``None`` to only collect
            the payloads in :attr:`sent` (tests, one-process demos).
        compress: ``None`` (as the cache stores it), ``"int8"`` or ``"fp8"``: 8-bit codes and
            scales on the wire (with ``conn=None`` the collected payload holds the dequantised K/V).

    Attributes:
        sent: the payloads sent so far (their tensors dropped after sending when ``conn`` is set).
        bytes_sent: total KV bytes shipped.

    Raises:
        ValueError: an unknown ``compress``.
    """

    def __init__(self, conn=None, compress: str | None = None):
        self.compress = check_compress("compress", compress)
        self.conn = conn
        self.sent: list[KVPayload] = []
        self.bytes_sent = 0
        self.max_new_tokens: dict[str, int] = {}               # request id -> tokens it may make in all

    def request_finished(self, engine, seq, block_ids: list[int]) -> None:
        """Gather the prompt's K/V from ``block_ids`` and ship it with the first token."""
        metrics = engine.requests[seq.seq_id].metrics
        kv = engine.runner.read_kv(block_ids, len(seq.prompt_ids))
        payload = KVPayload(seq.seq_id, list(seq.prompt_ids), seq.output_ids[0], kv,
                            self.max_new_tokens.pop(seq.seq_id, 1), metrics.arrival_time, metrics.token_times[0])
        if self.conn is not None:
            self.bytes_sent += send_blocks(self.conn, payload, self.compress)
            payload.kv = payload.kv[:, :, :0]                  # keep the record, not the data
        else:
            if self.compress is not None and kv.numel():         # the round trip the wire would make
                codes, scales, payload.wire_bytes = compress_kv(kv, self.compress)
                payload.kv = dequantize_kv(codes, scales, self.compress).to(kv.dtype)
            payload.send_time = payload.recv_time = time.perf_counter()
            self.bytes_sent += payload.num_bytes
        self.sent.append(payload)


class LayerwiseKVConnector(KVConnector):
    """Streams each layer's K/V of a prompt as soon as the prefill writes it (vLLM's
    ``save_kv_layer``), on a sender thread, so the transfer overlaps the remaining layers'
    compute; :meth:`request_finished` then sends only what was not streamed (prefix-cache hits)
    and a closing payload with the first token. Requests not in :attr:`layerwise` are sent
    whole, as by :class:`KVConnector`. Attach with :meth:`attach` (sets the engine's
    ``kv_connector`` and its runner's ``layer_hook``).

    Args:
        conn: a ``multiprocessing`` connection to the decode side.
        compress: as :class:`KVConnector`.
    """

    def __init__(self, conn, compress: str | None = None):
        super().__init__(conn, compress)
        self.layerwise: set[str] = set()
        self._first_streamed: dict[str, int] = {}
        self._outbox: queue.Queue = queue.Queue()
        self._sender = threading.Thread(target=self._send_loop, daemon=True)
        self._sender.start()
        self.engine = None

    def attach(self, engine) -> None:
        """Hook into ``engine``. Raises ValueError for an 8-bit KV cache (layers are streamed as stored;
        use ``kv_cache_dtype="auto"`` there and ``compress`` for the wire)."""
        if engine.runner.quantized_kv:
            raise ValueError("LayerwiseKVConnector needs the prefill engine's kv_cache_dtype='auto' "
                             f"(got {engine.runner.kv_cache_dtype!r}); compress the wire with compress='int8'")
        self.engine = engine
        engine.kv_connector = self
        engine.runner.layer_hook = self.save_kv_layer

    def send(self, payload: KVPayload) -> None:
        """Queue a payload for the sender thread (in order with the streamed pieces)."""
        self._outbox.put(payload)

    def _send_loop(self) -> None:
        while (payload := self._outbox.get()) is not None:
            self.bytes_sent += send_blocks(self.conn, payload, self.compress)

    def save_kv_layer(self, layer: int, meta) -> None:
        """Queue layer ``layer``'s new K/V of every streamed sequence in this forward."""
        engine = self.engine
        bm, runner = engine.block_manager, engine.runner
        rows = meta.block_tables.tolist()
        offsets = [0]
        for q in meta.query_lens:
            offsets.append(offsets[-1] + q)
        for seq in engine.scheduler.running:
            if seq.seq_id not in self.layerwise or not bm.has_seq(seq.seq_id):
                continue
            table = bm.block_table(seq.seq_id)
            b = next((b for b, row in enumerate(rows) if row[:len(table)] == table), None)
            if b is None:
                continue
            slots = meta.slot_mapping[offsets[b]:offsets[b + 1]]
            start = int(meta.positions[offsets[b]])
            if start >= len(seq.prompt_ids):                          # decoding: nothing to stream
                continue
            self._first_streamed.setdefault(seq.seq_id, start)
            kv = runner.kv_cache[layer].flatten(1, 2).index_select(1, slots).unsqueeze(0).cpu()   # (1, 2, n, H, D)
            self._outbox.put(KVPayload(seq.seq_id, [], 0, kv, 0, 0.0, 0.0,
                                       extra={"layer": layer, "start": start, "prompt_len": len(seq.prompt_ids),
                                              "num_layers": runner.num_layers}))

    def request_finished(self, engine, seq, block_ids: list[int]) -> None:
        if seq.seq_id not in self.layerwise:
            metrics = engine.requests[seq.seq_id].metrics
            kv = engine.runner.read_kv(block_ids, len(seq.prompt_ids))
            self._outbox.put(KVPayload(seq.seq_id, list(seq.prompt_ids), seq.output_ids[0], kv,
                                       self.max_new_tokens.pop(seq.seq_id, 1), metrics.arrival_time,
                                       metrics.token_times[0]))
            return
        self.layerwise.discard(seq.seq_id)
        metrics = engine.requests[seq.seq_id].metrics
        first = self._first_streamed.pop(seq.seq_id, len(seq.prompt_ids))
        r = engine.runner
        if first > 0:                                                 # prefix hits were never computed here
            self._outbox.put(KVPayload(seq.seq_id, [], 0, r.read_kv(block_ids, first), 0, 0.0, 0.0,
                                       extra={"layer": None, "start": 0, "prompt_len": len(seq.prompt_ids),
                                              "num_layers": r.num_layers}))
        empty = torch.zeros(r.num_layers, 2, 0, r.num_heads, r.head_dim, dtype=r.dtype)
        self._outbox.put(KVPayload(seq.seq_id, list(seq.prompt_ids), seq.output_ids[0], empty,
                                   self.max_new_tokens.pop(seq.seq_id, 1), metrics.arrival_time,
                                   metrics.token_times[0], extra={"layerwise": True}))

    def close(self) -> None:
        """Send what is queued, stop the sender thread."""
        self._outbox.put(None)
        self._sender.join(timeout=30)


class LayerAssembler:
    """The decode side of layer-wise streaming: collects the pieces of each request and returns
    the complete payload (``kv`` of every layer and prompt token) when its closing payload comes."""

    def __init__(self) -> None:
        self._parts: dict[str, torch.Tensor] = {}
        self._bytes: dict[str, int] = {}                      # bytes on the wire of each request's pieces

    def add(self, payload: KVPayload) -> KVPayload | None:
        """Take one received payload; the complete one when it closes a request, else ``None``
        (a piece, kept). Payloads that are not layer-wise pass through unchanged."""
        extra = payload.extra
        if "prompt_len" in extra:
            kv = payload.kv
            buf = self._parts.get(payload.request_id)
            if buf is None:
                buf = torch.zeros(extra["num_layers"], 2, extra["prompt_len"], *kv.shape[3:], dtype=kv.dtype)
                self._parts[payload.request_id] = buf
            self._bytes[payload.request_id] = self._bytes.get(payload.request_id, 0) + payload.num_bytes
            stop = extra["start"] + kv.shape[2]
            if extra["layer"] is None:
                buf[:, :, extra["start"]:stop] = kv
            else:
                buf[extra["layer"], :, extra["start"]:stop] = kv[0]
            return None
        if extra.get("layerwise"):
            payload.kv = self._parts.pop(payload.request_id)
            payload.wire_bytes = self._bytes.pop(payload.request_id, 0)
        return payload
