"""Every SamplingParams field on every decoding path: ``generate``, ``LLMEngine``,
``speculative_generate`` and ``SpeculativeEngine`` with each proposer give the same greedy tokens,
text and finish reason, and sample the same distribution (a χ² test on the first two tokens,
shown to catch a planted bias)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import make_tiny_lm
from test_speculative_variants import chi_square_p, random_heads

from labsupport.engine import LLMEngine
from labsupport.generation import generate
from labsupport.sampling import SamplingParams
from labsupport.speculative import (
    DraftModelProposer,
    LookaheadProposer,
    MedusaProposer,
    NgramProposer,
    SelfSpecProposer,
    SpeculativeEngine,
    speculative_generate,
    two_token_tree,
)

PROMPTS = [[5, 17, 99, 3, 42, 8, 5, 17], [4, 4, 4, 4], [7, 8, 9, 7, 8, 7]]


@pytest.fixture(scope="module")
def lms():
    return make_tiny_lm(seed=0), make_tiny_lm(seed=1)


def proposers(target, draft):
    """Name → factory of a fresh proposer: every method, chains and trees."""
    heads = random_heads(target.model.config.n_embd)
    return {"no proposer": lambda: None,
            "draft model": lambda: DraftModelProposer(draft, target, 3),
            "draft = target": lambda: DraftModelProposer(target, target, 4),
            "n-gram": lambda: NgramProposer(3),
            "self-spec": lambda: SelfSpecProposer(1, 3),
            "medusa tree": lambda: MedusaProposer(heads, widths=(2, 2, 1)),
            "medusa chain": lambda: MedusaProposer(heads, widths=(1, 1)),
            "lookahead": lambda: LookaheadProposer(window=3, ngram=3, max_candidates=2)}


CHAIN_ONLY = ("draft model", "draft = target", "n-gram")        # what speculative_generate runs


def greedy_params(target):
    """The greedy settings of the parity test: every field that changes what greedy emits."""
    free = generate(target, PROMPTS[0], SamplingParams(temperature=0.0, ignore_eos=True), max_new_tokens=12,
                    record=False).token_ids
    stop_text = target.decode(free[4:6])
    return {
        "plain": SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=12),
        "penalties": SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=12, repetition_penalty=1.3,
                                    frequency_penalty=0.5, presence_penalty=0.3),
        "stop id + min_tokens": SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=12,
                                               stop_token_ids=[free[0], free[3]], min_tokens=2),
        "stop string": SamplingParams(temperature=0.0, max_tokens=12, stop=[stop_text] if stop_text.strip() else None),
        "grammar": SamplingParams(temperature=0.0, max_tokens=10, structured_output={"regex": "[0-9]{2,6}"}),
        "n = 2": SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=8, n=2),
    }


def _key(o):
    return o.token_ids, o.text, o.finish_reason


def test_greedy_parity_on_every_path(lms):
    target, draft = lms
    made = proposers(target, draft)
    for pname, params in greedy_params(target).items():
        want = [_key(generate(target, p, params, record=False)) for p in PROMPTS]
        want = [w for w in want for _ in range(params.n)]                    # n samples: each the same
        plain = LLMEngine(target, block_size=4, num_blocks=128).generate(PROMPTS, params)
        assert [_key(o) for o in plain] == want, ("LLMEngine", pname)
        for name, make in made.items():
            engine = SpeculativeEngine(target, make(), block_size=4, num_blocks=256)
            outs = engine.generate(PROMPTS, params)
            assert [_key(o) for o in outs] == want, (name, pname)
            assert engine.block_manager.num_used_blocks == 0, (name, pname)
            engine.block_manager.audit()
            if name in CHAIN_ONLY:
                got = [_key(speculative_generate(target, make(), p, params)) for p in PROMPTS]
                assert got == want[::params.n], ("speculative_generate", name, pname)


def test_parity_checks_can_fail(lms):
    """The comparison above is not vacuous: a proposer path that drops the penalties differs."""
    target, _ = lms
    params = greedy_params(target)["penalties"]
    plain = [generate(target, p, params.replace(repetition_penalty=1.0, frequency_penalty=0.0,
                                                presence_penalty=0.0), record=False).token_ids for p in PROMPTS]
    assert plain != [generate(target, p, params, record=False).token_ids for p in PROMPTS]


SAMPLE = SamplingParams(temperature=0.12, top_k=3, max_tokens=2, ignore_eos=True)     # sharp: the random model is flat
PREFIX = [4, 4, 4, 4, 4, 4]


def _chi2(target, outs) -> float:
    tree = two_token_tree(target, target, PREFIX, SAMPLE)
    exact = tree.exact_joint(SAMPLE).numpy().ravel()
    index = {t: i for i, t in enumerate(tree.vocab)}
    counts = np.zeros(len(tree.vocab) ** 2)
    for ids in outs:
        counts[index[ids[0]] * len(tree.vocab) + index[ids[1]]] += 1
    return chi_square_p(counts, exact * len(outs))


class FlattenedQ(DraftModelProposer):
    """A planted bug: tokens drawn from q, but verification told q was flatter (q^0.3, renormalised)."""

    def propose(self, engine, seqs):
        drafts = super().propose(engine, seqs)
        for d in drafts.values():
            if d.q is not None:
                flat = d.q.clamp_min(0) ** 0.3
                d.q = flat / flat.sum(-1, keepdim=True)
        return drafts


N = 600


@pytest.mark.parametrize("name", ["draft model", "draft = target", "n-gram", "self-spec", "medusa chain",
                                  "lookahead"])
def test_sampling_keeps_the_two_token_distribution_in_the_engine(lms, name):
    target, draft = lms
    engine = SpeculativeEngine(target, proposers(target, draft)[name](), block_size=4, num_blocks=4000,
                               max_num_seqs=N, seed=3)
    outs = engine.generate([PREFIX] * N, SAMPLE)
    assert _chi2(target, [o.token_ids for o in outs]) > 1e-3
    assert sum(o.spec_stats.proposed for o in outs) > 0                # the drafts were really verified
    assert engine.block_manager.num_used_blocks == 0


def test_sampling_parity_of_plain_paths_and_the_planted_bias(lms):
    target, draft = lms
    plain = LLMEngine(target, block_size=4, num_blocks=4000, max_num_seqs=N, seed=3).generate([PREFIX] * N, SAMPLE)
    assert _chi2(target, [o.token_ids for o in plain]) > 1e-3
    gen = torch.Generator().manual_seed(5)
    loop = [speculative_generate(target, DraftModelProposer(draft, target, 2), PREFIX, SAMPLE, generator=gen).token_ids
            for _ in range(N)]
    assert _chi2(target, loop) > 1e-3
    biased = SpeculativeEngine(target, FlattenedQ(target, target, 2), block_size=4, num_blocks=4000,
                               max_num_seqs=N, seed=3).generate([PREFIX] * N, SAMPLE)
    assert _chi2(target, [o.token_ids for o in biased]) < 1e-3           # the test sees a wrong q


# ---------------------------------------------------------------------------- what the old engines got wrong

def test_structured_output_through_self_speculation_on_the_shipped_model():
    """The variant engine ignored the grammar (it gave ' padiod.\n'); now its drafts are verified
    under the grammar mask and the output is generate's."""
    from labsupport.models import load_model
    lm = load_model("tiny-gpt2", device="cpu")
    params = SamplingParams(temperature=0, structured_output={"regex": "[0-9]+"}, max_tokens=6)
    prompt = "the cat sat on the mat. the cat sat on the"
    want = generate(lm, prompt, params, record=False)
    out = SpeculativeEngine(lm, SelfSpecProposer(1, 3)).generate([prompt], params)[0]
    assert out.text == want.text and out.text.isdigit() and out.token_ids == want.token_ids


