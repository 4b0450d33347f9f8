"""Proposers at their limits and their inputs checked: tree drafts near the end of the context window,
one draft-model proposer serving two engines at once, Medusa's tree choices, widths and dtype,
speculative_config's Medusa defaults, and targets of the wrong type."""

from __future__ import annotations

import pytest
import torch
from helpers import make_tiny_lm
from test_speculative_variants import random_heads

from labsupport.generation import generate
from labsupport.sampling import SamplingParams
from labsupport.speculative import (
    DraftModelProposer,
    LookaheadProposer,
    MedusaHeads,
    MedusaProposer,
    NgramProposer,
    SpeculativeEngine,
    speculative_generate,
)

GREEDY12 = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=12)


@pytest.mark.parametrize("make", [lambda lm: MedusaProposer(random_heads(lm.model.config.n_embd), widths=(3, 2)),
                                  lambda lm: LookaheadProposer(window=4, ngram=3, max_candidates=3),
                                  lambda lm: MedusaProposer(random_heads(lm.model.config.n_embd), widths=(40,))],
                         ids=["medusa tree", "lookahead", "a very wide tree"])
def test_tree_drafts_shrink_near_the_end_of_the_context_window(tiny_lm, make):
    """Every tree node takes a KV slot while it is verified: near n_positions the tree must shrink
    (it crashed with 'positions must be < n_positions' and left the engine wedged)."""
    limit = tiny_lm.model.config.n_positions
    for prompt_len in (limit - 14, limit - 6, limit - 2):
        prompt = [(7 * i) % 50 + 10 for i in range(prompt_len)]
        want = generate(tiny_lm, prompt, GREEDY12, record=False)
        engine = SpeculativeEngine(tiny_lm, make(tiny_lm), block_size=4, num_blocks=256)
        out = engine.generate([prompt], GREEDY12)[0]
        assert (out.token_ids, out.finish_reason) == (want.token_ids, want.finish_reason)
        assert engine.block_manager.num_used_blocks == 0


def test_one_draft_proposer_serves_two_engines_at_once(tiny_lm):
    draft = make_tiny_lm(seed=1)
    prop = DraftModelProposer(draft, tiny_lm, 3)
    a, b = SpeculativeEngine(tiny_lm, prop, block_size=4), SpeculativeEngine(tiny_lm, prop, block_size=4)
    a.add_request([5, 6], GREEDY12)
    b.add_request([9, 8, 7, 6, 5, 4, 3, 2], GREEDY12)
    a.step(); b.step(); a.step()                                        # interleaved: one cache each
    (oa,), (ob,) = a.run(), b.run()
    assert oa.token_ids == generate(tiny_lm, [5, 6], GREEDY12, record=False).token_ids
    assert ob.token_ids == generate(tiny_lm, [9, 8, 7, 6, 5, 4, 3, 2], GREEDY12, record=False).token_ids
    assert [c[1].num_used_blocks for c in prop._caches.values()] == [0, 0]


def test_medusa_choices_widths_and_dtype_are_checked(tiny_lm):
    heads = random_heads(tiny_lm.model.config.n_embd)
    for bad in ([(-1,)], [(0.0,)], ["ab"], [0, 1]):
        with pytest.raises(TypeError, match="choices"):
            MedusaProposer(heads, choices=bad)
    with pytest.raises(TypeError, match="widths"):
        MedusaProposer(heads, widths=3)
    assert MedusaProposer(heads, widths=torch.tensor([2, 1]).numpy()).num_speculative_tokens == 2
    with pytest.raises(ValueError, match="vocabulary"):
        SpeculativeEngine(tiny_lm, MedusaProposer(heads, widths=(5000,)), block_size=4, num_blocks=2000).generate(
            [[1, 2, 3]], GREEDY12)
    double = MedusaHeads(tiny_lm.model.config.n_embd, 3).double()
    with pytest.raises(ValueError, match="dtype and device"):
        SpeculativeEngine(tiny_lm, MedusaProposer(double, widths=(1,))).generate([[1, 2, 3]], GREEDY12)


def test_speculative_config_medusa_defaults_and_types(tiny_lm):
    heads = random_heads(tiny_lm.model.config.n_embd)
    with pytest.raises(ValueError, match="num_speculative_tokens=4 exceeds the 3 Medusa heads"):
        SpeculativeEngine(tiny_lm, {"method": "medusa", "heads": heads})
    assert SpeculativeEngine(tiny_lm, {"method": "medusa", "heads": heads, "num_speculative_tokens": 3}).proposer
    with pytest.raises(TypeError, match="tree_widths"):
        SpeculativeEngine(tiny_lm, {"method": "medusa", "heads": heads, "num_speculative_tokens": 1, "tree_widths": 3})


def test_targets_of_the_wrong_type_are_type_errors(tiny_lm):
    with pytest.raises(TypeError, match="target must be"):
        DraftModelProposer(tiny_lm, "tiny-gpt2", 2)
    with pytest.raises(TypeError, match="target must be"):
        speculative_generate("tiny-gpt2", NgramProposer(3), "hi")
