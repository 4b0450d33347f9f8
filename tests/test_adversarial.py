"""Bad inputs and edge cases against the finished core: sampling, generation, models and the
paged-KV engine (cases C01–C16 of ``shared/cases/decoding-cases.md``, each fault's whole kind).

Rules checked: bad input → ``ValueError`` naming the parameter; no NaN, no IndexError; every
request added to the engine ends with a finish reason and the block pool is whole at the end.
"""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch

from labsupport.engine import LLMEngine, ModelRunner
from labsupport.engine.attention import build_metadata
from labsupport.engine.metrics import goodput
from labsupport.generation import generate, generate_batch, next_token_logits, token_forwards
from labsupport.models import pick_device
from labsupport.sampling import (
    GREEDY,
    SamplingParams,
    apply_repetition_penalty,
    apply_temperature,
    candidates_for_mass,
    entropy_bits,
    min_p_filter,
    probability_ratio,
    probs_from_logits,
    process_logits,
    sample,
    top_k_filter,
    top_p_filter,
    trace_filters,
)

INF = float("inf")
NO_EOS = GREEDY.replace(ignore_eos=True)


def kept(z: torch.Tensor) -> set[int]:
    return set(torch.nonzero(torch.isfinite(z.flatten())).flatten().tolist())


def prompts_for(lm, lengths, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, lm.model.config.vocab_size, (n,), generator=g).tolist() for n in lengths]


def pool_is_whole(engine: LLMEngine) -> None:
    bm = engine.block_manager
    bm.audit()
    assert bm.num_used_blocks == 0 and bm.num_free_blocks + bm.num_evictable_blocks == bm.num_blocks
    assert bm.num_free_cpu_blocks == bm.num_cpu_blocks
    sch = engine.scheduler
    assert not sch.running and not sch.waiting and not sch.swapped
    assert all(engine.output(r).finished and engine.output(r).finish_reason for r in engine.requests)


# ============================================================================ sampling: logits values
BAD_ROWS = {
    "nan": ([float("nan"), 1.0, 0.0], "NaN"),
    "plus_inf": ([INF, 1.0, 0.0], r"\+inf"),
    "all_neg_inf": ([-INF, -INF, -INF], "all -inf"),
}


@pytest.mark.parametrize("name", BAD_ROWS)
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_nan_and_inf_logits_are_a_clear_error(name, temperature):
    """NaN / +inf / a row with nothing left would make every probability NaN (or, greedy,
    silently pick index 0): a ValueError instead, from every entry point."""
    row, pattern = BAD_ROWS[name]
    z = torch.tensor(row)
    params = SamplingParams(temperature=temperature, top_p=0.9)
    for call in (lambda: sample(z, params, torch.Generator().manual_seed(0)),
                 lambda: probs_from_logits(z, params),
                 lambda: process_logits(torch.stack([torch.zeros(3), z]), params),
                 lambda: trace_filters(z, params),
                 lambda: top_p_filter(z, 0.5), lambda: top_k_filter(z, 1), lambda: min_p_filter(z, 0.1)):
        with pytest.raises(ValueError, match=pattern):
            call()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("params", [GREEDY, SamplingParams(temperature=0.7, top_k=2, top_p=0.5, min_p=0.3),
                                    SamplingParams(temperature=1e-6, repetition_penalty=3.0)])
def test_all_neg_inf_but_one_always_gives_that_one(dtype, params):
    z = torch.tensor([-INF, -INF, 2.0, -INF], dtype=dtype)
    probs = probs_from_logits(z, params, [0, 2])
    assert probs.tolist() == [0.0, 0.0, 1.0, 0.0]
    gen = torch.Generator().manual_seed(1)
    assert [int(sample(z, params, gen, [0, 2])) for _ in range(20)] == [2] * 20


@pytest.mark.parametrize("params", [GREEDY, SamplingParams(temperature=2.0, top_k=5, top_p=0.01, min_p=1.0,
                                                           repetition_penalty=1e30)])
def test_one_token_vocabulary(params):
    z = torch.tensor([-0.3])
    assert probs_from_logits(z, params, [0]).tolist() == [1.0]
    assert int(sample(z, params, torch.Generator().manual_seed(0), [0])) == 0
    assert trace_filters(z, params, [0]).num_kept == 1


@pytest.mark.parametrize("temperature", [1e-5, 1e-30, 1e-45, 1e-320])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_tiny_temperature_is_the_argmax_never_nan(temperature, dtype):
    """C07's kind: T below float32's range (1e-320 underflows to 0 in fp32) used to give 0/0 = NaN."""
    z = torch.tensor([11.06, 2.955, -2.447, 11.0], dtype=dtype)
    params = SamplingParams(temperature=temperature)
    probs = probs_from_logits(z, params)
    assert torch.isfinite(probs).all()
    assert probs.tolist() == [1.0, 0.0, 0.0, 0.0]
    assert int(sample(z, params, torch.Generator().manual_seed(0))) == 0
    scaled = apply_temperature(z, temperature)
    assert scaled[0].item() == 0.0 and not torch.isnan(scaled).any()


