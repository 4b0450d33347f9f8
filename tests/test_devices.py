"""The invariants that must hold on every device: each test runs once per ``device`` (the conftest's
fixture: ``cpu``, and ``cuda`` where CUDA is available; skipped otherwise).

Engine logits = Hugging Face logits, greedy ``generate`` = ``model.generate``, beam search =
Hugging Face beam search, speculative greedy = target greedy (plain loop and paged engine),
chunked prefill, swap preemption (blocks move device → CPU → device), and the core calls a chapter
makes with ``device=...``. Everything runs in fp32 with TF32 off, so the tolerances are the CPU
suite's. ``python -m labsupport.check --device cuda`` runs a short version of this.
"""

from __future__ import annotations

import copy

import pytest
import torch
from helpers import prompts_for

from labsupport import speculative as spec
from labsupport.beam import beam_search
from labsupport.engine import BlockManager, LLMEngine, ModelRunner
from labsupport.engine.extend import extend
from labsupport.generation import generate, generate_batch
from labsupport.models import LoadedModel, load_model
from labsupport.sampling import GREEDY, SamplingParams

GREEDY_NO_EOS = GREEDY.replace(ignore_eos=True)


@pytest.fixture(scope="module", autouse=True)
def _exact_fp32():
    """No TF32 in matmuls: the GPU then computes the same fp32 sums as the CPU, up to order."""
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


def on_device(lm: LoadedModel, device: torch.device) -> LoadedModel:
    """``lm`` itself on the CPU; elsewhere a copy on ``device``, same tokenizer."""
    if device.type == "cpu":
        return lm
    return LoadedModel(model=copy.deepcopy(lm.model).to(device).eval(), tokenizer=lm.tokenizer, device=device,
                       name=f"{lm.name}@{device.type}")


@pytest.fixture(scope="module")
def gpu_lm(tiny_lm, device):
    """The test model on the device under test (the name is kept: on a GPU machine it is the GPU's)."""
    return on_device(tiny_lm, device)


@pytest.fixture(scope="module")
def gpu_pair(device):
    from test_speculative import make_lm, perturbed

    target = make_lm(0)
    return on_device(target, device), on_device(perturbed(target, 1, 0.25), device)


def full_logits(lm, ids):
    with torch.no_grad():
        return lm.model(torch.tensor([list(ids)], device=lm.device)).logits[0]


def hf_generate(lm, prompt, n):
    """``model.generate`` greedy on the model's device (stops at EOS, which it includes)."""
    ids = torch.tensor([prompt], device=lm.device)
    out = lm.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                            pad_token_id=lm.eos_token_id)
    new = out[0, len(prompt):].tolist()
    return new[:new.index(lm.eos_token_id) + 1] if lm.eos_token_id in new else new


def solo(lm, prompt, n):
    return generate(lm, list(prompt), GREEDY_NO_EOS, max_new_tokens=n, record=False).token_ids


