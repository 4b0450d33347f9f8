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
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from ..validation import check_real

__all__ = ["KVConnector", "KVPayload", "recv_blocks", "send_blocks"]


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

    @property
    def num_bytes(self) -> int:
        """Bytes of K/V shipped: ``kv.numel() · element size``."""
        return self.kv.numel() * self.kv.element_size()

    @property
    def transfer_time(self) -> float:
        """Seconds from the start of the send to the end of the receive."""
        return self.recv_time - self.send_time


def send_blocks(conn, payload: KVPayload) -> int:
    """Ship a payload over a ``multiprocessing`` connection; returns the KV bytes sent.

    The header (ids, times, shape, dtype) is pickled; the tensor goes as raw bytes with
    ``send_bytes`` (no pickling of the data).
    """
    kv = payload.kv.detach().contiguous().cpu()
    payload.send_time = time.perf_counter()
    header = {"request_id": payload.request_id, "prompt_ids": list(payload.prompt_ids),
              "first_token": int(payload.first_token), "max_new_tokens": int(payload.max_new_tokens),
              "arrival_time": payload.arrival_time, "first_token_time": payload.first_token_time,
              "send_time": payload.send_time, "shape": tuple(kv.shape), "dtype": str(kv.dtype).split(".")[-1],
              "extra": payload.extra}
    conn.send(header)
    data = kv.view(torch.uint8).numpy() if kv.numel() else np.zeros(0, np.uint8)
    conn.send_bytes(memoryview(data.reshape(-1)))
    return kv.numel() * kv.element_size()


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
    kv = torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dtype).reshape(header["shape"])
    return KVPayload(request_id=header["request_id"], prompt_ids=header["prompt_ids"],
                     first_token=header["first_token"], kv=kv, max_new_tokens=header["max_new_tokens"],
                     arrival_time=header["arrival_time"], first_token_time=header["first_token_time"],
                     send_time=header["send_time"], recv_time=time.perf_counter(), extra=header["extra"])


class KVConnector:
    """The prefill side's hook: set as ``engine.kv_connector``; when a request finishes (its
    first token sampled) the engine calls :meth:`request_finished` *before* freeing its blocks,
    and the connector gathers the prompt's K/V from them and ships it with :func:`send_blocks`.

    Args:
        conn: a ``multiprocessing`` connection to the decode side, or ``None`` to only collect
            the payloads in :attr:`sent` (tests, one-process demos).

    Attributes:
        sent: the payloads sent so far (their tensors dropped after sending when ``conn`` is set).
        bytes_sent: total KV bytes shipped.
    """

    def __init__(self, conn=None):
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
            self.bytes_sent += send_blocks(self.conn, payload)
            payload.kv = payload.kv[:, :, :0]                  # keep the record, not the data
        else:
            payload.send_time = payload.recv_time = time.perf_counter()
            self.bytes_sent += payload.num_bytes
        self.sent.append(payload)