def test_huge_temperature_is_uniform_and_ties_stay_tied_at_tiny_temperature():
    z = torch.tensor([1.0, 5.0, -3.0])
    probs = probs_from_logits(z, SamplingParams(temperature=1e300))
    assert torch.allclose(probs, torch.full((3,), 1 / 3))
    tied = probs_from_logits(torch.tensor([2.0, 2.0, 1.0]), SamplingParams(temperature=1e-320))
    assert tied.tolist() == [0.5, 0.5, 0.0]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("top_p", [1e-8, 1e-4, 0.3])
def test_c02_kind_tiny_top_p_in_low_precision(dtype, top_p):
    z = torch.tensor([1.0, 3.0, 2.0], dtype=dtype)
    params = SamplingParams(temperature=1.0, top_p=top_p)
    probs = probs_from_logits(z, params)
    assert probs.dtype == torch.float32 and probs.tolist() == [0.0, 1.0, 0.0]
    gen = torch.Generator().manual_seed(0)
    assert [int(sample(z, params, gen)) for _ in range(100)] == [1] * 100


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_c01_kind_top_p_boundary_in_low_precision(dtype):
    """[0.5, 0.25, 0.125, 0.125] are exact in fp16/bf16: the boundary of C01 must not move."""
    z = torch.log(torch.tensor([0.5, 0.25, 0.125, 0.125])).to(dtype)
    assert kept(top_p_filter(z, 0.75)) == {0, 1}
    assert kept(top_p_filter(z, 0.76)) == {0, 1, 2}


# ============================================================================ sampling: parameter types
@pytest.mark.parametrize("field, value", [
    ("top_k", True), ("top_k", 2.0), ("top_k", -1), ("top_k", "5"), ("top_k", None),
    ("temperature", "0.5"), ("temperature", True), ("temperature", INF), ("temperature", None),
    ("top_p", "0.9"), ("top_p", True), ("top_p", float("nan")), ("top_p", 0.0),
    ("min_p", "0.1"), ("min_p", True), ("min_p", float("nan")),
    ("repetition_penalty", "1.2"), ("repetition_penalty", 0.0), ("repetition_penalty", INF),
    ("max_tokens", 5.0), ("max_tokens", "5"), ("max_tokens", True),
    ("n", 2.0), ("n", 0), ("stop", 5), ("stop", [""]), ("stop", ["a", 3]),
    ("ignore_eos", "no"), ("ignore_eos", 1), ("seed", "1"), ("seed", 1.0), ("seed", -1), ("seed", 2 ** 70),
])
def test_sampling_params_wrong_types_are_value_errors(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})


def test_sampling_params_accept_numpy_scalars_and_store_python_numbers():
    p = SamplingParams(temperature=np.float32(0.5), top_k=np.int64(3), top_p=np.float64(0.9),
                       min_p=np.float16(0.25), repetition_penalty=np.int32(2), max_tokens=np.int16(7),
                       n=np.uint8(2), seed=np.int64(11), stop=["x"])
    assert p == SamplingParams(temperature=0.5, top_k=3, top_p=0.9, min_p=0.25, repetition_penalty=2.0,
                               max_tokens=7, n=2, seed=11, stop=("x",))
    assert type(p.top_k) is int and type(p.temperature) is float and type(p.seed) is int
    assert SamplingParams(stop=None).stop == () and SamplingParams(stop="ab").stop == ("ab",)
    hash(p)                                                        # frozen and hashable (stop is a tuple)


def test_processors_reject_bools_and_accept_numpy():
    z = torch.tensor([1.0, 2.0, 0.5])
    for call in (lambda: apply_temperature(z, True), lambda: top_p_filter(z, True),
                 lambda: min_p_filter(z, True), lambda: top_k_filter(z, True),
                 lambda: apply_repetition_penalty(z, [0], True), lambda: candidates_for_mass(z, True)):
        with pytest.raises(ValueError):
            call()
    assert torch.equal(top_k_filter(z, np.int64(1)), top_k_filter(z, 1))
    assert torch.equal(apply_temperature(z, np.float32(0.5)), apply_temperature(z, 0.5))


# ============================================================================ repetition penalty (C08's kind)
def test_repetition_penalty_with_empty_history_changes_nothing():
    z = torch.tensor([1.0, -1.0, 0.5])
    assert torch.equal(apply_repetition_penalty(z, [], 2.0), z)
    assert torch.equal(apply_repetition_penalty(z, torch.tensor([], dtype=torch.long), 2.0), z)
    params = SamplingParams(temperature=1.0, repetition_penalty=2.0)
    assert torch.equal(probs_from_logits(z, params, []), torch.softmax(z, -1))
    assert int(sample(z, GREEDY.replace(repetition_penalty=2.0), prev_ids=[])) == 0


