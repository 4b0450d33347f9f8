"""Speculative decoding: theory, exact verification, the loop, exactness of the output
distribution — and proof that the distribution check catches the classic bugs."""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from helpers import shipped_tokenizer

from labsupport.bench.speculative import measure_costs
from labsupport.engine.sequence import Sequence
from labsupport.generation import generate
from labsupport.models import LoadedModel
from labsupport.sampling import GREEDY, SamplingParams, apply_repetition_penalty, probs_from_logits, sample_from
from labsupport.speculative import (
    Draft,
    DraftModelProposer,
    NgramProposer,
    SpecSequence,
    SpecStats,
    VerifyResult,
    acceptance_probability,
    accepted_prefix_length,
    best_gamma,
    check_same_vocabulary,
    draft_tokens,
    expected_accepted,
    expected_tokens_per_round,
    independent_tokens_estimate,
    lookup_ngram,
    residual_distribution,
    sampling_noise_floor,
    simulate_rounds,
    simulate_two_tokens,
    speculative_generate,
    speedup,
    total_variation,
    two_token_tree,
    verify,
    verify_draft,
    verify_logits,
)
from labsupport.stopping import StopRule

# ----------------------------------------------------------------------------- models


def make_lm(seed: int, sharpness: float = 1.0, n_positions: int = 160) -> LoadedModel:
    """Random 2-layer GPT-2 (untied head, so greedy text is not one token repeated) with the
    shipped tokenizer; ``sharpness`` scales the output head (larger = peakier distributions)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    tok = shipped_tokenizer()
    torch.manual_seed(seed)
    cfg = GPT2Config(vocab_size=len(tok), n_layer=2, n_head=2, n_embd=64, n_positions=n_positions,
                     bos_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id, tie_word_embeddings=False)
    model = GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(sharpness)
    return LoadedModel(model=model, tokenizer=tok, device=torch.device("cpu"), name=f"random-{seed}")


def perturbed(lm: LoadedModel, seed: int, eps: float) -> LoadedModel:
    """A draft that resembles the target: every weight plus ``eps`` × its std of noise."""
    model = copy.deepcopy(lm.model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * eps * p.std().clamp_min(1e-3))
    return LoadedModel(model=model, tokenizer=lm.tokenizer, device=lm.device, name=f"perturbed-{seed}")


def target_and_draft(seed: int) -> tuple[LoadedModel, LoadedModel]:
    """A random target (:func:`make_lm`) and a draft perturbed from it: the pair the speculative tests share."""
    target = make_lm(seed)
    return target, perturbed(target, 1, 0.25)


@pytest.fixture(scope="module")
def pair():
    return target_and_draft(0)


PROMPT = [5, 17, 99, 3, 42, 8]

# ----------------------------------------------------------------------------- theory (worked numbers)


def test_tokens_per_round_and_speedup_for_a_draft_at_a_tenth_of_the_cost():
    assert expected_tokens_per_round(0.8, 4) == pytest.approx(3.3616)              # "≈ 3.36"
    assert speedup(0.8, 4, 0.1) == pytest.approx(3.3616 / 1.4)                       # "≈ 2.4×"
    assert round(speedup(0.8, 4, 0.1), 1) == 2.4
    assert [round(speedup(0.8, g, 0.1), 2) for g in (3, 4, 5, 6, 7)] == [2.27, 2.40, 2.46, 2.47, 2.45]
    g, s = best_gamma(0.8, 0.1)
    assert (g, round(s, 2)) == (6, 2.47)


def test_best_gamma_for_cheaper_and_costlier_drafts():
    assert round(expected_tokens_per_round(0.75, 3), 2) == 2.73
    assert round(speedup(0.75, 3, 0.05), 1) == 2.4
    assert round(speedup(0.8, 4, 0.05), 1) == 2.8
    g, s = best_gamma(0.8, 0.05)
    assert (g, round(s, 1)) == (8, 3.1)
    g, s = best_gamma(0.8, 0.3)                                    # a costly draft: optimum 3, ≈ 1.55×
    assert g == 3 and round(s, 1) == 1.6 and s == pytest.approx(1.554, abs=1e-3)


def test_formula_limits_and_identities():
    for a in (0.0, 0.3, 0.9):
        for g in range(9):
            assert expected_tokens_per_round(a, g) == pytest.approx(1 + expected_accepted(a, g))
    assert expected_tokens_per_round(1.0, 5) == 6
    assert expected_tokens_per_round(0.0, 5) == 1
    assert expected_tokens_per_round(0.9, 400) == pytest.approx(10.0, rel=1e-9)    # ceiling 1/(1-α)
    assert speedup(0.8, 4, 0.0, v=1.0) == expected_tokens_per_round(0.8, 4)
    assert speedup(0.8, 4, 0.1, v=2.0) == pytest.approx(3.3616 / 2.4)
    g, _ = best_gamma(0.8, 0.1, v=[0] + [1 + 0.25 * k for k in range(1, 17)])       # costly verification
    assert g < 6


def test_independent_tokens_estimate_against_derived_and_monte_carlo():
    """The circulating estimate 1/(1-α+α/(k+1)) for α=0.7, k=5 evaluates to 2.40, the derived
    formula to 2.94, and a Monte Carlo of the rounds agrees with the derived one."""
    assert independent_tokens_estimate(0.7, 5) == pytest.approx(2.4, abs=1e-9)
    derived = expected_tokens_per_round(0.7, 5)
    assert derived == pytest.approx(2.941, abs=1e-3)
    flags = simulate_rounds(0.7, 5, 200_000, np.random.default_rng(0))
    mc = float(np.mean(accepted_prefix_length(flags) + 1))
    sd = float(np.std(accepted_prefix_length(flags) + 1)) / math.sqrt(200_000)
    assert abs(mc - derived) < 4 * sd
    assert abs(mc - independent_tokens_estimate(0.7, 5)) > 50 * sd
    for a in (0.0, 1.0):
        assert independent_tokens_estimate(a, 5) == pytest.approx(expected_tokens_per_round(a, 5))


@pytest.mark.parametrize("call", [
    lambda: expected_tokens_per_round(1.2, 4), lambda: expected_tokens_per_round(0.5, -1),
    lambda: speedup(0.5, 4, -0.1), lambda: speedup(0.5, 4, 0.1, v=0), lambda: best_gamma(0.5, 0.1, 0),
    lambda: simulate_rounds(0.5, 0, 10, np.random.default_rng(0)), lambda: NgramProposer(0),
])
def test_bad_input_raises(call):
    with pytest.raises(ValueError):
        call()


@pytest.mark.parametrize("call, name", [
    (lambda: simulate_rounds(0.5, 4, 0, np.random.default_rng(0)), "n_rounds"),
    (lambda: simulate_rounds(0.5, 0, 10, np.random.default_rng(0)), "gamma"),
    (lambda: NgramProposer(prompt_lookup_min=0), "prompt_lookup_min"),
    (lambda: NgramProposer(prompt_lookup_max=1, prompt_lookup_min=2), "prompt_lookup_max"),
    (lambda: NgramProposer(0), "num_speculative_tokens"),
    (lambda: independent_tokens_estimate(0.5, -1), "k"),
    (lambda: best_gamma(0.5, 0.1, 0), "gamma_max"),
    (lambda: speedup(0.5, 4, 0.1, v=0), "v"),
    (lambda: expected_tokens_per_round(1.2, 4), "alpha"),
])
def test_bad_input_names_the_parameter(call, name):
    with pytest.raises(ValueError, match=rf"^{name} must be"):
        call()


def test_wrong_types_raise_type_error():
    with pytest.raises(TypeError, match="^gamma must be an integer"):
        expected_tokens_per_round(0.5, 2.0)
    with pytest.raises(TypeError, match="^alpha must be a number"):
        speedup("0.5", 4, 0.1)
    with pytest.raises(TypeError, match="^prompt_lookup_min must be an integer"):
        NgramProposer(prompt_lookup_min=True)


# ----------------------------------------------------------------------------- verification


def test_accept_probabilities_residual_and_first_token_marginal():
    p = torch.tensor([0.6, 0.3, 0.1])
    q = torch.tensor([0.2, 0.5, 0.3])
    acc = acceptance_probability(p.expand(3, 3), q.expand(3, 3), torch.arange(3))
    assert torch.allclose(acc, torch.tensor([1.0, 0.6, 1 / 3]))
    assert torch.allclose(residual_distribution(p, q), torch.tensor([1.0, 0.0, 0.0]))
    # exact marginal: q·min(1,p/q) + P(reject)·residual = p
    exact = q * acc + (1 - (q * acc).sum()) * residual_distribution(p, q)
    assert torch.allclose(exact, p)
    n = 200_000
    g = torch.Generator().manual_seed(18)
    d = sample_from(q.expand(n, 3), g)
    res = verify(p.expand(n, 2, 3), q.expand(n, 1, 3), d.unsqueeze(1), g)
    first = torch.where(res.num_accepted > 0, d, res.next_token)
    freq = torch.bincount(first, minlength=3).double() / n
    sigma = torch.sqrt(p.double() * (1 - p.double()) / n)
    assert ((freq - p.double()).abs() < 4 * sigma).all(), (freq, p)


def _first_token_matches_target(verify_fn, n=200_000, seed=19):
    t_logits = torch.tensor([2.0, 1.5, 1.0, 0.5])
    d_logits = torch.tensor([0.5, 1.0, 1.5, 2.0])
    params = SamplingParams(temperature=0.7)
    g = torch.Generator().manual_seed(seed)
    d = sample_from(probs_from_logits(d_logits, params).expand(n, 4), g)     # the drafter samples at T
    res = verify_fn(t_logits.expand(n, 2, 4), d_logits.expand(n, 1, 4), d.unsqueeze(1), params, g)
    first = torch.where(res.num_accepted > 0, d, res.next_token)
    freq = torch.bincount(first, minlength=4).double() / n
    p = torch.softmax(t_logits.double() / 0.7, dim=0)
    return bool(((freq - p).abs() < 4 * torch.sqrt(p * (1 - p) / n)).all())


# ----------------------------------------------------------------------------- deliberately broken verifiers


def _broken_verify(p, q, draft, generator, bug):
    """A copy of ``verify`` with one classic bug (``bug`` names it)."""
    B, g1, V = p.shape
    g = g1 - 1
    accept_prob = acceptance_probability(p[:, :g], q, draft)
    accepted = torch.rand((B, g), generator=generator) < accept_prob
    n = accepted_prefix_length(accepted)
    if bug == "residual_unnormalised":
        # max(0, p - q) drawn by inverse CDF with one uniform, as a hand-written sampler does
        # (torch.multinomial would renormalise silently): mass beyond Σr lands on the last id.
        resid = (p[:, :g] - q).clamp_min(0)
        dist = torch.cat([resid, p[:, g:]], dim=1)[torch.arange(B), n]
        u = torch.rand((B, 1), generator=generator)
        nxt = torch.searchsorted(dist.cumsum(-1), u, right=True).squeeze(1).clamp(max=V - 1)
        return VerifyResult(n, nxt, accepted, accept_prob)
    if bug == "resample_from_target":
        dist = p                                            # rejection resamples from p, not p − q
    elif bug == "bonus_off_by_one":
        dist = torch.cat([residual_distribution(p[:, :g], q), p[:, g - 1:g]], dim=1)
    else:
        raise ValueError(bug)
    return VerifyResult(n, sample_from(dist[torch.arange(B), n], generator), accepted, accept_prob)


def _logits_fn(bug):
    """A ``verify_logits`` replacement with ``bug``."""
    def fn(t_logits, d_logits, draft, params, generator):
        B, g1, V = t_logits.shape
        t_params = d_params = params
        if bug == "temperature_target_only":                # the verifier forgets the draft's T
            d_params = params.replace(temperature=1.0)
        if bug == "temperature_draft_only":                 # the verifier forgets the target's T
            t_params = params.replace(temperature=1.0)
        p = probs_from_logits(t_logits.reshape(-1, V), t_params).reshape(B, g1, V)
        q = probs_from_logits(d_logits.reshape(-1, V), d_params).reshape(B, g1 - 1, V)
        if bug.startswith("temperature"):
            return verify(p, q, draft, generator)
        return _broken_verify(p, q, draft, generator, bug)
    return fn


BUGS = ["temperature_target_only", "temperature_draft_only", "bonus_off_by_one",
        "residual_unnormalised", "resample_from_target"]


def test_temperature_on_both_sides_keeps_the_target_distribution():
    assert _first_token_matches_target(verify_logits)


@pytest.mark.parametrize("bug", ["temperature_target_only", "temperature_draft_only"])
def test_temperature_on_one_side_only_breaks_the_distribution(bug):
    assert not _first_token_matches_target(_logits_fn(bug))


def test_only_the_accepted_prefix_counts():
    flags = torch.tensor([[True, False, True], [True, True, True], [False, True, True]])
    assert accepted_prefix_length(flags).tolist() == [1, 3, 0]
    assert (accepted_prefix_length(flags) + 1).tolist() == [2, 4, 1]
    assert accepted_prefix_length(flags.numpy()).tolist() == [1, 3, 0]
    # the same through verify: accept prob 1 where the flag is T (p = q), 0 where F (p(d) = 0)
    V = 6
    draft = torch.tensor([[1, 2, 3]] * 3)
    q = torch.nn.functional.one_hot(draft, V).float()
    p = torch.zeros(3, 4, V)
    for b in range(3):
        for i in range(3):
            p[b, i, draft[b, i] if flags[b, i] else 0] = 1.0
        p[b, 3, 5] = 1.0                                    # the bonus row: token 5
    res = verify(p, q, draft, torch.Generator().manual_seed(0))
    assert res.num_accepted.tolist() == [1, 3, 0]
    assert [res.tokens(draft, b) for b in range(3)] == [[1, 0], [1, 2, 3, 5], [0]]


def test_verify_greedy_is_argmax_match_and_padding():
    V = 5
    t = torch.nn.functional.one_hot(torch.tensor([[2, 4, 1]]), V).float()      # target arg-max 2, 4, then 1
    draft = torch.tensor([[2, 3]])
    q = torch.nn.functional.one_hot(draft, V).float()
    res = verify(t, q, draft)
    assert res.num_accepted.tolist() == [1] and res.next_token.tolist() == [4]
    res = verify(t, q, torch.tensor([[2, 4]]), num_draft=torch.tensor([1]))    # position 2 is padding
    assert res.num_accepted.tolist() == [1] and res.next_token.tolist() == [4]
    with pytest.raises(ValueError):
        verify(t, q[:, :1], draft)


def test_greedy_fast_path_equals_general_verification():
    """verify_draft's greedy branch (arg-max comparison) = verify() on one-hot p and q."""
    g = torch.Generator().manual_seed(3)
    V = 7
    for trial in range(40):
        k = trial % 5
        logits = torch.randn(k + 1, V, generator=g) * 3
        best = logits.argmax(-1)
        drafts = [int(best[i]) if torch.rand(1, generator=g) < 0.6 else int(torch.randint(V, (1,), generator=g))
                  for i in range(k)]
        s = SpecSequence(Sequence("0", [1], 9, [2], params=GREEDY, stop_rule=StopRule.from_params(GREEDY, (), 9)),
                         SpecStats(4))
        rec, path = verify_draft(logits, Draft(drafts), s)
        assert path == list(range(1, rec.num_accepted + 1))
        p = torch.nn.functional.one_hot(best, V).float().unsqueeze(0)
        q = torch.nn.functional.one_hot(torch.tensor(drafts, dtype=torch.long), V).float().reshape(1, k, V)
        res = verify(p, q, torch.tensor([drafts], dtype=torch.long).reshape(1, k), g)
        assert (rec.num_accepted, rec.next_token) == (int(res.num_accepted[0]), int(res.next_token[0]))
        assert rec.accept_prob == res.accept_prob[0].tolist()