# ---------------------------------------------------------------------------- the engine on the GPU
@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_engine_logits_equal_hf(gpu_lm, device, block_size):
    prompts = prompts_for(gpu_lm, [5, 11, 1, 17], seed=block_size)
    bm = BlockManager(num_blocks=256 // block_size + 8, block_size=block_size)
    runner = ModelRunner(gpu_lm, block_size, bm.num_blocks)
    assert runner.device.type == device.type and runner.kv_cache.device.type == device.type
    seqs = {i: list(p) for i, p in enumerate(prompts)}
    out = extend(runner, bm, seqs)
    for i, p in seqs.items():
        assert out[i].device.type == device.type
        torch.testing.assert_close(out[i], full_logits(gpu_lm, p), atol=1e-4, rtol=0)
    for _ in range(6):
        new = {i: [int(out[i][-1].argmax())] for i in seqs}
        out = extend(runner, bm, new)
        for i in seqs:
            seqs[i] += new[i]
            torch.testing.assert_close(out[i], full_logits(gpu_lm, seqs[i])[-1:], atol=1e-4, rtol=0)
    bm.audit()


def test_engine_logits_agree_with_the_cpus(tiny_lm, gpu_lm):
    """The same model on this device and on the CPU: the engine's logits agree to fp32 rounding."""
    (p,) = prompts_for(tiny_lm, [13], seed=2)
    outs = []
    for lm in (tiny_lm, gpu_lm):
        runner = ModelRunner(lm, 4, 16)
        outs.append(extend(runner, BlockManager(16, 4), {"s": p})["s"].cpu())
    torch.testing.assert_close(outs[1], outs[0], atol=1e-4, rtol=0)


def test_greedy_engine_equals_model_generate(gpu_lm):
    prompts = prompts_for(gpu_lm, [3, 9, 14, 6, 1], seed=11)
    engine = LLMEngine(gpu_lm, block_size=4, num_blocks=64)
    outs = engine.generate(prompts, GREEDY, max_tokens=16)
    for p, o in zip(prompts, outs):
        assert o.token_ids == hf_generate(gpu_lm, p, 16)
        assert o.finish_reason == ("stop" if o.token_ids[-1] == gpu_lm.eos_token_id else "length")
    assert engine.block_manager.num_used_blocks == 0


def test_greedy_generate_equals_transformers(gpu_lm):
    for prompt in ("Return the number of", "Hello", "If the value is not given, the default"):
        ours = generate(gpu_lm, prompt, max_new_tokens=24)
        ids = torch.tensor([ours.prompt_ids], device=gpu_lm.device)
        hf = gpu_lm.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=24,
                                   do_sample=False, eos_token_id=None, pad_token_id=0)
        assert ours.token_ids == hf[0, ids.shape[1]:].tolist()
    batch = generate_batch(gpu_lm, ["Hello, my dog is a little", "Hello"], GREEDY, max_new_tokens=16)
    for prompt, row in zip(["Hello, my dog is a little", "Hello"], batch):
        assert row.token_ids == generate(gpu_lm, prompt, GREEDY, max_new_tokens=16).token_ids


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_preemption_keeps_outputs(gpu_lm, device, mode):
    """A pool too small for all: preempted sequences resume with identical tokens. With
    ``swap`` their blocks go to the CPU cache and come back to the device."""
    prompts = prompts_for(gpu_lm, [5, 8, 12, 3, 7, 10], seed=12)
    engine = LLMEngine(gpu_lm, block_size=4, num_blocks=12, preemption_mode=mode, num_cpu_blocks=64,
                       record_history=True)
    outs = engine.generate(prompts, GREEDY_NO_EOS, max_tokens=20)
    assert sum(o.metrics.num_preemptions for o in outs) > 0
    for p, o in zip(prompts, outs):
        assert o.token_ids == solo(gpu_lm, p, 20)
    bm, runner = engine.block_manager, engine.runner
    assert bm.num_free_blocks == 12 and bm.num_free_cpu_blocks == bm.num_cpu_blocks
    assert runner.kv_cache.device.type == device.type
    if mode == "swap":
        assert any(h.swapped_out for h in engine.history) and any(h.swapped_in for h in engine.history)
        assert runner.cpu_cache is not None and runner.cpu_cache.device.type == "cpu"


def test_swap_moves_blocks_between_the_device_and_the_cpu(gpu_lm, device):
    runner = ModelRunner(gpu_lm, 4, 8, num_cpu_blocks=8)
    g = torch.Generator(device=device).manual_seed(0)
    runner.kv_cache.copy_(torch.randn(runner.kv_cache.shape, generator=g, device=device))
    before = runner.kv_cache[:, :, [2, 5]].clone()
    runner.swap_out({2: 0, 5: 3})
    runner.kv_cache[:, :, [2, 5]] = 0
    runner.swap_in({0: 6, 3: 1})
    torch.testing.assert_close(runner.kv_cache[:, :, [6, 1]], before, atol=0, rtol=0)   # a copy is exact


