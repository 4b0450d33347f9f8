"""The vLLM side of :mod:`labsupport.vllm_bridge`: a worker that runs inside ``.venv-vllm``.

Run by the bridge as ``.venv-vllm/bin/python labsupport/vllm_worker.py`` (by path, so it uses
nothing from the course package: the standard library and vLLM only). It speaks JSON lines:
one command object per line on stdin, one answer object per line on stdout; everything vLLM
prints goes to stderr (stdout is kept for the answers).

Commands (``op``)::

    {"op": "start", "model": PATH, "threads": 1, "engine_args": {...}}
        -> {"ok": true, "vllm_version", "startup_s", "config": {block_size, num_gpu_blocks, ...}}
    {"op": "run", "requests": [{"prompt_token_ids": [...], "max_tokens": n}, ...],
     "max_in_flight": k}
        -> {"ok": true, "seconds", "steps", "outputs": [{"request_id", "token_ids",
            "finish_reason", "num_cached_tokens", "token_times"}, ...]}   (in request order)
    {"op": "api"}  -> vLLM's own signatures and fields, read from the installed package
    {"op": "exit"} -> {"ok": true}, then the worker ends

Every request is greedy (temperature 0) with ``ignore_eos=True``. ``run`` drives
``LLM.llm_engine`` (vLLM's ``LLMEngine``) with ``add_request`` / ``step`` and keeps at most
``max_in_flight`` requests unfinished, adding the next one as soon as one finishes (the
course's engine is driven by the same loop). ``token_times`` are seconds from the start of
the run at which each token was returned by ``step``. An error answers
``{"ok": false, "error": "..."}`` and the worker keeps serving.
"""

from __future__ import annotations

import inspect
import json
import os
import sys
import time
import traceback


def _engine_config(llm) -> dict:
    cfg = llm.llm_engine.vllm_config
    return {"block_size": cfg.cache_config.block_size, "num_gpu_blocks": cfg.cache_config.num_gpu_blocks,
            "enable_prefix_caching": bool(cfg.cache_config.enable_prefix_caching),
            "enable_chunked_prefill": bool(cfg.scheduler_config.enable_chunked_prefill),
            "max_num_seqs": cfg.scheduler_config.max_num_seqs,
            "max_num_batched_tokens": cfg.scheduler_config.max_num_batched_tokens,
            "max_model_len": cfg.model_config.max_model_len, "dtype": str(cfg.model_config.dtype),
            "device": str(cfg.device_config.device)}


def start(job: dict) -> tuple[object, dict]:
    threads = int(job.get("threads", 1))
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0" if threads == 1 else f"0-{threads - 1}")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(job.get("kv_cache_gib", 1)))
    os.environ.setdefault("VLLM_HOST_IP", "127.0.0.1")           # anything it binds stays on loopback
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("DO_NOT_TRACK", "1")
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    t0 = time.perf_counter()
    import vllm

    args = {"dtype": "float32", "seed": 0, "enforce_eager": True, **job.get("engine_args", {})}
    llm = vllm.LLM(model=job["model"], **args)
    return llm, {"ok": True, "vllm_version": vllm.__version__, "startup_s": time.perf_counter() - t0,
                 "config": _engine_config(llm), "engine_args": args}


def run(llm, job: dict, tag: str) -> dict:
    from vllm import SamplingParams

    engine = llm.llm_engine
    requests = job["requests"]
    window = int(job.get("max_in_flight", len(requests)))
    pending = list(range(len(requests)))
    live: dict[str, int] = {}
    outputs: list[dict | None] = [None] * len(requests)
    times: dict[int, list[float]] = {i: [] for i in range(len(requests))}
    seen: dict[int, int] = {i: 0 for i in range(len(requests))}
    steps = 0
    start_t = time.perf_counter()
    while pending or live:
        while pending and len(live) < window:
            i = pending.pop(0)
            r = requests[i]
            params = SamplingParams(temperature=0.0, max_tokens=int(r["max_tokens"]), ignore_eos=True)
            rid = f"{tag}-{i}"
            engine.add_request(rid, {"prompt_token_ids": list(r["prompt_token_ids"])}, params)
            live[rid] = i
        step_out = engine.step()
        steps += 1
        now = time.perf_counter() - start_t
        for out in step_out:
            i = live.get(out.request_id)
            if i is None:
                continue
            n = len(out.outputs[0].token_ids)
            times[i] += [now] * (n - seen[i])
            seen[i] = n
            if out.finished:
                c = out.outputs[0]
                outputs[i] = {"request_id": out.request_id, "token_ids": list(c.token_ids),
                              "finish_reason": c.finish_reason, "num_cached_tokens": out.num_cached_tokens,
                              "token_times": times[i]}
                del live[out.request_id]
        if steps > 100_000:
            raise RuntimeError("vLLM made no progress in 100000 steps")
    return {"ok": True, "seconds": time.perf_counter() - start_t, "steps": steps, "outputs": outputs}


def api() -> dict:
    """vLLM's public names as the installed package defines them (for the side-by-side table)."""
    import vllm
    from vllm import SamplingParams
    from vllm.outputs import CompletionOutput, RequestOutput
    from vllm.v1.engine.llm_engine import LLMEngine

    def sig(fn) -> str:
        return str(inspect.signature(fn))

    def names(fn) -> str:
        """The signature without annotations: ``(request_id, prompt, params, arrival_time=None, …)``."""
        params = [p.replace(annotation=inspect.Parameter.empty,
                            default=p.default if p.default is inspect.Parameter.empty or len(repr(p.default)) <= 24
                            else ...) for p in inspect.signature(fn).parameters.values() if p.name != "self"]
        return str(inspect.Signature(params))

    fields = list(getattr(SamplingParams, "__struct_fields__", ()) or inspect.signature(SamplingParams).parameters)
    return {"ok": True, "vllm_version": vllm.__version__,
            "LLMEngine.add_request": sig(LLMEngine.add_request), "LLMEngine.step": sig(LLMEngine.step),
            "LLMEngine.add_request.names": names(LLMEngine.add_request),
            "LLMEngine.has_unfinished_requests": sig(LLMEngine.has_unfinished_requests),
            "LLM.generate": sig(vllm.LLM.generate), "SamplingParams.fields": fields,
            "RequestOutput.__init__": sig(RequestOutput.__init__),
            "CompletionOutput.__init__": sig(CompletionOutput.__init__)}


def main() -> int:
    answers = os.fdopen(os.dup(1), "w", buffering=1)              # the real stdout: answers only
    os.dup2(2, 1)                                                  # vLLM's prints (and its children's) → stderr
    sys.stdout = sys.stderr
    llm, runs = None, 0
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            job = json.loads(line)
            op = job.get("op")
            if op == "start":
                if llm is not None:
                    raise RuntimeError("already started")
                llm, answer = start(job)
            elif op == "run":
                if llm is None:
                    raise RuntimeError("send 'start' first")
                runs += 1
                answer = run(llm, job, f"r{runs}")
            elif op == "api":
                answer = api()
            elif op == "exit":
                answers.write(json.dumps({"ok": True}) + "\n")
                break
            else:
                raise ValueError(f"op must be 'start', 'run', 'api' or 'exit', got {op!r}")
        except Exception as err:  # noqa: BLE001 - answered to the client, which raises it there
            traceback.print_exc()
            answer = {"ok": False, "error": f"{type(err).__name__}: {err}"}
        answers.write(json.dumps(answer) + "\n")
    if llm is not None:
        del llm
    return 0


if __name__ == "__main__":                                        # vLLM spawns its engine core: guard needed
    raise SystemExit(main())
