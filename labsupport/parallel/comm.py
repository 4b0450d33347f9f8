"""The communication of one rank, counted and timed: all-reduce, point-to-point, all-to-all.

Every parallel scheme of this package talks through a :class:`Comm`. It calls
``torch.distributed`` and keeps three counters: the bytes this rank *sent* (the payloads it
handed to ``send``), the number of operations, and the seconds spent inside them. With
``world_size == 1`` it needs no process group and every collective is the identity — the
single-process reference runs the very same code.

The all-reduce comes in two flavours:

* ``"ring"`` — our own ring all-reduce (reduce-scatter, then all-gather) built on
  ``isend``/``recv`` (Patarasuk & Yuan 2009; the algorithm NCCL uses for large messages):
  each rank sends ``2(p − 1)`` chunks of ``n / p`` elements, i.e. ``2(p − 1)/p · n`` elements,
  and that is exactly what the counter adds up, send by send;
* ``"torch"`` — ``torch.distributed.all_reduce`` (gloo or nccl pick their own algorithm);
  its bytes are *not observable* from Python, so the counter books the ring's volume for it.
"""

from __future__ import annotations

import time

import torch

from ..validation import check_choice, check_int

ALLREDUCE_KINDS = ("ring", "torch")


def worker_device() -> torch.device:
    """Where a task's tensors live: the rank's GPU when the process group runs nccl, else the CPU."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":                               # GPU work is asynchronous: wait before timing
        torch.cuda.synchronize(device)


def ring_factor(world_size: int) -> float:
    """Elements each rank sends per element reduced by a ring all-reduce: ``2(p − 1)/p``.

    Raises:
        TypeError / ValueError: ``world_size`` not an integer >= 1.
    """
    p = check_int("world_size", world_size, 1)
    return 2.0 * (p - 1) / p


class Comm:
    """One rank's view of the process group, with counters.

    Args:
        rank: this process's rank, ``0 … world_size − 1``.
        world_size: processes in the group (1 = no communication at all).
        allreduce: ``"ring"`` (own ring over send/recv, bytes counted as sent) or ``"torch"``.

    Attributes:
        bytes_sent: payload bytes this rank sent (ring: counted per send; torch: the ring's volume).
        ops: collectives / sends performed.
        seconds: wall-clock seconds spent inside communication calls.

    Raises:
        TypeError / ValueError: bad rank, size or kind.
    """

    def __init__(self, rank: int, world_size: int, allreduce: str = "ring"):
        self.world_size = check_int("world_size", world_size, 1)
        self.rank = check_int("rank", rank, 0, self.world_size - 1)
        self.allreduce = check_choice("allreduce", allreduce, ALLREDUCE_KINDS)
        self.device = worker_device() if self.world_size > 1 else torch.device("cpu")
        self.reset()

    def reset(self) -> None:
        """Zero the counters."""
        self.bytes_sent = 0
        self.ops = 0
        self.seconds = 0.0

    # ------------------------------------------------------------------ all-reduce
    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum of ``x`` over all ranks (every rank gets the same tensor back; same shape as ``x``)."""
        if self.world_size == 1:
            return x
        import torch.distributed as dist

        _sync(self.device)
        t0 = time.perf_counter()
        x = x.contiguous()
        if self.allreduce == "torch":
            dist.all_reduce(x)
            self.bytes_sent += round(x.numel() * x.element_size() * ring_factor(self.world_size))
        else:
            self._ring_all_reduce(x)
        _sync(self.device)
        self.ops += 1
        self.seconds += time.perf_counter() - t0
        return x

    def _ring_all_reduce(self, x: torch.Tensor) -> None:
        """In place: reduce-scatter (p − 1 steps), then all-gather (p − 1 steps) around the ring."""
        p, r = self.world_size, self.rank
        chunks = list(x.view(-1).tensor_split(p))           # p views of the flat tensor
        right, left = (r + 1) % p, (r - 1) % p
        for s in range(p - 1):                              # after this, rank r owns the sum of chunk r+1
            send_i, recv_i = (r - s) % p, (r - s - 1) % p
            incoming = torch.empty_like(chunks[recv_i])
            self._exchange(chunks[send_i], right, incoming, left)
            chunks[recv_i].add_(incoming)
        for s in range(p - 1):                              # pass the finished chunks around
            send_i, recv_i = (r + 1 - s) % p, (r - s) % p
            self._exchange(chunks[send_i], right, chunks[recv_i], left)

    def _exchange(self, out: torch.Tensor, dst: int, into: torch.Tensor, src: int) -> None:
        import torch.distributed as dist

        request = dist.isend(out, dst)
        dist.recv(into, src)
        request.wait()
        self.bytes_sent += out.numel() * out.element_size()

    # ------------------------------------------------------------------ point to point
    def send(self, x: torch.Tensor, dst: int):
        """Start sending ``x`` to rank ``dst``; returns the request (call ``.wait()`` before reusing ``x``)."""
        import torch.distributed as dist

        t0 = time.perf_counter()
        x = x.contiguous()
        request = dist.isend(x, dst)
        self.bytes_sent += x.numel() * x.element_size()
        self.ops += 1
        self.seconds += time.perf_counter() - t0
        return request

    def recv(self, shape: tuple[int, ...], src: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Receive a tensor of ``shape`` from rank ``src`` (blocks until it arrives)."""
        import torch.distributed as dist

        t0 = time.perf_counter()
        into = torch.empty(shape, dtype=dtype, device=self.device)
        dist.recv(into, src)
        self.ops += 1
        self.seconds += time.perf_counter() - t0
        return into

    # ------------------------------------------------------------------ all-to-all
    def all_to_all(self, chunks: list[torch.Tensor], use_collective: bool = True) -> list[torch.Tensor]:
        """Exchange: rank ``r`` sends ``chunks[d]`` to rank ``d``; returns what each rank sent here.

        Every chunk is ``(n_d, *row_shape)`` with the same row shape and dtype; sizes differ per
        pair, so the row counts travel first (a small all-to-all of counts, not counted as
        payload). ``use_collective=False`` (or a backend without all-to-all) does the same
        exchange with ``isend``/``recv`` pairs. Only chunks to *other* ranks count as bytes sent.

        Returns:
            ``received[s]`` = the chunk rank ``s`` sent to this rank (``received[rank]`` = own chunk).
        """
        p, r = self.world_size, self.rank
        if len(chunks) != p:
            raise ValueError(f"chunks must hold one tensor per rank ({p}), got {len(chunks)}")
        if p == 1:
            return [chunks[0]]
        import torch.distributed as dist

        t0 = time.perf_counter()
        chunks = [c.contiguous() for c in chunks]
        row_shape, dtype = tuple(chunks[0].shape[1:]), chunks[0].dtype
        counts_out = torch.tensor([c.shape[0] for c in chunks], dtype=torch.int64, device=self.device)
        counts_in = torch.empty(p, dtype=torch.int64, device=self.device)
        if use_collective:
            dist.all_to_all_single(counts_in, counts_out)
        else:
            requests = [dist.isend(counts_out[d:d + 1], d) for d in range(p) if d != r]
            for s in range(p):
                if s != r:
                    dist.recv(counts_in[s:s + 1], s)
            counts_in[r] = counts_out[r]
            for q in requests:
                q.wait()
        if use_collective:                                  # one flat buffer, split sizes per rank
            into = torch.empty((int(counts_in.sum()), *row_shape), dtype=dtype, device=self.device)
            dist.all_to_all_single(into, torch.cat(chunks), output_split_sizes=counts_in.tolist(),
                                   input_split_sizes=counts_out.tolist())
            received = list(into.split(counts_in.tolist()))
        else:
            received = [torch.empty((int(n), *row_shape), dtype=dtype, device=self.device) for n in counts_in]
            requests = [dist.isend(chunks[d], d) for d in range(p) if d != r and chunks[d].numel()]
            for s in range(p):
                if s != r and received[s].numel():
                    dist.recv(received[s], s)
            received[r] = chunks[r]
            for q in requests:
                q.wait()
        self.bytes_sent += sum(c.numel() * c.element_size() for d, c in enumerate(chunks) if d != r)
        self.ops += 1
        self.seconds += time.perf_counter() - t0
        return received


def all_to_all_available() -> bool:
    """Whether the current process group's backend implements ``all_to_all`` (tried on 1 element).

    Older gloo builds raise for it; call this on every rank at the same time.
    """
    import torch.distributed as dist

    p, device = dist.get_world_size(), worker_device()
    try:
        out = torch.empty(p, device=device)
        dist.all_to_all_single(out, torch.zeros(p, device=device))
        return True
    except (RuntimeError, NotImplementedError, ValueError):
        return False


def allreduce_timing_worker(rank: int, world_size: int, sizes: list[int], repeats: int = 20,
                            allreduce: str = "ring") -> dict:
    """Task: time all-reduces of ``sizes`` fp32 elements; medians per size (seconds) for a latency/bandwidth fit."""
    import torch.distributed as dist

    comm = Comm(rank, world_size, allreduce)
    out = {}
    for n in sizes:
        x = torch.ones(n, device=comm.device)
        comm.all_reduce(x.clone())                       # warm-up
        times = []
        for _ in range(repeats):
            dist.barrier()
            t0 = time.perf_counter()
            comm.all_reduce(x.clone())
            times.append(time.perf_counter() - t0)
        out[n] = sorted(times)[len(times) // 2]
    return out


def all_to_all_probe(rank: int, world_size: int) -> bool:
    """Task: :func:`all_to_all_available` on every rank (worker task ``labsupport.parallel.comm:all_to_all_probe``)."""
    return all_to_all_available()