# ----------------------------------------------------------------------------- distribution on a real pair


JOINT_PARAMS = SamplingParams(temperature=0.7, top_k=4)
N_JOINT = 100_000


@pytest.fixture(scope="module")
def joint_setup():
    """A target and a perturbed copy as draft (their top-4 sets overlap only partly, so every
    path — accept, replace, bonus — carries probability); the exact joint and the noise floor."""
    target = make_lm(3, sharpness=8.0)
    draft = perturbed(target, 4, 0.3)
    tree = two_token_tree(target, draft, PROMPT, JOINT_PARAMS)
    exact = tree.exact_joint(JOINT_PARAMS)
    floor = sampling_noise_floor(exact, N_JOINT, torch.Generator().manual_seed(8))
    return (target, draft), tree, exact, floor


def _joint_error(setup, verify_fn):
    _, tree, exact, floor = setup
    freq = simulate_two_tokens(tree, JOINT_PARAMS, N_JOINT, torch.Generator().manual_seed(7), verify_fn)
    return total_variation(freq, exact), floor


def test_two_token_joint_is_exactly_the_targets(joint_setup):
    _, tree, exact, _ = joint_setup
    assert exact.sum() == pytest.approx(1.0, abs=1e-5)
    assert (exact > 1e-3).sum() >= 8                        # a real joint, not a point mass
    p0 = probs_from_logits(tree.t0, JOINT_PARAMS)
    q0 = probs_from_logits(tree.d0, JOINT_PARAMS)
    assert 0.2 < float(torch.minimum(p0, q0).sum()) < 0.9   # both acceptance and rejection happen
    err, floor = _joint_error(joint_setup, verify_logits)
    assert err <= 1.5 * floor, (err, floor)