def test_chunked_prefill_mixes_chunks_with_decodes(gpu_lm):
    prompts = prompts_for(gpu_lm, [4, 30, 23], seed=31)
    engine = LLMEngine(gpu_lm, block_size=4, num_blocks=64, enable_chunked_prefill=True, max_prefill_chunk=6,
                       max_num_batched_tokens=8, record_history=True)
    outs = engine.generate(prompts, GREEDY, max_tokens=10)
    for p, o in zip(prompts, outs):
        assert o.token_ids == hf_generate(gpu_lm, p, 10)
    chunks = [n for h in engine.history for n in h.scheduled_tokens.values()]
    assert max(chunks) <= 6 and all(h.num_batched_tokens <= 8 for h in engine.history)
    mixed = [h for h in engine.history if 1 in h.scheduled_tokens.values() and max(h.scheduled_tokens.values()) > 1]
    assert mixed, "no step mixed a prefill chunk with a decode"


def test_prefix_caching_equals_model_generate(gpu_lm):
    (shared,) = prompts_for(gpu_lm, [13], seed=21)
    prompts = [shared + t for t in prompts_for(gpu_lm, [3, 5, 2], seed=22)]
    engine = LLMEngine(gpu_lm, block_size=4, num_blocks=64, enable_prefix_caching=True)
    outs = engine.generate(prompts[:1], GREEDY, max_tokens=8) + engine.generate(prompts[1:], GREEDY,
                                                                                    max_tokens=8)
    for p, o in zip(prompts, outs):
        assert o.token_ids == hf_generate(gpu_lm, p, 8)
    assert engine.block_manager.num_prefix_hit_blocks >= 6


def test_seeded_sampling_in_the_engine_matches_generate(gpu_lm):
    p, other = prompts_for(gpu_lm, [6, 9], seed=51)
    params = SamplingParams(temperature=0.9, top_k=50, seed=123, ignore_eos=True)
    ref = generate(gpu_lm, p, params, max_new_tokens=12, record=False).token_ids
    engine = LLMEngine(gpu_lm, block_size=4, num_blocks=32)
    rid = engine.add_request(p, params, max_tokens=12)
    engine.add_request(other, SamplingParams(temperature=1.0, seed=5), max_tokens=12)
    engine.run()
    assert engine.output(rid).token_ids == ref
    assert generate(gpu_lm, p, params, max_new_tokens=12, record=False).token_ids == ref   # seeded: repeatable


# ---------------------------------------------------------------------------- beam search
@pytest.mark.parametrize("B", [2, 4])
def test_beam_search_equals_transformers(gpu_lm, B):
    prompt_ids = gpu_lm.encode("Return the number of items in the list")
    P, n = len(prompt_ids), 8
    for alpha, early in [(0.0, False), (1.0, True), (2.0, "never")]:
        ours = beam_search(gpu_lm, prompt_ids, B, max_new_tokens=n, length_penalty=alpha, early_stopping=early,
                           num_return_sequences=B)
        hf = gpu_lm.model.generate(torch.tensor([prompt_ids], device=gpu_lm.device), num_beams=B, num_return_sequences=B,
                                   do_sample=False, length_penalty=alpha, early_stopping=early, max_new_tokens=n,
                                   eos_token_id=gpu_lm.eos_token_id, pad_token_id=gpu_lm.tokenizer.pad_token_id,
                                   return_dict_in_generate=True, output_scores=True)
        fill = {gpu_lm.tokenizer.pad_token_id, gpu_lm.eos_token_id}
        for i, hyp in enumerate(ours.hypotheses):
            row = hf.sequences[i].tolist()
            assert row[P:P + hyp.length] == hyp.token_ids, (alpha, early, i)
            assert set(row[P + hyp.length:]) <= fill
            assert hf.sequences_scores[i].item() == pytest.approx(hyp.score, abs=1e-4)