def test_repetition_penalty_rows_given_as_numpy_arrays():
    z = torch.tensor([[1.0, -1.0], [1.0, -1.0]])
    out = apply_repetition_penalty(z, np.array([[0], [1]]), 2.0)
    assert out.tolist() == [[0.5, -1.0], [1.0, -2.0]]               # row 0 saw id 0, row 1 saw id 1
    assert apply_repetition_penalty(z[0], np.array([0, 1]), 2.0).tolist() == [0.5, -2.0]


@pytest.mark.parametrize("ids", [[3], [-1], [0, 99]])
def test_repetition_penalty_ids_outside_vocab(ids):
    with pytest.raises(ValueError, match=r"prev_ids must be token ids in \[0, 3\)"):
        apply_repetition_penalty(torch.zeros(3), ids, 1.5)


@pytest.mark.parametrize("penalty", [1e-300, 1e300])
def test_extreme_repetition_penalty_saturates_instead_of_inf(penalty):
    """A positive logit / 1e-300 or a negative one × 1e300 overflowed to ±inf (then NaN or an
    all -inf row); it now saturates at the largest float32, as documented."""
    z = torch.tensor([2.0, -1.0, 0.5, -INF])
    out = apply_repetition_penalty(z, [0, 1, 3], penalty)
    assert torch.isfinite(out[:3]).all() and out[3].item() == -INF
    params = SamplingParams(temperature=1.0, repetition_penalty=penalty)
    probs = probs_from_logits(z, params, [0, 1, 3])
    assert torch.isfinite(probs).all() and abs(probs.sum().item() - 1) < 1e-6
    lone = torch.tensor([-1.0])                                   # all candidates seen and negative
    assert probs_from_logits(lone, params, [0]).tolist() == [1.0]


# ============================================================================ measures
def test_measures_never_return_garbage():
    assert probability_ratio(100.0, 0.01) == math.inf             # was OverflowError
    assert probability_ratio(2.0, 1.0) == pytest.approx(math.exp(2))
    with pytest.raises(ValueError, match="probs"):
        entropy_bits(torch.tensor([float("nan"), 1.0]))           # was -0.0
    with pytest.raises(ValueError, match="mass"):
        candidates_for_mass(torch.tensor([0.5, 0.5]), float("nan"))


# ============================================================================ generation
@pytest.mark.parametrize("prompt", [[1.7, 2], ["a"], [[1, 2]], None, 5, [True, 3], torch.tensor([[1, 2]])])
def test_prompt_of_wrong_type_is_a_value_error(tiny_lm, prompt):
    with pytest.raises(ValueError, match="prompt"):
        generate(tiny_lm, prompt, NO_EOS, max_new_tokens=2)
    with pytest.raises(TypeError, match="prompt"):
        LLMEngine(tiny_lm, block_size=4, num_blocks=8).add_request(prompt, NO_EOS, max_new_tokens=2)


def test_prompt_ids_as_tensor_or_numpy_and_numpy_max_new(tiny_lm):
    ref = generate(tiny_lm, [5, 6, 7], NO_EOS, max_new_tokens=3).token_ids
    assert generate(tiny_lm, torch.tensor([5, 6, 7]), NO_EOS, max_new_tokens=np.int64(3)).token_ids == ref
    assert generate(tiny_lm, np.array([5, 6, 7]), NO_EOS, max_new_tokens=3).token_ids == ref
    engine = LLMEngine(tiny_lm, block_size=4, num_blocks=8)
    (out,) = engine.generate(list(np.array([5, 6, 7])), NO_EOS, max_new_tokens=np.int32(3))
    assert out.token_ids == ref


def test_empty_prompt_everywhere(tiny_lm):
    for call in (lambda: generate(tiny_lm, [], NO_EOS, max_new_tokens=1),
                 lambda: generate(tiny_lm, "", NO_EOS, max_new_tokens=1),
                 lambda: generate_batch(tiny_lm, ["Hello", ""], NO_EOS, max_new_tokens=1),
                 lambda: next_token_logits(tiny_lm, []),
                 lambda: LLMEngine(tiny_lm, block_size=4, num_blocks=8).add_request([], NO_EOS)):
        with pytest.raises(ValueError, match="empty prompt"):
            call()
    for prompts in ([], "Hello"):                                  # a bare string is not a list of prompts
        with pytest.raises(ValueError, match="prompts"):
            generate_batch(tiny_lm, prompts, NO_EOS, max_new_tokens=1)


