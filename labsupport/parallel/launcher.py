"""Start, use and stop a group of local worker processes joined by ``torch.distributed``.

A :class:`WorkerGroup` starts ``world_size`` processes (``torch.multiprocessing`` with the
*spawn* start method, so it works from a Jupyter kernel), joins them into one process group
(gloo on CPU, nccl when every rank has its own GPU) and keeps them alive, so a chapter pays
the start-up once and then runs many tasks::

    with WorkerGroup(world_size=2) as group:
        results = group.run("labsupport.parallel.tensor:tp_generate", weights=w, prompt_ids=ids, max_new_tokens=8)
        # results[r] is what rank r returned

A *task* is a function that lives in a module of the package (a notebook cannot hand a
function it defined to a spawned process: spawn pickles functions by their module name), named
``"module:function"`` and called in every worker as ``fn(rank, world_size, **kwargs)``.

Everything is local and bounded in time:

* the rendezvous goes through a file in a fresh temporary folder (``rendezvous="file"``, the
  default: no listening socket at all), or through torch's TCP store on ``127.0.0.1`` and a
  free port picked automatically (``rendezvous="tcp"``; torch's store listens on every
  interface of the machine, so use it on a trusted machine only); a ``port`` that is taken
  raises :class:`PortInUseError` before anything starts;
* gloo opens its connections on the loopback interface only (``GLOO_SOCKET_IFNAME``);
* with nccl each rank uses GPU ``rank`` and the tasks move their tensors there
  (:func:`labsupport.parallel.comm.worker_device`); results come back on the CPU;
* every collective has the group's ``timeout_s``; every :meth:`WorkerGroup.run` waits at most
  its ``timeout_s``; a worker that raises or dies, or a run that overruns, stops the whole
  group (its processes are terminated, then killed) and raises :class:`WorkerError`.
"""

from __future__ import annotations

import importlib
import os
import pickle
import queue
import shutil
import socket
import tempfile
import time
import traceback
from datetime import timedelta
from typing import Any

import torch
import torch.multiprocessing as mp

from ..validation import check_bool, check_choice, check_int, check_real, check_type


class WorkerError(RuntimeError):
    """A worker raised, died or overran its time limit; the group has been shut down."""


class PortInUseError(OSError):
    """The TCP port asked for is already taken on 127.0.0.1."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_port_free(port: int) -> int:
    """``port`` if it can be bound on 127.0.0.1.

    Raises:
        TypeError: not an integer.
        ValueError: outside ``[1, 65535]``.
        PortInUseError: something already listens there.
    """
    check_int("port", port, 1, 65535)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError as err:
            raise PortInUseError(f"port {port} on 127.0.0.1 is already in use ({err.strerror}); "
                                 "pass port=None to pick a free one") from err
    return port


def loopback_interface() -> str:
    """Name of the loopback network interface (``lo`` on Linux, ``lo0`` on macOS)."""
    names = [name for _, name in socket.if_nameindex()] if hasattr(socket, "if_nameindex") else []
    for name in ("lo", "lo0"):
        if name in names:
            return name
    return names[0] if names else "lo"


def resolve_task(name: str):
    """``"package.module:function"`` → the function (imported in the worker).

    Raises:
        ValueError: not of the form ``module:function``, or nothing of that name.
    """
    check_type("task", name, str)
    module_name, sep, fn_name = name.partition(":")
    if not sep or not module_name or not fn_name:
        raise ValueError(f"task must be 'module:function' (a function inside the package), got {name!r}")
    try:
        fn = getattr(importlib.import_module(module_name), fn_name)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"task must name an importable function, got {name!r} ({err})") from err
    return fn


def _worker_main(rank: int, world_size: int, init_method: str, backend: str, timeout_s: float,
                 tasks, results) -> None:
    """Body of one worker process: join the group, then run tasks until told to stop."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    try:
        if backend == "nccl":
            torch.cuda.set_device(rank)
        dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=timeout_s))
        results.put((rank, "ready", None))
    except Exception:                                      # noqa: BLE001 - reported to the parent
        results.put((rank, "error", traceback.format_exc()))
        return
    try:
        while True:
            job = tasks.get()
            if job is None:
                break
            job_id, name, kwargs = job
            try:
                out = resolve_task(name)(rank, world_size, **kwargs)
                results.put((rank, "result", (job_id, out)))
            except Exception:                              # noqa: BLE001 - reported to the parent
                results.put((rank, "error", traceback.format_exc()))
                break
    finally:
        try:
            dist.destroy_process_group()
        except Exception:                                  # noqa: BLE001, S110 - best effort at exit
            pass
    results.close()
    results.join_thread()                                  # every message has reached the pipe
    os._exit(0)                                            # skip seconds of interpreter teardown (torch)


