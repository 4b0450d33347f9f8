"""``python -m labsupport.check --device cuda``: the core's invariants on one device, briefly.

The shipped model is loaded on the device and on the CPU; the report checks that the paged
engine's logits equal Hugging Face's there, that greedy decoding through the engine equals
``generate``, that swap preemption (KV blocks to the CPU and back) keeps the tokens, and that
greedy speculative decoding equals target greedy — the same invariants ``tests/test_devices.py``
checks in full on every device. It also prints the engine's tokens per second for a batch of 8 (a number,
not a check). No widgets or plotting are imported.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

PROMPTS = ["Return the number of items in the list.", "If the value is not given, the default",
           "Raise ValueError if the argument is negative.", "The default encoding is",
           "Open the file and return a corresponding file object.", "Return True if the object is",
           "Split the string at the first occurrence of sep, and return a", "Return a new dictionary"]


def _checks(device: torch.device) -> list[tuple[str, Callable[[], tuple[bool, str]]]]:
    from . import speculative as spec
    from .engine import BlockManager, LLMEngine, ModelRunner
    from .engine.extend import extend
    from .generation import generate
    from .models import load_model
    from .sampling import GREEDY

    fixed = GREEDY.replace(ignore_eos=True)
    lm, cpu = load_model("tiny-gpt2", device=device), load_model("tiny-gpt2", device="cpu")
    ids = lm.encode(PROMPTS[0])

    def logits_vs_cpu():
        with torch.no_grad():
            a = lm.model(torch.tensor([ids], device=device)).logits[0].float().cpu()
            b = cpu.model(torch.tensor([ids])).logits[0]
        gap = float((a - b).abs().max())
        return gap <= 1e-4, f"max |HF on {device.type} − HF on cpu| = {gap:.1e}"

    def engine_logits():
        out = extend(ModelRunner(lm, 4, 16), BlockManager(16, 4), {"s": ids})["s"]
        with torch.no_grad():
            ref = lm.model(torch.tensor([ids], device=device)).logits[0].float()
        gap = float((out - ref).abs().max())
        return gap <= 1e-4, f"max |engine − HF| = {gap:.1e} over {len(ids)} positions"

    def engine_greedy():
        outs = LLMEngine(lm, block_size=16, num_blocks=64).generate(PROMPTS, fixed, max_tokens=32)
        same = sum(o.token_ids == generate(lm, p, fixed, max_new_tokens=32, record=False).token_ids
                   for p, o in zip(PROMPTS, outs))
        return same == len(PROMPTS), f"{same}/{len(PROMPTS)} requests × 32 tokens equal to generate"

    def swap():
        engine = LLMEngine(lm, block_size=4, num_blocks=24, preemption_mode="swap", num_cpu_blocks=64)
        outs = engine.generate(PROMPTS, fixed, max_tokens=24)
        pre = sum(o.metrics.num_preemptions for o in outs)
        same = sum(o.token_ids == generate(lm, p, fixed, max_new_tokens=24, record=False).token_ids
                   for p, o in zip(PROMPTS, outs))
        return pre > 0 and same == len(PROMPTS), f"{pre} preemptions by swap, {same}/{len(PROMPTS)} outputs kept"

    def speculative():
        draft = load_model("tiny-gpt2-draft", device=device)
        ref = generate(lm, ids, fixed, max_new_tokens=48, record=False).token_ids
        res = spec.speculative_generate(lm, spec.DraftModelProposer(draft, lm, 4), ids, fixed, max_new_tokens=48)
        return res.token_ids == ref, f"{len(res.rounds)} rounds for {len(res.token_ids)} tokens, equal to greedy"

    def throughput():
        engine = LLMEngine(lm, block_size=16, num_blocks=128)
        engine.generate(PROMPTS[:2], fixed, max_tokens=8)             # warm-up
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        engine.generate(PROMPTS, fixed, max_tokens=64)
        if device.type == "cuda":
            torch.cuda.synchronize()
        return True, f"{len(PROMPTS) * 64 / (time.perf_counter() - start):.0f} tok/s (batch of 8 × 64, not a check)"

    return [(f"HF logits on {device.type} = on cpu", logits_vs_cpu), ("engine logits = HF logits", engine_logits),
            ("engine greedy = generate", engine_greedy), ("swap preemption keeps outputs", swap),
            ("speculative greedy = target greedy", speculative), ("engine throughput", throughput)]


def device_report(device_name: str) -> int:
    """Print the report for ``device_name``; 0 when every check passed, 1 otherwise."""
    from .models import pick_device

    try:
        device = pick_device(device_name)
    except ValueError as err:
        print(f"device {device_name!r}: {err}")
        return 1
    head = f"device {device}: torch {torch.__version__}"
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        head += f", CUDA {torch.version.cuda}, {props.name}, {props.total_memory / 2 ** 30:.0f} GiB"
        old = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False                      # exact fp32 for the comparisons
    print(head)
    failed = 0
    try:
        for name, check in _checks(device):
            try:
                ok, detail = check()
            except Exception as err:  # noqa: BLE001 - reported as a failed check
                ok, detail = False, f"{type(err).__name__}: {err}"
            failed += not ok
            print(f"  {'ok  ' if ok else 'FAIL'} {name:<36} {detail}")
    finally:
        if device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = old
    print("all good" if not failed else f"{failed} check(s) failed")
    return 1 if failed else 0