def test_lengths_up_to_exactly_n_positions(tiny_lm):
    """prompt + max_new_tokens may reach n_positions (64) exactly, never more; no IndexError."""
    for use_cache in (True, False):
        out = generate(tiny_lm, [7] * 60, NO_EOS, max_new_tokens=4, use_cache=use_cache, record=False)
        assert len(out.token_ids) == 4
    assert len(generate(tiny_lm, [7], NO_EOS, max_new_tokens=63, record=False).token_ids) == 63
    with pytest.raises(ValueError, match="n_positions"):
        generate(tiny_lm, [7] * 64, NO_EOS, max_new_tokens=1)
    assert next_token_logits(tiny_lm, [7] * 64).shape == (tiny_lm.model.config.vocab_size,)
    with pytest.raises(ValueError, match="n_positions"):
        next_token_logits(tiny_lm, [7] * 65)                       # was an IndexError
    engine = LLMEngine(tiny_lm, block_size=4, num_blocks=40)
    fits = engine.add_request([7] * 60, NO_EOS, max_new_tokens=4)
    past = engine.add_request([7] * 60, NO_EOS, max_new_tokens=5)     # runs until the window is full
    engine.run()
    assert engine.output(fits).token_ids == generate(tiny_lm, [7] * 60, NO_EOS, max_new_tokens=4).token_ids
    assert engine.output(past).finish_reason == "length" and engine.output(past).token_ids == engine.output(fits).token_ids
    pool_is_whole(engine)


def test_generate_rejects_bad_params_and_top_n(tiny_lm):
    with pytest.raises(ValueError, match="params must be a SamplingParams"):
        generate(tiny_lm, [1], {"temperature": 0}, max_new_tokens=1)
    with pytest.raises(ValueError, match="params must be a SamplingParams"):
        generate_batch(tiny_lm, [[1]], None, max_new_tokens=1)
    with pytest.raises(ValueError, match="top_n"):
        generate(tiny_lm, [1], NO_EOS, max_new_tokens=1, top_n=-1)  # was a RuntimeError from topk
    with pytest.raises(ValueError, match="prompt_len"):
        token_forwards(2.5, 3, True)


def test_tiny_temperature_generation_equals_greedy(tiny_lm):
    greedy = generate(tiny_lm, [1, 2, 3], NO_EOS, max_new_tokens=8).token_ids
    for t in (1e-30, 1e-320):
        params = SamplingParams(temperature=t, seed=0, ignore_eos=True)
        assert generate(tiny_lm, [1, 2, 3], params, max_new_tokens=8).token_ids == greedy


def _spanning_stop(lm, token_ids):
    """A 2-character stop string made of the last character of token i and the first of token
    i + 1, whose first occurrence in the text is exactly there; returns (stop, i, cut)."""
    text = lm.decode(token_ids)
    for i in range(len(token_ids) - 1):
        head = lm.decode(token_ids[:i + 1])
        piece = lm.decode(token_ids[i + 1:i + 2])
        if not head or not piece or not text.startswith(head) or not (head[-1] + piece[0]).isprintable():
            continue
        stop = head[-1] + piece[0]
        if text.startswith(head + piece) and text.find(stop) == len(head) - 1:
            return stop, i, len(head) - 1
    return None


def test_stop_string_spanning_two_tokens(tiny_lm):
    params = SamplingParams(temperature=1.0, seed=3, ignore_eos=True)
    full = generate(tiny_lm, "Hello", params, max_new_tokens=24)
    found = _spanning_stop(tiny_lm, full.token_ids)
    assert found is not None, "the seeded sample has no usable token boundary"
    stop, i, cut = found
    out = generate(tiny_lm, "Hello", params.replace(stop=(stop,)), max_new_tokens=24)
    assert out.finish_reason == "stop" and out.token_ids == full.token_ids[:i + 2]
    assert out.text == full.text[:cut] and stop not in out.text
    engine = LLMEngine(tiny_lm, block_size=4, num_blocks=32)
    (eng,) = engine.generate(["Hello"], params.replace(stop=[stop]), max_new_tokens=24)
    assert (eng.token_ids, eng.text, eng.finish_reason) == (out.token_ids, out.text, "stop")


def test_eos_as_the_very_first_token():
    """Greedy first token is EOS (final layer norm zeroed, so the logits are the same at every
    position, and the EOS row of the LM head points along its bias): stop at once, empty text."""
    from helpers import make_tiny_lm

    lm = make_tiny_lm(seed=4)
    eos = lm.eos_token_id
    with torch.no_grad():
        ln_f = lm.model.transformer.ln_f
        ln_f.weight.zero_()
        ln_f.bias.copy_(torch.linspace(-1, 1, ln_f.bias.numel()))
        lm.model.lm_head.weight[eos] = 50 * ln_f.bias
    for use_cache in (True, False):
        out = generate(lm, "Hello", GREEDY, max_new_tokens=5, use_cache=use_cache)
        assert (out.token_ids, out.text, out.finish_reason) == ([eos], "", "stop")
    batch = generate_batch(lm, ["Hello", "a b c"], GREEDY, max_new_tokens=5)
    assert [(r.token_ids, r.text, r.finish_reason) for r in batch] == [([eos], "", "stop")] * 2
    engine = LLMEngine(lm, block_size=4, num_blocks=16)
    outs = engine.generate(["Hello", "a b c"], GREEDY.replace(n=2), max_new_tokens=5)
    assert [(o.token_ids, o.text, o.finish_reason) for o in outs] == [([eos], "", "stop")] * 4
    ignored = generate(lm, "Hello", NO_EOS, max_new_tokens=3)
    assert ignored.token_ids == [eos] * 3 and ignored.finish_reason == "length"
    pool_is_whole(engine)


