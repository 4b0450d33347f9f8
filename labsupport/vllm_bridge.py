"""Run the same requests through vLLM (in its own venv) and through the course's engine.

vLLM does not live in the course's venv (its CPU build pins its own torch and transformers):
``make vllm`` creates ``.venv-vllm``. :class:`VLLMWorker` starts ``labsupport/vllm_worker.py``
with that venv's Python and talks to it in JSON lines over stdin/stdout (one command, one
answer; see the worker's docstring for the format), so nothing of vLLM is imported here.

:func:`drive` runs our :class:`~labsupport.engine.LLMEngine` with the loop the worker uses
for vLLM's ``LLMEngine`` (``add_request`` until ``max_in_flight`` are unfinished, ``step``,
collect), so both engines see the same requests in the same order, greedy, EOS ignored.
:func:`first_divergence` compares their tokens and, where they differ, how far apart the
two candidates' logits were (in fp32 a near-tie is the only innocent cause).

Why this is not :class:`labsupport.parallel.launcher.WorkerGroup`: that one forks workers of
*this* interpreter and joins them in a ``torch.distributed`` process group (chapter 09's
parallelism); vLLM must run in *another* interpreter with its own torch, so the only shared
ground is a pipe carrying JSON.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORKER = Path(__file__).resolve().parent / "vllm_worker.py"
HOW_TO = ("vLLM is not set up here: run `make vllm` in the course folder (it creates .venv-vllm with "
          "vLLM's CPU build, about 3.5 GB; on a machine with CUDA "
          "`make vllm VLLM_SPEC=vllm VLLM_TORCH_SPEC=torch VLLM_DROP=`), "
          "or point LABSUPPORT_VLLM_PYTHON at a Python that has vLLM.")


def vllm_python() -> Path | None:
    """The Python of the vLLM venv (``$LABSUPPORT_VLLM_PYTHON`` or ``.venv-vllm/bin/python``), or None."""
    env = os.environ.get("LABSUPPORT_VLLM_PYTHON")
    path = Path(env) if env else ROOT / ".venv-vllm" / "bin" / "python"
    return path if path.exists() else None


class VLLMError(RuntimeError):
    """vLLM's worker answered with an error, ended, or did not answer in time."""