@pytest.mark.parametrize("bug", BUGS)
def test_two_token_check_catches_each_classic_bug(joint_setup, bug):
    err, floor = _joint_error(joint_setup, _logits_fn(bug))
    assert err > 1.5 * floor, (bug, err, floor)


def test_two_token_tree_needs_small_support(joint_setup):
    pair = joint_setup[0]
    with pytest.raises(ValueError):
        two_token_tree(*pair, PROMPT, SamplingParams(temperature=1.0), max_support=64)
    with pytest.raises(ValueError):
        two_token_tree(*pair, PROMPT, GREEDY)
    with pytest.raises(ValueError):
        two_token_tree(*pair, PROMPT, SamplingParams(temperature=1.0, top_p=0.9))


# ----------------------------------------------------------------------------- the loop: greedy equality


def test_ngram_lookup_on_a_repeated_prompt_equals_greedy_target(pair):
    target, _ = pair
    ref = generate(target, [1, 1, 1], GREEDY, max_new_tokens=64, record=False)
    res = speculative_generate(target, NgramProposer(4), [1, 1, 1], GREEDY, max_new_tokens=64)
    assert res.token_ids == ref.token_ids and len(res.token_ids) == 64
    assert res.rounds[0].draft_tokens == [1]               # the only continuation of [1, 1] in [1, 1, 1]
    _check_rejects_non_argmax(res)