# ============================================================================ models
@pytest.mark.parametrize("device", ["foo", "gpu0", 3.5])
def test_pick_device_bad_name_is_a_value_error(device):
    with pytest.raises(ValueError, match="device"):
        pick_device(device)


# ============================================================================ engine: settings and ids
@pytest.mark.parametrize("setting, value", [
    ("num_blocks", 0), ("num_blocks", -3), ("block_size", 0), ("block_size", -1),
    ("num_cpu_blocks", -1), ("max_num_batched_tokens", 0), ("max_num_seqs", 0),
    ("max_prefill_chunk", 0),
])
def test_engine_settings_out_of_range(tiny_lm, setting, value):
    """max_num_batched_tokens=0 used to be silently replaced by the default; num_cpu_blocks=-1
    was accepted in recompute mode; seed='a' was a RuntimeError from torch."""
    kwargs = {"enable_chunked_prefill": True} if setting == "max_prefill_chunk" else {}
    with pytest.raises(ValueError, match=setting):
        LLMEngine(tiny_lm, **{setting: value}, **kwargs)


@pytest.mark.parametrize("setting, value", [("block_size", 2.0), ("seed", "a"), ("num_blocks", True)])
def test_engine_settings_of_wrong_type(tiny_lm, setting, value):
    with pytest.raises(TypeError, match=setting):
        LLMEngine(tiny_lm, **{setting: value})


def test_auto_request_ids_skip_ids_the_user_took(tiny_lm):
    engine = LLMEngine(tiny_lm, block_size=4, num_blocks=16)
    assert engine.add_request([1, 2], NO_EOS, max_new_tokens=2, request_id="1") == "1"
    assert engine.add_request([1, 2], NO_EOS, max_new_tokens=2) == "0"
    assert engine.add_request([1, 2], NO_EOS, max_new_tokens=2) == "2"   # was "already in use"
    with pytest.raises(ValueError, match="already in use"):
        engine.add_request([1], NO_EOS, request_id="2")
    engine.run()
    pool_is_whole(engine)


@pytest.mark.parametrize("finish_first", [False, True])
def test_fork_children_never_clobber_a_user_request(tiny_lm, finish_first):
    """A user request named "0.2" and a request "0" with n = 3: the children used to be named
    "0.2" (a ValueError in the middle of step, or the finished user request overwritten)."""
    a, b = prompts_for(tiny_lm, [3, 4], seed=5)
    engine = LLMEngine(tiny_lm, block_size=4, num_blocks=32)
    engine.add_request(a, NO_EOS, max_new_tokens=2, request_id="0.2")
    if finish_first:
        engine.run()
    outs = engine.generate([b], NO_EOS.replace(n=3), max_new_tokens=3)
    assert [o.request_id for o in outs] == ["0", "0.1", "0.3"]
    assert all(o.token_ids == generate(tiny_lm, b, NO_EOS, max_new_tokens=3).token_ids for o in outs)
    user = engine.output("0.2")
    assert user.prompt_ids == a and user.token_ids == generate(tiny_lm, a, NO_EOS, max_new_tokens=2).token_ids
    pool_is_whole(engine)


def test_add_request_bad_arrival_time(tiny_lm):
    engine = LLMEngine(tiny_lm, block_size=4, num_blocks=8, clock=lambda: 10.0)
    with pytest.raises(ValueError, match="arrival_time"):
        engine.add_request([1], NO_EOS, arrival_time=11.0)          # in the future: negative queue time
    with pytest.raises(ValueError, match="arrival_time"):
        engine.add_request([1], NO_EOS, arrival_time="now")
    rid = engine.add_request([1], NO_EOS, max_new_tokens=1, arrival_time=4.0)
    engine.run()
    assert engine.output(rid).metrics.ttft == 6.0


def test_goodput_bad_slo_types():
    for value in ("1", float("nan"), -1.0, True):
        with pytest.raises(ValueError, match="ttft_slo"):
            goodput([], ttft_slo=value)


def test_runner_rejects_empty_batch_bad_ids_and_negative_starts(tiny_lm):
    runner = ModelRunner(tiny_lm, 4, 8)
    vocab = tiny_lm.model.config.vocab_size
    with pytest.raises(ValueError, match="empty batch"):
        runner.forward([], [], [])
    with pytest.raises(ValueError, match="token ids"):
        runner.forward([[vocab]], [0], [[0]])                        # was an IndexError
    with pytest.raises(ValueError, match="token ids"):
        runner.forward([[-1]], [0], [[0]])
    with pytest.raises(ValueError, match="start_positions"):
        build_metadata([1], [-1], [[0]], 4)                          # position -1 wrapped to the last one
    with pytest.raises(ValueError, match="num_cpu_blocks"):
        ModelRunner(tiny_lm, 4, 8, num_cpu_blocks=-2)