def test_a_string_is_one_prompt_and_n_gives_n_outputs(lms):
    target, _ = lms
    outs = SpeculativeEngine(target, NgramProposer(2)).generate("hi", SamplingParams(temperature=0.7, seed=2, n=3,
                                                                                       max_tokens=4))
    assert len(outs) == 3 and all(o.prompt == "hi" and len(o.token_ids) <= 4 for o in outs)
    assert len({o.request_id for o in outs}) == 3


class _TreeAlways(NgramProposer):
    """A custom proposer that drafts a token tree whatever the settings."""

    def propose(self, engine, seqs):
        from labsupport.speculative import Draft
        return {s.request_id: Draft([1, 2], [-1, 0, 0]) for s in seqs}


def test_a_tree_at_temperature_above_zero_is_refused(lms):
    target, _ = lms
    engine = SpeculativeEngine(target, _TreeAlways(2))
    assert engine.generate([[5, 6, 7]], SamplingParams(temperature=0.0, max_tokens=4))[0].finish_reason == "length"
    with pytest.raises(ValueError, match="token-tree draft can only be verified greedily"):
        SpeculativeEngine(target, _TreeAlways(2)).generate([[5, 6, 7]], SamplingParams(temperature=0.8, max_tokens=4))


def test_a_draft_larger_than_declared_is_refused(lms):
    target, _ = lms

    class TooLong(NgramProposer):
        def propose(self, engine, seqs):
            from labsupport.speculative import Draft
            return {s.request_id: Draft([1] * 9) for s in seqs}

    with pytest.raises(ValueError, match="max_draft_tokens"):
        SpeculativeEngine(target, TooLong(2)).generate([[5, 6, 7]], SamplingParams(temperature=0.0, max_tokens=20))


def test_speculative_generate_refuses_proposers_that_need_the_paged_engine(lms):
    target, _ = lms
    for prop in (SelfSpecProposer(1, 2), LookaheadProposer()):
        with pytest.raises(ValueError, match="SpeculativeEngine"):
            speculative_generate(target, prop, [1, 2, 3], SamplingParams(temperature=0.0))
    with pytest.raises(TypeError, match="proposer"):
        speculative_generate(target, object(), [1, 2, 3])


def test_abort_frees_the_draft_cache_too(lms):
    target, draft = lms
    engine = SpeculativeEngine(target, DraftModelProposer(draft, target, 3), block_size=4, num_blocks=64)
    rid = engine.add_request([5, 6, 7, 8, 9], SamplingParams(temperature=0.0, max_tokens=30))
    engine.step()
    engine.step()
    assert engine.proposer.block_manager.num_used_blocks > 0
    (out,) = engine.abort_request(rid)
    assert out.finish_reason == "abort"
    assert engine.block_manager.num_used_blocks == 0 and engine.proposer.block_manager.num_used_blocks == 0
    assert not engine.has_unfinished_requests()