def test_draft_model_rejects_exactly_the_non_argmax_drafts(pair):
    target, draft = pair
    ref = generate(target, [1, 1, 1], GREEDY, max_new_tokens=64, record=False)
    res = speculative_generate(target, DraftModelProposer(draft, target, 4), [1, 1, 1], GREEDY, max_new_tokens=64)
    assert res.token_ids == ref.token_ids
    _check_rejects_non_argmax(res)
    assert any(r.num_accepted == 0 for r in res.rounds)     # a first-position rejection happened
    assert any(r.num_accepted > 0 for r in res.rounds)


def _check_rejects_non_argmax(res):
    for r in res.rounds:
        k, n = len(r.draft_tokens), r.num_accepted
        assert r.draft_tokens[:n] == r.target_argmax[:n]     # accepted ⇔ equal to the target arg-max
        if n < k:
            assert r.draft_tokens[n] != r.target_argmax[n]
        assert r.next_token == r.target_argmax[n]


@pytest.mark.parametrize("gamma", range(1, 9))
def test_greedy_speculative_equals_greedy_target(pair, gamma):
    target, draft = pair
    prompt = PROMPT + PROMPT[:3]                             # something for n-gram lookup to find
    ref = generate(target, prompt, GREEDY, max_new_tokens=48, record=False)
    for proposer in (DraftModelProposer(draft, target, gamma), NgramProposer(gamma)):
        res = speculative_generate(target, proposer, prompt, GREEDY, max_new_tokens=48)
        assert res.token_ids == ref.token_ids, (proposer.name, gamma)
        assert res.stats.produced >= len(res.token_ids)
        assert res.stats.target_forwards == len(res.rounds)