# ============================================================================ engine: pools at the edge
def test_step_with_nothing_queued(tiny_lm):
    engine = LLMEngine(tiny_lm, block_size=4, num_blocks=4)
    assert engine.step() == [] and engine.step() == [] and not engine.has_unfinished_requests()
    assert engine.run() == [] and engine.generate([]) == []
    pool_is_whole(engine)


def test_one_block_pool_and_a_prompt_exactly_filling_the_pool(tiny_lm):
    engine = LLMEngine(tiny_lm, block_size=4, num_blocks=1)
    ok = engine.add_request([1, 2, 3], NO_EOS, max_new_tokens=2)     # 4 slots: exactly one block
    bad = engine.add_request([1, 2, 3], NO_EOS, max_new_tokens=3)    # 5 slots
    engine.run()
    assert engine.output(ok).token_ids == generate(tiny_lm, [1, 2, 3], NO_EOS, max_new_tokens=2).token_ids
    assert engine.output(bad).finish_reason == "error" and engine.output(bad).token_ids == []
    pool_is_whole(engine)
    (p8, p7) = prompts_for(tiny_lm, [8, 7], seed=9)
    engine = LLMEngine(tiny_lm, block_size=4, num_blocks=2)
    ids = [engine.add_request(p8, NO_EOS, max_new_tokens=1),        # prompt = the whole pool
           engine.add_request(p7, NO_EOS, max_new_tokens=2),
           engine.add_request(p8, NO_EOS, max_new_tokens=2)]         # one slot too many
    engine.run()
    assert engine.output(ids[0]).token_ids == generate(tiny_lm, p8, NO_EOS, max_new_tokens=1).token_ids
    assert engine.output(ids[1]).token_ids == generate(tiny_lm, p7, NO_EOS, max_new_tokens=2).token_ids
    assert engine.output(ids[2]).finish_reason == "error"
    pool_is_whole(engine)


def test_requests_added_while_running_and_never_fitting_ones_mixed_in(tiny_lm):
    prompts = prompts_for(tiny_lm, [5, 30, 7, 3, 33], seed=13)
    engine = LLMEngine(tiny_lm, block_size=4, num_blocks=7, max_num_seqs=2)   # 28 slots
    ids = []
    for p in prompts:
        ids.append(engine.add_request(p, NO_EOS, max_new_tokens=6))
        engine.step()
    engine.run()
    for rid, p in zip(ids, prompts):
        out = engine.output(rid)
        if len(p) + 5 > 28:
            assert out.finish_reason == "error" and "blocks" in out.error
        else:
            assert out.token_ids == generate(tiny_lm, p, NO_EOS, max_new_tokens=6).token_ids
    pool_is_whole(engine)


# ============================================================================ engine: swap of shared blocks
@pytest.mark.parametrize("params", [NO_EOS, SamplingParams(temperature=0.8, top_k=20, seed=3, ignore_eos=True)])
def test_swapping_out_two_forks_that_share_a_block(tiny_lm, params):
    """Two forks sharing a block swapped out in one step: the step's swap-out plan was a dict
    keyed by the device block, so the second fork's copy replaced the first's and that fork
    later swapped in a CPU block that was never written (zeros, or stale KV)."""
    a, b = prompts_for(tiny_lm, [3, 5], seed=26)
    engine = LLMEngine(tiny_lm, block_size=8, num_blocks=2, preemption_mode="swap", num_cpu_blocks=8)
    engine.add_request(a, NO_EOS, max_new_tokens=4)
    engine.add_request(b, params.replace(n=3), max_new_tokens=8, request_id="b")
    engine.step()                                                   # both prefills; b forks into b, b.1, b.2
    engine.step()                                                   # b's copy-on-write preempts b.2 and b.1
    bm, runner = engine.block_manager, engine.runner
    assert bm.is_swapped("b.1") and bm.is_swapped("b.2")
    m = bm.num_tokens("b.1")
    resident = runner.kv_cache[:, :, bm.block_table("b")[0], :m]   # the same prompt + first token
    for fork in ("b.1", "b.2"):
        torch.testing.assert_close(runner.cpu_cache[:, :, bm.block_table(fork)[0], :m], resident)
    engine.run()
    for k, rid in enumerate(["b", "b.1", "b.2"]):
        ref = generate(tiny_lm, b, params.replace(seed=None if params.seed is None else params.seed + k),
                       max_new_tokens=8)
        assert engine.output(rid).token_ids == ref.token_ids, rid
    pool_is_whole(engine)


@pytest.mark.parametrize("mode, cpu", [("recompute", 0), ("swap", 16), ("swap", 0), ("swap", 1)])
def test_parallel_sampling_under_memory_pressure(tiny_lm, mode, cpu):
    """n = 4 seeded samples in a pool that holds about two: forks are preempted (copy-on-write
    blocks shared), swapped or recomputed; sample k equals generate() with seed + k."""
    (p,) = prompts_for(tiny_lm, [6], seed=31)
    params = SamplingParams(temperature=1.0, top_p=0.95, repetition_penalty=1.1, n=4, seed=7, ignore_eos=True)
    engine = LLMEngine(tiny_lm, block_size=4, num_blocks=5, preemption_mode=mode, num_cpu_blocks=cpu)
    outs = engine.generate([p], params, max_new_tokens=8)
    assert [o.request_id for o in outs] == ["0", "0.1", "0.2", "0.3"]
    assert sum(o.metrics.num_preemptions for o in outs) > 0
    for k, o in enumerate(outs):
        assert o.finish_reason == "length"
        assert o.token_ids == generate(tiny_lm, p, params.replace(seed=7 + k, n=1), max_new_tokens=8).token_ids
    pool_is_whole(engine)