def test_beam_width_one_is_greedy(gpu_lm):
    prompt = "Return the number of items in the list"
    greedy = generate(gpu_lm, prompt, GREEDY, max_new_tokens=24)
    beam = beam_search(gpu_lm, prompt, 1, max_new_tokens=24, length_penalty=0.0)
    assert beam.best.token_ids == greedy.token_ids
    assert beam.best.logprob == pytest.approx(greedy.logprob, abs=1e-4)


# ---------------------------------------------------------------------------- speculative decoding
@pytest.mark.parametrize("gamma", [1, 4, 8])
def test_speculative_greedy_equals_target_greedy(gpu_pair, gamma):
    target, draft = gpu_pair
    prompt = [5, 17, 99, 3, 42, 8, 5, 17, 99]
    ref = generate(target, prompt, GREEDY, max_new_tokens=48, record=False)
    for proposer in (spec.DraftModelProposer(draft, target, gamma), spec.NgramProposer(gamma)):
        res = spec.speculative_generate(target, proposer, prompt, GREEDY, max_new_tokens=48)
        assert res.token_ids == ref.token_ids, (type(proposer).__name__, gamma)


def test_paged_speculative_engine_equals_plain_engine(gpu_pair):
    target, draft = gpu_pair
    prompts = [[5, 17, 99, 3, 42, 8], [1, 1, 1], [7, 8, 9, 7, 8], [200, 13]]
    plain = [o.token_ids for o in LLMEngine(target, block_size=4, num_blocks=256).generate(prompts, GREEDY, 24)]
    engine = spec.SpeculativeEngine(target, spec.DraftModelProposer(draft, target, 4), block_size=4, num_blocks=256,
                                    max_num_seqs=4)
    outs = engine.generate(prompts, GREEDY, max_tokens=24)
    assert [o.token_ids for o in outs] == plain
    assert engine.block_manager.num_free_blocks == 256


# ---------------------------------------------------------------------------- a chapter's calls
def test_chapter_core_calls_on_the_device(device):
    """What chapters 01–05 do with the shipped model, loaded with ``device=...``."""
    lm = load_model("tiny-gpt2", device=device.type)
    cpu = load_model("tiny-gpt2", device="cpu")
    assert lm.device.type == device.type and next(lm.model.parameters()).device.type == device.type
    prompt = "Return the number of items in the list."
    torch.testing.assert_close(full_logits(lm, lm.encode(prompt)).cpu(), full_logits(cpu, cpu.encode(prompt)),
                               atol=1e-4, rtol=0)
    short = generate(lm, prompt, SamplingParams(temperature=0, max_tokens=12))            # chapter 01
    assert len(short.token_ids) <= 12 and short.finish_reason in ("stop", "length")
    sampled = [generate(lm, prompt, SamplingParams(temperature=0.8, top_p=0.9, seed=0), max_new_tokens=20).token_ids
               for _ in range(2)]
    assert sampled[0] == sampled[1]                                                         # seeded on every device
    cached = generate(lm, prompt, GREEDY_NO_EOS, max_new_tokens=28, use_cache=True)         # chapter 03
    uncached = generate(lm, prompt, GREEDY_NO_EOS, max_new_tokens=28, use_cache=False)
    assert cached.token_ids == uncached.token_ids
    beam = beam_search(lm, prompt, 4, max_new_tokens=12)                                    # chapter 02
    assert len(beam.best.token_ids) >= 1
    engine = LLMEngine(lm, block_size=4, num_blocks=20, max_num_seqs=4)                     # chapters 04, 05
    outs = engine.generate([prompt, "Hello", "The default encoding is"], GREEDY_NO_EOS, max_tokens=16)
    for p, o in zip([prompt, "Hello", "The default encoding is"], outs):
        assert o.token_ids == solo(lm, lm.encode(p), 16)
        assert o.metrics.ttft is not None and o.metrics.tpot is not None