class WorkerGroup:
    """``world_size`` local worker processes in one ``torch.distributed`` process group.

    Args:
        world_size: number of processes (ranks ``0 … world_size − 1``), 1–16.
        backend: ``"auto"`` (nccl when CUDA has at least ``world_size`` GPUs, else gloo),
            ``"gloo"`` or ``"nccl"``.
        timeout_s: limit of the start-up and of every collective inside the workers (seconds).
        rendezvous: ``"file"`` (a file store in a temporary folder, no socket) or ``"tcp"``.
        port: with ``"tcp"``: the port on 127.0.0.1 (``None`` = a free one).
        wait: wait here until every worker has joined; ``False`` returns at once (the workers
            import torch meanwhile) and the first :meth:`run` or :meth:`wait_ready` waits.

    Raises:
        TypeError / ValueError: bad arguments.
        PortInUseError: ``port`` is taken.
        WorkerError: a worker failed to join the group in time.
    """

    def __init__(self, world_size: int = 2, backend: str = "auto", timeout_s: float = 60.0,
                 rendezvous: str = "file", port: int | None = None, wait: bool = True):
        self.world_size = check_int("world_size", world_size, 1, 16)
        check_choice("backend", backend, ("auto", "gloo", "nccl"))
        self.timeout_s = check_real("timeout_s", timeout_s, 0, 3600, low_open=True)
        check_choice("rendezvous", rendezvous, ("file", "tcp"))
        if backend == "auto":
            backend = "nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= world_size else "gloo"
        if backend == "nccl" and torch.cuda.device_count() < world_size:
            raise ValueError(f"backend 'nccl' needs world_size <= {torch.cuda.device_count()} GPUs, got {world_size}")
        self.backend = backend
        if rendezvous == "tcp":
            self.port = None if port is None else check_port_free(port)
        elif port is not None:
            raise ValueError(f"port is only used with rendezvous='tcp', got port={port!r}")
        self._rendezvous, self._port = rendezvous, port
        check_bool("wait", wait)
        self.failed = False
        self._start(wait)

    def _start(self, wait: bool) -> None:
        """Start the worker processes (again, after :meth:`close`), with a fresh rendezvous."""
        self._tmp = tempfile.mkdtemp(prefix="labsupport-dist-")
        if self._rendezvous == "tcp":
            self.port = free_port() if self._port is None else self._port
            init_method = f"tcp://127.0.0.1:{self.port}"
        else:
            self.port = None
            init_method = "file://" + os.path.join(self._tmp, "rendezvous")
        os.environ.setdefault("GLOO_SOCKET_IFNAME", loopback_interface())   # inherited by the workers
        ctx = mp.get_context("spawn")
        self._tasks = [ctx.Queue() for _ in range(self.world_size)]
        self._results = ctx.Queue()
        self._procs = [ctx.Process(target=_worker_main, name=f"labsupport-rank{r}", daemon=True,
                                   args=(r, self.world_size, init_method, self.backend, self.timeout_s,
                                         self._tasks[r], self._results))
                       for r in range(self.world_size)]
        self._next_job = 0
        self.closed = False
        self.ready = False
        try:
            for p in self._procs:
                p.start()
        except BaseException:
            self.close()
            raise
        if wait:
            self.wait_ready()

    def wait_ready(self) -> WorkerGroup:
        """Block until every worker has joined the process group (at most ``timeout_s`` + 30 s).

        Raises:
            WorkerError: a worker failed or did not join in time (the group is shut down).
        """
        if not self.ready:
            self._collect("ready", self.timeout_s + 30.0)  # + the imports of a cold start
            self.ready = True
        return self

    # ------------------------------------------------------------------ running tasks
    def run(self, task: str, timeout_s: float = 120.0, **kwargs: Any) -> list[Any]:
        """Run ``task`` (``"module:function"``) on every rank; return the ranks' results in rank order.

        A group shut down by :meth:`close` starts its workers again here (so a notebook cell that
        uses the group still runs after a later cell closed it); one shut down by a failure does not.

        Raises:
            RuntimeError: the group was shut down by a failure (a worker raised, died or overran).
            TypeError: an argument that cannot be pickled (checked before anything is sent).
            WorkerError: a worker raised (its traceback is in the message), died, or the run
                took longer than ``timeout_s`` seconds; the group is shut down.
        """
        if self.closed and self.failed:
            raise RuntimeError("this WorkerGroup is closed after the failure reported above; start a new one")
        check_real("timeout_s", timeout_s, 0, 3600, low_open=True)
        resolve_task(task)                                 # fail here, not in the workers
        for name, value in kwargs.items():                 # a queue pickles in a feeder thread: a failure
            try:                                           # there is silent, and the workers never answer
                pickle.dumps(value)
            except Exception as err:
                raise TypeError(f"argument {name!r} of task {task!r} cannot be sent to the workers "
                                f"(not picklable: {type(err).__name__}: {err})") from err
        if self.closed:                                    # closed by close(): start again
            self._start(wait=False)
        self.wait_ready()
        self._next_job += 1
        for q in self._tasks:
            q.put((self._next_job, task, kwargs))
        return self._collect("result", timeout_s, self._next_job)

    def _collect(self, kind: str, timeout_s: float, job_id: int | None = None) -> list[Any]:
        out: dict[int, Any] = {}
        deadline = time.monotonic() + timeout_s
        while len(out) < self.world_size:
            try:
                rank, what, payload = self._results.get(timeout=0.1)
            except queue.Empty:
                dead = [(r, p.exitcode) for r, p in enumerate(self._procs) if not p.is_alive()]
                if dead:
                    self.failed = True
                    self.close()
                    raise WorkerError("worker(s) died: " + ", ".join(f"rank {r} exit code {c}" for r, c in dead))
                if time.monotonic() > deadline:
                    self.failed = True
                    self.close()
                    raise WorkerError(f"workers did not answer within {timeout_s:.0f} s "
                                      f"(waiting for {kind}); the group was shut down")
                continue
            if what == "error":
                self.failed = True
                self.close()
                hint = ""
                if "Address already in use" in payload or "EADDRINUSE" in payload:
                    hint = f" (port {self.port} is taken: start the group again with port=None)"
                raise WorkerError(f"rank {rank} failed{hint}:\n{payload}")
            if what == kind:
                if kind == "result":
                    got_id, payload = payload
                    if got_id != job_id:
                        continue
                out[rank] = payload
        return [out[r] for r in range(self.world_size)]

    # ------------------------------------------------------------------ shutting down
    def close(self, grace_s: float = 5.0) -> None:
        """Stop the workers: ask them to leave, then terminate, then kill; remove the rendezvous folder."""
        if self.closed:
            return
        self.closed = True
        for q in self._tasks:
            try:
                q.put(None)
            except (OSError, ValueError):
                pass
        started = [p for p in self._procs if p.pid is not None]
        deadline = time.monotonic() + grace_s
        for p in started:
            p.join(max(0.0, deadline - time.monotonic()))
        for p in started:
            if p.is_alive():
                p.terminate()
                p.join(2.0)
            if p.is_alive():
                p.kill()
                p.join(2.0)
        for q in (*self._tasks, self._results):
            q.cancel_join_thread()
            q.close()
        shutil.rmtree(self._tmp, ignore_errors=True)

    @property
    def pids(self) -> list[int]:
        """Process ids of the workers (rank order)."""
        return [p.pid for p in self._procs]

    def alive(self) -> bool:
        """True while the group is open and every worker runs."""
        return not self.closed and all(p.is_alive() for p in self._procs)

    def __enter__(self) -> WorkerGroup:  # noqa: PYI034
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):                                     # a forgotten group does not leave processes behind
        try:
            self.close(grace_s=1.0)
        except Exception:                                  # noqa: BLE001, S110 - never raise from __del__
            pass

    def __repr__(self) -> str:
        state = "closed" if self.closed else "running"
        return f"WorkerGroup(world_size={self.world_size}, backend={self.backend!r}, {state})"