# ============================================================================ engine: chunked prefill, prefix caching
def test_chunked_prefill_with_chunk_one(tiny_lm):
    prompts = prompts_for(tiny_lm, [5, 3, 9], seed=41)
    engine = LLMEngine(tiny_lm, block_size=4, num_blocks=16, enable_chunked_prefill=True, max_prefill_chunk=1,
                       max_num_batched_tokens=2, max_num_seqs=2, record_history=True)
    outs = engine.generate(prompts, NO_EOS, max_new_tokens=5)
    for p, o in zip(prompts, outs):
        assert o.token_ids == generate(tiny_lm, p, NO_EOS, max_new_tokens=5).token_ids
    assert max(n for h in engine.history for n in h.scheduled_tokens.values()) == 1
    pool_is_whole(engine)


def test_prefix_caching_identical_prompts_diverging_in_the_last_partial_block(tiny_lm):
    (base,) = prompts_for(tiny_lm, [6], seed=51)                    # one full block + 2 tokens
    prompts = [base + [11], base + [12], base + [11], base[:4]]
    engine = LLMEngine(tiny_lm, block_size=4, num_blocks=12, enable_prefix_caching=True)
    first = engine.generate(prompts[:1], NO_EOS, max_new_tokens=4)
    rest = engine.generate(prompts[1:], NO_EOS, max_new_tokens=4)
    for p, o in zip(prompts, first + rest):
        assert o.token_ids == generate(tiny_lm, p, NO_EOS, max_new_tokens=4).token_ids
    bm = engine.block_manager
    assert bm.num_prefix_hit_tokens(base + [99]) == 4           # only the full block is shared
    assert bm.num_prefix_hit_tokens(base[:4]) == 0               # a hit must leave one token to compute
    assert bm.num_prefix_hit_blocks == 2
    pool_is_whole(engine)


def test_c15_eviction_then_the_same_prefix_again(tiny_lm):
    """Pool of 8 blocks of 4: A is cached, enough other prompts evict it, then A again is a
    miss (recomputed, same output), and right after that a hit."""
    prompts = prompts_for(tiny_lm, [6] * 6, seed=15)
    engine = LLMEngine(tiny_lm, block_size=4, num_blocks=8, enable_prefix_caching=True)
    bm = engine.block_manager
    ref = {i: generate(tiny_lm, p, NO_EOS, max_new_tokens=4).token_ids for i, p in enumerate(prompts)}
    (out,) = engine.generate([prompts[0]], NO_EOS, max_new_tokens=4)
    assert bm.num_prefix_hit_tokens(prompts[0]) == 4
    for i in range(1, 6):
        engine.generate([prompts[i]], NO_EOS, max_new_tokens=4)
    assert bm.num_evictions > 0 and bm.num_prefix_hit_tokens(prompts[0]) == 0
    hits = bm.num_prefix_hit_blocks
    (again,) = engine.generate([prompts[0]], NO_EOS, max_new_tokens=4)
    assert again.token_ids == out.token_ids == ref[0] and bm.num_prefix_hit_blocks == hits
    (third,) = engine.generate([prompts[0]], NO_EOS, max_new_tokens=4)
    assert third.token_ids == ref[0] and bm.num_prefix_hit_blocks == hits + 1
    pool_is_whole(engine)


# ============================================================================ engine: seeds
def test_seeded_engine_outputs_reproducible_and_equal_to_generate(tiny_lm):
    """Same seed → same tokens, whatever the batch mates, pool size or preemption; equal to
    labsupport.generation.generate with the same SamplingParams (both draw one multinomial per
    token from a torch.Generator seeded with params.seed)."""
    prompts = prompts_for(tiny_lm, [5, 7, 4], seed=61)
    params = [SamplingParams(temperature=0.9, top_k=40, top_p=0.9, min_p=0.02, repetition_penalty=1.2,
                             seed=100 + i, ignore_eos=True) for i in range(3)]
    refs = [generate(tiny_lm, p, sp, max_new_tokens=10).token_ids for p, sp in zip(prompts, params)]
    for settings in ({"num_blocks": 64}, {"num_blocks": 6, "preemption_mode": "recompute"},
                     {"num_blocks": 6, "preemption_mode": "swap", "num_cpu_blocks": 8},
                     {"num_blocks": 64, "enable_chunked_prefill": True, "max_prefill_chunk": 2,
                      "max_num_batched_tokens": 4, "max_num_seqs": 4}):
        engine = LLMEngine(tiny_lm, block_size=4, **settings)
        ids = [engine.add_request(p, sp, max_new_tokens=10) for p, sp in zip(prompts, params)]
        engine.run()
        assert [engine.output(r).token_ids for r in ids] == refs, settings
        pool_is_whole(engine)