class VLLMWorker:
    """A vLLM ``LLM`` in a child process (``.venv-vllm``), driven with JSON lines.

    Args:
        model: a folder with a Hugging Face model (the shipped ``assets/models/tiny-gpt2``).
        threads: CPU threads for vLLM (its OpenMP threads are bound to cores ``0..threads-1``).
        timeout: seconds to wait for any one answer (start-up included) before giving up.
        env: environment variables for vLLM's process only, on top of this one's (e.g.
            ``{"VLLM_BATCH_INVARIANT": "1"}``).
        **engine_args: vLLM engine arguments (``block_size``, ``max_num_seqs``,
            ``num_gpu_blocks_override``, ``enable_prefix_caching``, ``max_model_len``, …).

    Raises:
        VLLMError: no vLLM venv (the message says how to create it), or vLLM failed to start
            (the message ends with its last log lines).

    Use as a context manager; :meth:`close` ends the worker and every process it started.
    """

    def __init__(self, model: str | os.PathLike, *, threads: int = 1, timeout: float = 600,
                 env: Mapping[str, str] | None = None, **engine_args):
        python = vllm_python()
        if python is None:
            raise VLLMError(HOW_TO)
        self.timeout = timeout
        self.log = tempfile.NamedTemporaryFile("w+", prefix="vllm-worker-", suffix=".log",  # noqa: SIM115
                                               delete=False)          # lives as long as the worker; removed by close()
        extra = dict(env or {})
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
        env.update(extra, PYTHONUNBUFFERED="1")
        self._proc = subprocess.Popen([str(python), str(WORKER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=self.log, text=True, env=env, start_new_session=True)
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        try:
            self.info = self._call({"op": "start", "model": str(model), "threads": threads,
                                    "engine_args": engine_args})
        except BaseException:
            self.close()
            raise
        self.config: dict = self.info["config"]

    def _read(self) -> None:
        for line in self._proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def log_tail(self, lines: int = 12) -> str:
        """The error lines and the last lines vLLM printed (its log goes to a temporary file)."""
        self.log.flush()
        text = Path(self.log.name).read_text(errors="replace").splitlines()
        errors = list(dict.fromkeys(line for line in text if "Error: " in line))[:3]
        return "\n".join(["root cause (first error lines):", *errors, "last lines:", *text[-lines:]])

    def _call(self, command: dict, timeout: float | None = None) -> dict:
        if self._proc.poll() is not None:
            raise VLLMError(f"vLLM's worker has ended (exit {self._proc.returncode}):\n{self.log_tail()}")
        self._proc.stdin.write(json.dumps(command) + "\n")
        self._proc.stdin.flush()
        try:
            line = self._lines.get(timeout=timeout or self.timeout)
        except queue.Empty:
            raise VLLMError(f"vLLM gave no answer to {command['op']!r} in {timeout or self.timeout} s") from None
        if line is None:
            raise VLLMError(f"vLLM's worker ended during {command['op']!r}:\n{self.log_tail()}")
        answer = json.loads(line)
        if not answer.get("ok"):
            raise VLLMError(f"vLLM failed on {command['op']!r}: {answer.get('error')}\n{self.log_tail()}")
        return answer

    def run(self, requests: Sequence[dict], max_in_flight: int | None = None) -> dict:
        """Run requests ``{"prompt_token_ids": [...], "max_tokens": n}`` greedy, EOS ignored.

        Returns:
            ``{"seconds", "steps", "outputs": [{"request_id", "token_ids", "finish_reason",
            "token_times"}, …]}`` in request order (``seconds`` measured inside the worker).
        """
        return self._call({"op": "run", "requests": list(requests),
                           "max_in_flight": max_in_flight or len(requests)})

    def api(self) -> dict:
        """vLLM's signatures and ``SamplingParams`` fields, read from the installed package."""
        return self._call({"op": "api"})

    def close(self) -> None:
        """Ask the worker to exit; after 30 s end its whole process group (vLLM's engine core too)."""
        proc = self._proc
        if proc.poll() is None:
            try:
                proc.stdin.write(json.dumps({"op": "exit"}) + "\n")
                proc.stdin.flush()
                proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired, ValueError):
                pass
        try:
            os.killpg(proc.pid, 9)                 # its own session: vLLM's children, never ours
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait(timeout=10)
        self.log.close()
        Path(self.log.name).unlink(missing_ok=True)

    def __enter__(self) -> VLLMWorker:  # noqa: PYI034
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def plain_signature(fn) -> str:
    """A signature without annotations or ``self``, long defaults shortened to ``Type(…)``:
    ``(prompt, params=SamplingParams(…), max_new_tokens=None, request_id=None, arrival_time=None)``."""
    import inspect

    class Short:
        def __init__(self, value):
            self.text = repr(value) if len(repr(value)) <= 24 else f"{type(value).__name__}(…)"

        def __repr__(self) -> str:
            return self.text

    params = [p.replace(annotation=inspect.Parameter.empty,
                        default=p.default if p.default is inspect.Parameter.empty else Short(p.default))
              for p in inspect.signature(fn).parameters.values() if p.name != "self"]
    return str(inspect.Signature(params))


def requests_for(prompts: Sequence[Sequence[int]], max_tokens: int | Sequence[int]) -> list[dict]:
    """The request list both engines get: prompt ids and a number of new tokens each."""
    lengths = [max_tokens] * len(prompts) if isinstance(max_tokens, int) else list(max_tokens)
    return [{"prompt_token_ids": [int(t) for t in p], "max_tokens": int(n)} for p, n in zip(prompts, lengths)]


def drive(engine, requests: Sequence[dict], max_in_flight: int | None = None) -> dict:
    """Run requests through our ``LLMEngine`` with the worker's loop; the same answer shape.

    At most ``max_in_flight`` requests are unfinished at once (the next is added as soon as
    one finishes); greedy, EOS ignored. ``token_times`` are seconds from the start.
    """
    from .sampling import GREEDY

    params = GREEDY.replace(ignore_eos=True)
    window = max_in_flight or len(requests)
    pending, live = list(range(len(requests))), {}
    outputs: list[dict | None] = [None] * len(requests)
    times: dict[int, list[float]] = {i: [] for i in range(len(requests))}
    steps, start = 0, time.perf_counter()
    while pending or live:
        while pending and len(live) < window:
            i = pending.pop(0)
            rid = engine.add_request(requests[i]["prompt_token_ids"], params, max_tokens=requests[i]["max_tokens"])
            live[rid] = i
        step_out = engine.step()
        steps += 1
        now = time.perf_counter() - start
        for out in step_out:
            i = live.get(out.request_id)
            if i is None:
                continue
            times[i] += [now] * (len(out.token_ids) - len(times[i]))
            if out.finished:
                outputs[i] = {"request_id": out.request_id, "token_ids": list(out.token_ids),
                              "finish_reason": out.finish_reason, "token_times": times[i]}
                del live[out.request_id]
    return {"seconds": time.perf_counter() - start, "steps": steps, "outputs": outputs}


def latency(outputs: Sequence[dict]) -> dict[str, float]:
    """Median time to first token and median time per output token (s) over a run's requests.

    TTFT here is from the start of the run (the request was added at once or queued), TPOT
    the mean gap between a request's later tokens.
    """
    import statistics

    ttft = [o["token_times"][0] for o in outputs if o["token_times"]]
    tpot = [(o["token_times"][-1] - o["token_times"][0]) / (len(o["token_times"]) - 1)
            for o in outputs if len(o["token_times"]) > 1]
    return {"ttft": statistics.median(ttft), "tpot": statistics.median(tpot)}


def first_divergence(lm, requests: Sequence[dict], ours: Sequence[dict], theirs: Sequence[dict],
                     near_tie: float = 1e-3) -> list[dict]:
    """Every request whose greedy tokens differ between two runs, with the logits' gap there.

    At the first differing position ``t`` the context is prompt + the common prefix; the
    gap is ``logit[our token] − logit[their token]`` of our model there (fp32, full forward
    with Hugging Face). Greedy picks the larger logit, so a gap ≥ 0 that is tiny is a
    near-tie (rounding decides), and anything else is a real difference.

    Returns:
        ``[{"index", "position", "ours", "theirs", "gap", "near_tie"}, …]`` (empty = identical).
    """
    import torch

    found = []
    for k, (req, a, b) in enumerate(zip(requests, ours, theirs)):
        x, y = a["token_ids"], b["token_ids"]
        if x == y:
            continue
        t = next((i for i, (u, v) in enumerate(zip(x, y)) if u != v), min(len(x), len(y)))
        if t >= min(len(x), len(y)):                          # one is a prefix of the other: a length difference
            found.append({"index": k, "position": t, "ours": None, "theirs": None, "gap": None, "near_tie": False})
            continue
        ids = torch.tensor([list(req["prompt_token_ids"]) + x[:t]], device=lm.device)
        with torch.no_grad():
            logits = lm.model(ids).logits[0, -1].float()
        gap = float(logits[x[t]] - logits[y[t]])
        found.append({"index": k, "position": t, "ours": x[t], "theirs": y[t], "gap": gap,
                      "near_tie": abs(gap) <= near_tie})
    return found