def test_kv_rollback_keeps_caches_consistent(pair):
    """After every round both caches hold exactly a prefix of the committed sequence."""
    target, draft = pair
    prop = DraftModelProposer(draft, target, 5)
    seen = []
    observe = prop.observe

    def checked(engine, s, draft_, path, hidden, logits):
        observe(engine, s, draft_, path, hidden, logits)
        n = prop.block_manager.num_slots(s.request_id)
        seen.append(n)
        assert n <= len(s.token_ids) - 1              # the draft's cache holds a prefix of the committed ids
        assert prop.block_manager.block_tables()[s.request_id].__len__() == prop.block_manager.blocks_needed(n)

    prop.observe = checked
    res = speculative_generate(target, prop, PROMPT, SamplingParams(temperature=1.0, seed=1), max_new_tokens=40)
    assert len(res.token_ids) == 40 and seen
    assert prop.block_manager.num_used_blocks == 0     # every draft block back once the request ended


def test_stopping_rules_inside_an_accepted_block(pair):
    target, _draft = pair
    full = speculative_generate(target, DraftModelProposer(target, target, 8), PROMPT, GREEDY, max_new_tokens=30)
    assert full.stats.alpha == 1.0 and full.rounds[0].bonus  # self-drafting: every token accepted
    # max_new_tokens in the middle of a block: exactly that many tokens
    cut = speculative_generate(target, DraftModelProposer(target, target, 8), PROMPT, GREEDY, max_new_tokens=5)
    assert cut.token_ids == full.token_ids[:5] and cut.finish_reason == "length"
    # EOS in the middle of a block: generation stops right after it (pretend token #3 is EOS)
    eos_id = full.token_ids[3]
    lm = _WithEos(target.model, target.tokenizer, target.device, "eos", eos=eos_id)
    res = speculative_generate(lm, DraftModelProposer(lm, lm, 8), PROMPT, GREEDY, max_new_tokens=30)
    assert res.token_ids == full.token_ids[:full.token_ids.index(eos_id) + 1]
    assert res.finish_reason == "stop"
    # a stop string
    text = target.decode(full.token_ids)
    stop = text[len(text) // 2:len(text) // 2 + 2]
    if stop.strip():
        res = speculative_generate(target, NgramProposer(8), PROMPT, SamplingParams(temperature=0, stop=(stop,)),
                                   max_new_tokens=30)
        assert res.finish_reason == "stop" and stop not in res.text


@dataclass
class _WithEos(LoadedModel):
    """The same model with another token playing end-of-sequence (the tokenizer is shared, untouched)."""

    eos: int = 0

    @property
    def eos_token_id(self) -> int:
        return self.eos

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return frozenset({self.eos})


def test_sampling_is_seeded_and_stats_add_up(pair):
    target, draft = pair
    params = SamplingParams(temperature=0.8, seed=5)
    a = speculative_generate(target, DraftModelProposer(draft, target, 4), PROMPT, params, max_new_tokens=40)
    b = speculative_generate(target, DraftModelProposer(draft, target, 4), PROMPT, params, max_new_tokens=40)
    assert a.token_ids == b.token_ids
    s = a.stats
    assert s.rounds == len(a.rounds) == s.target_forwards
    assert sum(len(r.emitted) for r in a.rounds) == len(a.token_ids) == 40
    assert s.reached[0] == sum(1 for r in a.rounds if r.draft_tokens)
    assert all(0 <= x <= 1 for x in s.acceptance_by_position if not math.isnan(x))
    assert s.tokens_per_round == pytest.approx(1 + sum(s.accepted) / s.rounds)
    assert 0 < s.mean_overlap <= 1


def test_vocabulary_mismatch_is_an_error_at_setup(pair):
    from transformers import GPT2Config, GPT2LMHeadModel

    target, _ = pair
    tok = shipped_tokenizer()
    other = GPT2LMHeadModel(GPT2Config(vocab_size=len(tok) + 10, n_layer=1, n_head=2, n_embd=32, n_positions=32))
    with pytest.raises(ValueError, match="vocabulary"):
        DraftModelProposer(LoadedModel(other, tok, torch.device("cpu"), "other"), target)
    tok2 = copy.deepcopy(tok)
    tok2.add_tokens(["<|extra|>"])
    with pytest.raises(ValueError, match="tokenizer"):
        check_same_vocabulary(target, LoadedModel(target.model, tok2, torch.device("cpu"), "t2"))


def test_draft_tokens_runs_sequences_in_lockstep_and_keeps_q_only_when_needed():
    V = 11
    W = torch.randn(V, V, generator=torch.Generator().manual_seed(2)) * 3     # logits after token t: W[t]
    calls = []

    def next_logits(feed):
        calls.append({k: list(v) for k, v in feed.items()})
        return {k: W[v[-1]] for k, v in feed.items()}

    def seq(rid, history, params, generator=None):
        return SpecSequence(Sequence(rid, history[:1], 99, history[1:], params=params, generator=generator,
                                     stop_rule=StopRule.from_params(params, (), 99)), SpecStats(3))

    seqs = [seq("a", [1, 2, 3, 4], GREEDY), seq("b", [5], SamplingParams(temperature=1.0), torch.Generator().manual_seed(0)),
            seq("c", [6], GREEDY)]
    props = draft_tokens(next_logits, seqs, {"a": [3, 4], "b": [5], "c": [6]}, {"a": 3, "b": 1, "c": 0})
    a1 = int(W[4].argmax())
    a2 = int(W[a1].argmax())
    a3 = int(W[a2].argmax())
    assert props["a"].tokens == [a1, a2, a3] and props["a"].q is None           # plain greedy: no q rows
    assert len(props["b"].tokens) == 1 and props["b"].q.shape == (1, V)
    assert torch.allclose(props["b"].q[0], torch.softmax(W[5], dim=-1))
    assert props["c"].tokens == [] and props["c"].q is None
    assert calls == [{"a": [3, 4], "b": [5]}, {"a": [a1]}, {"a": [a2]}]         # one call per step, no feed after
    # greedy with a repetition penalty: the arg-max of the penalised logits, q kept (one-hot)
    history = [int(W[4].argmax()), 4]
    pen = SamplingParams(temperature=0.0, repetition_penalty=5.0)
    prop = draft_tokens(next_logits, [seq("0", history, pen)], {"0": [4]}, {"0": 1})["0"]
    assert GREEDY.is_plain_greedy and not pen.is_plain_greedy and not SamplingParams(temperature=1.0).is_plain_greedy
    assert prop.tokens == [int(apply_repetition_penalty(W[4], history, 5.0).argmax())] != [int(W[4].argmax())]
    assert prop.q.shape == (1, V) and prop.q[0, prop.tokens[0]] == 1.0 and prop.q.sum() == 1.0


def test_lookup_ngram():
    assert lookup_ngram([5, 6, 7, 8, 5, 6], 3) == [7, 8, 5]
    assert lookup_ngram([5, 6, 7, 8, 5, 6], 1) == [7]
    assert lookup_ngram([1, 2, 3], 4) == []
    assert lookup_ngram([9, 1, 2, 9, 1, 3, 9, 1], 2) == [3, 9]          # latest full-length match
    assert lookup_ngram([9, 1, 2, 7, 9, 1], 4) == [2, 7, 9, 1]


def test_measure_costs_shapes(pair):
    target, draft = pair
    with pytest.raises(ValueError, match="^repeats must be"):
        measure_costs(target, draft, PROMPT, gammas=[1], repeats=0)
    cm = measure_costs(target, draft, PROMPT, gammas=[1, 2], repeats=2)
    assert set(cm.v) == {1, 2} and cm.t_target > 0 and cm.c > 0
    assert cm.predicted_speedup(2.0, 1) == pytest.approx(2.0 / (cm.c + cm.v[1]))
    assert cm.prefill == pytest.approx(cm.t_prefill / cm.t_target) and cm.t_prefill > 0
    assert cm.draft_prefill == pytest.approx(cm.t_draft_prefill / cm.t_target) and cm.t_draft_prefill > 0
    assert measure_costs(target, None, PROMPT, gammas=[1], repeats=1).draft_prefill == 0.0
    with pytest.raises(TypeError, match="^paged must be"):
        measure_costs(target, draft, PROMPT, gammas=[1], repeats=1, paged="yes")
    limit = target.model.config.n_positions
    with pytest.raises(ValueError, match=f"^context must leave room.*at most {limit - 4} tokens, got {limit - 3}"):
        measure_costs(target, draft, [5] * (limit - 3), gammas=[3], repeats=1)


def test_measure_costs_times_each_model_the_way_it_runs(pair, monkeypatch):
    """The draft always through a paged runner (DraftModelProposer's); the target with Hugging
    Face's cache (speculative_generate's) or, with ``paged=True``, a paged runner (the engine's)."""
    import labsupport.bench.spec_costs as bench_spec

    target, draft = pair
    made = []
    real_runner, real_cached = bench_spec.ModelRunner, bench_spec.CachedLM
    monkeypatch.setattr(bench_spec, "ModelRunner", lambda lm, *a: made.append(("paged", lm)) or real_runner(lm, *a))
    monkeypatch.setattr(bench_spec, "CachedLM", lambda lm: made.append(("cached", lm)) or real_cached(lm))
    for paged, kinds in ((False, [("cached", target), ("paged", draft)]), (True, [("paged", target), ("paged", draft)])):
        made.clear()
        cm = measure_costs(target, draft, PROMPT, gammas=[1, 3], repeats=1, paged=paged)
        assert made == kinds and set(cm.v) == {1, 3} and cm.t_prefill > 0 and cm.t_draft_prefill > 0


def test_sweep_prediction_adds_the_prefill_and_the_drafts_prefill(pair, monkeypatch):
    """pred = (p + n − 1) / (p + p_d + n / dec): the prefill (5 steps here) is not sped up and gives
    plain decoding its first token, a draft model prefills too (3 steps), n-gram lookup does not;
    c is the run's own drafting time per drafted token (not the costs' 0.5)."""
    import labsupport.bench.speculative as bench_spec
    from labsupport.bench.speculative import CostModel, speedup_sweep
    from labsupport.speculative import DraftModelProposer, NgramProposer

    target, draft = pair
    runs = []
    real = bench_spec.speculative_generate
    monkeypatch.setattr(bench_spec, "speculative_generate", lambda *a, **kw: runs.append(real(*a, **kw)) or runs[-1])
    costs = CostModel(t_target=1e-3, t_draft=5e-4, v={2: 1.5}, t_prefill=5e-3, t_draft_prefill=3e-3)
    params = SamplingParams(temperature=0.0, ignore_eos=True)
    for make, p_d in ((lambda g: DraftModelProposer(draft, target, g), 3.0), (NgramProposer, 0.0)):
        (row,) = speedup_sweep(target, make, PROMPT, params, [2], max_new_tokens=6, costs=costs, repeats=1)
        st = runs[-1].stats
        assert (row.prefill, row.draft_prefill) == (pytest.approx(5.0), pytest.approx(p_d))
        assert row.c == pytest.approx(st.draft_seconds / max(st.proposed, 1) / 1e-3)
        assert row.decode_speedup == pytest.approx(row.tokens_per_round / (row.mean_draft * row.c + row.v))
        assert row.predicted == pytest.approx((5 + 6 - 1) / (5 + p_d + 6 / row.decode_speedup))
    no_draft = CostModel(t_target=1e-3, t_draft=0.0, v={2: 1.5}, t_prefill=5e-3)
    with pytest.raises(ValueError, match="draft=None"):
        speedup_sweep(target, lambda g: DraftModelProposer(draft, target, g), PROMPT, params, [2],
                      max_new_tokens=6, costs=no_draft, repeats=1)


@pytest.mark.parametrize("kw, err, name", [({"t_target": 0.0}, ValueError, "t_target"),
                                           ({"t_prefill": -5.0}, ValueError, "t_prefill"),
                                           ({"t_draft_prefill": "x"}, TypeError, "t_draft_prefill"),
                                           ({"t_draft": float("nan")}, ValueError, "t_draft"),
                                           ({"v": [1.2]}, TypeError, "v must be a dict"),
                                           ({"v": {0: 1.2}}, ValueError, "γ"),
                                           ({"v": {2: -1.0}}, ValueError, r"v\[2\]")])
def test_cost_model_refuses_bad_times(kw, err, name):
    from labsupport.bench.speculative import CostModel

    with pytest.raises(err, match=name):
        CostModel(**{"t_target": 1e-3, "t_draft": 5e-4, "v": {2: 1.5}, **kw})


# ----------------------------------------------------------------------------- figures and panels


def test_round_cells_and_figures():
    from labsupport.viz.speculative import (
        acceptance_by_position_figure,
        distribution_check_figure,
        measured_speedup_figure,
        round_cells,
        rounds_figure,
        speedup_curve_figure,
        tokens_per_forward_heatmap,
        verify_cost_figure,
    )

    assert round_cells(["a", "b", "c"], 1, "X") == [("a", "accepted"), ("X", "replaced"), ("b", "discarded"),
                                                    ("c", "discarded")]
    assert round_cells(["a", "b"], 2, "B") == [("a", "accepted"), ("b", "accepted"), ("B", "bonus")]
    assert round_cells([], 0, "t") == [("t", "replaced")]
    with pytest.raises(ValueError):
        round_cells(["a"], 2, "X")
    flags = np.array([[True, False, True], [True, True, True], [False, True, True]])
    from labsupport.widgets.speculative import flags_to_rounds

    fig = rounds_figure(flags_to_rounds(flags), lambda i: "t" if i == 0 else f"draft-token-{i}")
    counts = {tr.name: len(tr.x) for tr in fig.data}
    assert list(counts.values()) == [1 + 3, 2, 1, 2 + 3]           # accepted, replaced, bonus, discarded
    assert all(len(t) <= 7 for tr in fig.data for t in tr.text)
    assert len(speedup_curve_figure([1, 2], [1.8, 2.4], [1.5, 1.7], [1.5, 1.6], best=(2, 1.7)).data) == 4
    with pytest.raises(ValueError):
        tokens_per_forward_heatmap([0.5], [1, 2], [[1.0]])
    assert tokens_per_forward_heatmap([0.5, 0.8], [1], [[1.5], [1.8]]).data[0].z.shape == (2, 1)
    assert len(acceptance_by_position_figure({"a": [0.5, float("nan")]}, theory_alpha=0.5).data) == 1
    assert len(measured_speedup_figure([1, 2], {"x": {"measured": [1, 1], "predicted": [1, 1]}}).data) == 2
    assert len(verify_cost_figure([1, 2], [1.2, 1.4], c=0.3).data) == 1
    with pytest.raises(ValueError):
        distribution_check_figure(["a", "b"], [0.5, 0.5], {"s": [1.0]})


def test_panels_build_and_react(pair):
    from labsupport.widgets.speculative import round_panel, theory_panel

    panel = theory_panel(alpha=0.8, gamma=4, c=0.1, n_rounds=500)
    assert "3.36" in panel.stats.value and "6 (2.47×)" in panel.stats.value
    panel.controls["alpha"].value = 0.5
    assert "3.36" not in panel.stats.value
    # the strip shows the 12 rounds simulated at α = 0.5, γ = 4 with the panel's seed (0 + γ)
    n = accepted_prefix_length(simulate_rounds(0.5, 4, 12, np.random.default_rng(4)))
    cells = {tr.name: len(tr.x) for tr in panel.figures[1].data}
    assert cells == {"accepted draft": int(n.sum()),
                     "the target's token (replaces the first rejected draft)": int((n < 4).sum()),
                     "bonus token (all drafts accepted)": int((n == 4).sum()),
                     "rejected or discarded draft (from the first rejection on)": int((4 - n)[n < 4].sum())}
    target, draft = pair
    box = round_panel(target, draft, "Return the number", gamma=3, max_new_tokens=12)
    first = box.state["result"]
    assert len(first.token_ids) == 12
    box.controls["proposer"].value = "n-gram"
    assert box.state["result"] is not first and box.state["result"].token_ids == first.token_ids   # greedy
    box.controls["temperature"].value = 1.0
    assert len(box.state["result"].token_ids) <= 12