# ============================================================================ engine: random streams with forks
@pytest.mark.parametrize("seed", range(6))
def test_random_streams_with_forks_sampling_swap_and_chunks(tiny_lm, seed):
    """Random small pools with n > 1, seeded sampling, swap (with little CPU space), prefix
    caching and 1-token chunks; every output equals its generate() reference."""
    rng = random.Random(seed)
    vocab = tiny_lm.model.config.vocab_size
    bs = rng.choice([1, 2, 4, 8])
    chunk = rng.choice([None, 1, 3])
    max_num_seqs = rng.randint(1, 4)
    engine = LLMEngine(tiny_lm, block_size=bs, num_blocks=max(2, rng.randint(8, 40) // bs),
                       preemption_mode=rng.choice(["recompute", "swap"]), num_cpu_blocks=rng.choice([0, 2, 64]),
                       enable_prefix_caching=rng.random() < 0.5, enable_chunked_prefill=chunk is not None,
                       max_prefill_chunk=chunk, max_num_seqs=max_num_seqs,
                       max_num_batched_tokens=max(4, max_num_seqs) if chunk else 64)
    shared = [rng.randrange(vocab) for _ in range(8)]
    pending = []
    for _ in range(rng.randint(2, 5)):
        p = (shared[:rng.choice([0, 4, 8])] + [rng.randrange(vocab) for _ in range(rng.randint(1, 10))])
        sp = SamplingParams(temperature=rng.choice([0.0, 0.7, 1.0]), top_k=rng.choice([0, 5]),
                            repetition_penalty=rng.choice([1.0, 1.2]), n=rng.choice([1, 2, 3]),
                            seed=rng.randrange(100), ignore_eos=True)
        pending.append((rng.randint(0, 4), p, sp, rng.randint(1, 8)))
    pending.sort(key=lambda r: r[0])
    added, step = {}, 0
    while pending or engine.has_unfinished_requests():
        while pending and pending[0][0] <= step:
            _, p, sp, m = pending.pop(0)
            added[engine.add_request(p, sp, max_new_tokens=m)] = (p, sp, m)
        engine.step()
        engine.block_manager.audit()
        step += 1
        assert step < 1000
    for rid, (p, sp, m) in added.items():
        out = engine.output(rid)
        forks = sorted((r for r in engine.requests if r.startswith(rid + ".")), key=lambda r: engine.requests[r].order)
        if out.finish_reason == "error":
            assert out.token_ids == [] and not forks
            continue
        samples = [rid, *forks]
        assert len(samples) == sp.n
        for k, r in enumerate(samples):
            ref = generate(tiny_lm, p, sp.replace(seed=sp.seed + k, n=1), max_new_tokens=m, record=False)
            assert engine.output(r).token_ids == ref.token_ids, (r, engine.config)
    pool_is_whole(engine)


# ============================================================================ more of each case's kind
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_c05_and_c08_kind_in_low_precision_and_batches(dtype):
    z = torch.log(torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.4, 0.3, 0.2, 0.1]])).to(dtype)
    out = min_p_filter(z, 0.76)
    assert kept(out[0]) == {3} and kept(out[1]) == {0}              # never empty, row by row
    pen = apply_repetition_penalty(torch.tensor([[-2.0, 1.0, 0.5]] * 2, dtype=dtype), [[0, 1], []], 2.0)
    assert pen.dtype == torch.float32 and pen.tolist() == [[-4.0, 0.5, 0.5], [-2.0, 1.0, 0.5]]


def test_c12_kind_batch_of_very_different_lengths(tiny_lm):
    prompts = prompts_for(tiny_lm, [1, 4, 11], seed=71)
    batch = generate_batch(tiny_lm, prompts, NO_EOS, max_new_tokens=6)
    for p, row in zip(prompts, batch):
        assert row.token_ids == generate(tiny_lm, p, NO_EOS, max_new_tokens=6).token_ids


def test_parallel_samples_of_a_one_token_request(tiny_lm):
    """n = 3 with max_new_tokens = 1: the forks are made and finish in the same step."""
    (p,) = prompts_for(tiny_lm, [5], seed=81)
    params = SamplingParams(temperature=1.0, n=3, seed=9, ignore_eos=True)
    engine = LLMEngine(tiny_lm, block_size=4, num_blocks=2)
    outs = engine.generate([p], params, max_new_tokens=1)
    assert [(o.request_id, o.finish_reason) for o in outs] == [("0", "length"), ("0.1", "length"), ("0.2", "length")]
    for k, o in enumerate(outs):
        assert o.token_ids == generate(tiny_lm, p, params.replace(seed=9 + k, n=1), max_new_tokens=1).token_ids
    pool_is_whole(engine)
