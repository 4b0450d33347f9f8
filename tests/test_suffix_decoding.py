"""Suffix decoding (labsupport.speculative.suffix): the counted suffix trie, the frequency-weighted and
adaptive drafts, the shared trie over earlier outputs, and exactness in the engine (greedy here; the
sampled two-token check, stop strings and EOS run in test_speculative_variants.py)."""

from __future__ import annotations

import pytest
from helpers import make_tiny_lm

from labsupport.generation import generate
from labsupport.sampling import GREEDY
from labsupport.speculative import SpeculativeEngine, SuffixProposer, SuffixTrie, make_proposer, speculative_generate


def test_the_trie_counts_every_substring_up_to_its_depth():
    t = SuffixTrie(max_depth=3)
    ends = t.extend([1, 2, 3, 1, 2])
    assert (t.count([1]), t.count([1, 2]), t.count([1, 2, 3]), t.count([2, 3, 1])) == (2, 2, 1, 1)
    assert t.count([1, 2, 3, 1]) == 0                          # longer than max_depth: not kept
    t.extend([4], ends)                                        # the text goes on: "… 1 2 4"
    assert (t.count([1, 2, 4]), t.count([2, 4]), t.count([4])) == (1, 1, 1)
    t.extend([1, 2, 3, 1, 2, 4], weight=-1)                    # the whole text out again
    assert t.root.children == {}


def test_a_draft_follows_the_most_frequent_continuation_of_the_longest_match():
    t = SuffixTrie(max_depth=8)
    t.extend([7, 1, 2, 3, 9, 1, 2, 3, 9, 1, 2, 5])
    tokens, parents, score, p = t.draft([4, 1, 2], max_tokens=4, max_spec_factor=2.0, min_token_prob=0.1)
    assert p == 2 and tokens == [3, 9, 1, 2] and parents is None   # "1 2" went on with 3 twice, with 5 once
    assert score == pytest.approx(2 / 3 * 4)                   # 2/3, then certain: 2/3 each step
    assert t.draft([4, 1, 2], 4, 1.0, 0.1)[0] == [3, 9]         # adaptive: ≤ factor × match length
    assert t.draft([4, 1, 2], 4, 2.0, 0.7)[0] == []             # 2/3 < min_token_prob: no draft
    assert t.draft([8], 4, 1.0, 0.1) == ([], None, 0.0, 0)      # never seen


def test_a_tree_draft_grows_best_first_over_both_continuations():
    t = SuffixTrie(max_depth=8)
    t.extend([7, 1, 2, 3, 9, 1, 2, 3, 9, 1, 2, 5])
    tokens, parents, score, _ = t.draft([4, 1, 2], max_tokens=5, max_spec_factor=2.0, min_token_prob=0.1, tree=True)
    # after "1 2": 3 9 1 2 (path probability 2/3 each: the depth limit 2 × 2 ends it), then the other branch, 5 (1/3)
    assert tokens == [3, 9, 1, 2, 5] and parents == [-1, 0, 1, 2, 3, 0]
    assert score == pytest.approx(2 / 3 * 4 + 1 / 3)
    assert t.draft([4, 1, 2], 5, 2.0, 0.5, tree=True)[0] == [3, 9, 1, 2]   # the 1/3 branch is under min_token_prob
    assert t.draft([4, 1, 2], 2, 2.0, 0.1, tree=True)[:2] == ([3, 9], [-1, 0, 1])   # the node budget


def test_the_proposer_drafts_from_the_request_and_from_earlier_outputs():
    lm = make_tiny_lm(seed=0)
    proposer = SuffixProposer(6, max_tree_depth=12, max_cached_requests=2, max_spec_factor=4.0)
    first = speculative_generate(lm, proposer, [11, 12, 13], GREEDY.replace(ignore_eos=True), max_new_tokens=12)
    assert len(proposer._cached) == 1                         # its output joined the shared trie
    out = first.token_ids
    again = speculative_generate(lm, proposer, [11, 12, 13] + out[:3], GREEDY.replace(ignore_eos=True),
                                 max_new_tokens=9)
    assert again.token_ids == out[3:12]                        # exact: the target's greedy text
    assert proposer.shared_drafts >= 1 and sum(again.stats.accepted) >= 6   # drafted from the first request's output
    for k in range(3):                                         # the oldest output leaves beyond the limit
        speculative_generate(lm, proposer, [20 + k], GREEDY, max_new_tokens=4)
    assert len(proposer._cached) == 2


def test_suffix_in_the_engine_equals_target_greedy_and_speaks_vllms_config():
    lm = make_tiny_lm(seed=0)
    prompts = [[5, 17, 99, 3, 42, 8, 5, 17, 99], [4] * 10, [1, 2, 3, 1, 2, 3, 1, 2], [200, 13]]
    proposer = make_proposer({"method": "suffix", "num_speculative_tokens": 5, "suffix_decoding_max_tree_depth": 10,
                              "suffix_decoding_max_spec_factor": 2.0}, lm)
    assert isinstance(proposer, SuffixProposer) and (proposer.max_tree_depth, proposer.max_spec_factor) == (10, 2.0)
    for each in (proposer, SuffixProposer(5, max_tree_depth=10, max_spec_factor=2.0, tree=True)):
        engine = SpeculativeEngine(lm, each, block_size=4, num_blocks=256, keep_trees=True)
        outs = engine.generate(prompts, GREEDY, max_tokens=24)
        for p, o in zip(prompts, outs):
            assert o.token_ids == generate(lm, p, GREEDY, max_new_tokens=24).token_ids
        assert sum(sum(o.spec_stats.accepted) for o in outs) > 0 and engine.block_manager.num_used_blocks == 0
        assert any(o.trees for o in outs) == each.tree                      # the tree mode verified real trees


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="max_tree_depth"):
        SuffixProposer(4, max_tree_depth=1)
    with pytest.raises(ValueError, match="min_token_prob"):
        SuffixProposer(4, min_token_prob=1.5)
    with pytest.raises(ValueError, match="max_spec_factor"):
        SuffixProposer(4, max_spec_factor=0)
    with pytest.raises(TypeError, match="tree"):
        SuffixProposer(4, tree="yes")
    with pytest.raises(TypeError, match="max_cached_requests"):
        SuffixProposer(4, max_cached_requests=1.5)
