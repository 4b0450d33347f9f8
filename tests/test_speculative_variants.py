"""Speculative variants with cheap drafts: the tree attention mask, tree verification with KV
compaction, self-speculation, Medusa heads, lookahead — greedy identical to target greedy,
sampling exact, rejected slots freed after every round, the load-based on/off policy."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from helpers import make_tiny_lm

from labsupport.engine.attention import build_metadata, tree_ancestors
from labsupport.engine.block_manager import BlockManager
from labsupport.engine.extend import extend
from labsupport.engine.model_runner import ModelRunner
from labsupport.generation import generate
from labsupport.models import model_forward
from labsupport.sampling import GREEDY, SamplingParams
from labsupport.speculative.engine import SpeculativeEngine
from labsupport.speculative.exactness import two_token_tree
from labsupport.speculative.lookahead import LookaheadProposer
from labsupport.speculative.proposers import NgramProposer
from labsupport.speculative.medusa import MedusaHeads, MedusaProposer
from labsupport.speculative.policy import SpecPolicy, break_even_batch, policy_from_measurements
from labsupport.speculative.self_spec import SelfSpecProposer
from labsupport.speculative.suffix import SuffixProposer
from labsupport.speculative.tree import (
    TokenTree,
    accept_greedy_path,
    choices_from_widths,
    compact_kv,
    dense_tree_reference,
    tree_from_choices,
)

PROMPTS = [[5, 17, 99, 3, 42, 8], [1, 1, 1], [7, 8, 9, 7, 8, 7, 8], [200, 13], [4] * 10, [33, 34, 35, 36, 37]]


def random_tree(rng: np.random.Generator, size: int) -> list[int]:
    return [-1] + [int(rng.integers(0, i)) for i in range(1, size)]


def random_heads(n_embd: int, seed: int = 0, scale: float = 0.3) -> MedusaHeads:
    heads = MedusaHeads(n_embd, 3)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for b in heads.blocks:
            b.weight.copy_(torch.randn(b.weight.shape, generator=gen) * scale)
    return heads.eval()


def proposers(lm):
    return {"self-spec k=1": SelfSpecProposer(1, 3), "medusa tree": MedusaProposer(random_heads(lm.model.config.n_embd),
                                                                                   widths=(2, 2, 1)),
            "lookahead": LookaheadProposer(window=3, ngram=3, max_candidates=2),
            "suffix": SuffixProposer(4, max_tree_depth=8)}


# ---------------------------------------------------------------------------- the tree mask

@pytest.mark.parametrize("seed", range(5))
def test_tree_mask_equals_dense_reference(seed):
    rng = np.random.default_rng(seed)
    parents = random_tree(rng, int(rng.integers(1, 9)))
    start, bs = int(rng.integers(0, 7)), 4
    q = len(parents)
    blocks = -(-(start + q) // bs)
    meta = build_metadata([2, q], [3, start], [[9, 10], list(range(blocks))], bs, tree_parents=[None, parents])
    visible = meta.mask[1, 0, :q, :start + q] == 0
    assert torch.equal(visible, dense_tree_reference(parents, start))
    assert (meta.mask[1, 0, :q, start + q:] == float("-inf")).all()            # nothing past the tree
    depth = tree_ancestors(parents).sum(1) - 1
    assert meta.positions[2:].tolist() == (start + depth).tolist()              # position = start + depth
    assert meta.slot_mapping[2:].tolist() == list(range(start, start + q))      # slot = start + node (table 0..)
    assert meta.positions[:2].tolist() == [3, 4]                                # the chain beside it unchanged


def test_tree_parents_are_checked():
    with pytest.raises(ValueError, match="tree_parents\\[1\\]"):
        tree_ancestors([-1, 1])
    with pytest.raises(ValueError, match="3 entries"):
        build_metadata([3], [0], [[0]], 4, tree_parents=[[-1, 0]])
    with pytest.raises(ValueError, match="parents\\[2\\]"):
        TokenTree([1, 2, 3], [-1, 0, 5])


@pytest.mark.parametrize("seed", range(3))
def test_tree_extend_logits_equal_each_root_path_run_alone(tiny_lm, seed):
    """One forward over the tree = the model run on prefix + that node's root path, for every node."""
    rng = np.random.default_rng(seed)
    prefix = [int(t) for t in rng.integers(1, 400, 7)]
    parents = random_tree(rng, 9)
    tokens = [prefix[-1]] + [int(t) for t in rng.integers(1, 400, 8)]
    tree = TokenTree(tokens, parents)
    runner, bm = ModelRunner(tiny_lm, 4, 32), BlockManager(32, 4)
    extend(runner, bm, {"s": prefix[:-1]}, all_logits=False)
    logits = extend(runner, bm, {"s": tokens}, tree_parents={"s": parents})["s"]
    for node in range(len(tree)):
        ids = prefix[:-1] + [tokens[i] for i in tree.path_to(node)]
        ref = model_forward(tiny_lm.model, torch.tensor([ids]), use_cache=False)[0][0, -1].float()
        torch.testing.assert_close(logits[node], ref, atol=1e-4, rtol=1e-4)


def test_compacted_kv_continues_like_a_fresh_cache(tiny_lm):
    """Accept a path whose nodes are not contiguous, compact, truncate: the next token's logits are
    those of the model on prefix + path (the moved K/V sit at the right positions)."""
    prefix = [11, 12, 13, 14, 15]
    tree = TokenTree([prefix[-1], 20, 21, 22, 23, 24], [-1, 0, 0, 1, 2, 4])   # path 0 → 2 → 4 → 5
    runner, bm = ModelRunner(tiny_lm, 2, 32), BlockManager(32, 2)
    extend(runner, bm, {"s": prefix[:-1]}, all_logits=False)
    extend(runner, bm, {"s": tree.tokens}, tree_parents={"s": tree.parents})
    path = [2, 4, 5]
    start = len(prefix) - 1
    compact_kv(runner, bm, "s", start, path)
    bm.truncate("s", start + 1 + len(path))
    bm.audit()
    nxt = 30
    logits = extend(runner, bm, {"s": [nxt]})["s"][-1]
    ids = prefix + [tree.tokens[i] for i in path] + [nxt]
    ref = model_forward(tiny_lm.model, torch.tensor([ids]), use_cache=False)[0][0, -1].float()
    torch.testing.assert_close(logits, ref, atol=1e-4, rtol=1e-4)
    assert bm.num_used_blocks == bm.blocks_needed(len(ids))


def test_greedy_path_is_the_longest_agreeing_one():
    tree = TokenTree([9, 1, 2, 3, 4, 5], [-1, 0, 0, 1, 2, 2])
    assert accept_greedy_path(tree, [2, 0, 5, 0, 0, 7]) == ([2, 5], 7)          # root → 2 → 5, then 7
    assert accept_greedy_path(tree, [8, 0, 0, 0, 0, 0]) == ([], 8)
    assert choices_from_widths((2, 1)) == [(0,), (1,), (0, 0), (1, 0)]
    t = tree_from_choices(9, [[5, 6], [7]], choices_from_widths((2, 1)))
    assert t.tokens == [9, 5, 6, 7, 7] and t.parents == [-1, 0, 0, 1, 2]
    with pytest.raises(ValueError, match="rank"):
        tree_from_choices(9, [[5]], [(1,)])


# ---------------------------------------------------------------------------- greedy = target greedy

def audited(engine: SpeculativeEngine) -> list[int]:
    """Audit the pool after every round; check the cache holds exactly the committed tokens but the
    last (the rejected nodes' slots are gone); return the rounds' accepted paths that moved KV."""
    moved, original = [], engine._round

    def round_and_audit(seqs):
        finished = original(seqs)
        engine.block_manager.audit()
        for s in seqs:
            if not s.finish_reason:
                n = len(s.token_ids) - 1
                assert engine.block_manager.num_slots(s.request_id) == n
                assert len(engine.block_manager.block_table(s.request_id)) == engine.block_manager.blocks_needed(n)
            if s.trees and s.trees[-1][1] and any(n != d for d, n in enumerate(s.trees[-1][1], 1)):
                moved.append(1)
        return finished
    engine._round = round_and_audit
    return moved


@pytest.mark.parametrize("name", ["self-spec k=1", "medusa tree", "lookahead", "suffix"])
def test_greedy_equals_target_greedy(tiny_lm, name):
    proposer = proposers(tiny_lm)[name]
    engine = SpeculativeEngine(tiny_lm, proposer, block_size=4, num_blocks=256, keep_trees=True)
    moved = audited(engine)
    outs = engine.generate(PROMPTS, GREEDY, max_tokens=20)
    for prompt, out in zip(PROMPTS, outs):
        assert out.token_ids == generate(tiny_lm, prompt, GREEDY, max_new_tokens=20).token_ids
        assert out.finish_reason == "length"
    assert engine.block_manager.num_used_blocks == 0
    assert sum(o.spec_stats.produced for o in outs) > sum(o.spec_stats.rounds for o in outs)   # drafts were accepted
    if name not in ("self-spec k=1", "suffix"):                       # chains: no tree, no KV to compact
        assert moved, "no accepted path needed its KV compacted: the test did not exercise compaction"


@pytest.mark.parametrize("name", ["self-spec k=1", "medusa tree", "lookahead", "suffix"])
def test_stop_string_and_max_tokens_inside_an_accepted_path(tiny_lm, name):
    for prompt in PROMPTS[:4]:
        long = generate(tiny_lm, prompt, GREEDY, max_new_tokens=16)
        stop = tiny_lm.decode(long.token_ids[5:7])
        if not stop.strip():
            continue
        params = SamplingParams(temperature=0.0, max_tokens=16, stop=(stop,))
        ref = generate(tiny_lm, prompt, params)
        out = SpeculativeEngine(tiny_lm, proposers(tiny_lm)[name], block_size=4).generate([prompt], params)[0]
        assert (out.token_ids, out.text, out.finish_reason) == (ref.token_ids, ref.text, ref.finish_reason)
        for m in (1, 2, 5):
            got = SpeculativeEngine(tiny_lm, proposers(tiny_lm)[name], block_size=4).generate([prompt], GREEDY, m)[0]
            assert got.token_ids == long.token_ids[:m] and got.finish_reason == "length"


@pytest.mark.parametrize("name", ["self-spec k=1", "medusa tree", "lookahead", "suffix"])
def test_eos_inside_an_accepted_path(name):
    lm = make_tiny_lm(seed=0)
    ref = generate(lm, PROMPTS[4], GREEDY, max_new_tokens=20).token_ids
    eos = ref[6]                                                # make a mid-output token the EOS id
    lm.model.config.eos_token_id = eos
    lm.model.generation_config.eos_token_id = eos
    out = SpeculativeEngine(lm, proposers(lm)[name], block_size=4).generate([PROMPTS[4]], GREEDY, 20)[0]
    assert out.finish_reason == "stop"
    assert out.token_ids[:-1] == ref[:ref.index(eos)] and out.token_ids[-1] == eos


def test_self_spec_uses_no_second_cache_and_checks_its_depth(tiny_lm):
    engine = SpeculativeEngine(tiny_lm, SelfSpecProposer(2, 3))
    with pytest.raises(ValueError, match="num_layers must be < the target's 2 layers"):
        engine.generate([[1, 2, 3]], GREEDY, 4)
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        SelfSpecProposer(1, 0)
    with pytest.raises(ValueError, match="heads"):
        MedusaProposer(MedusaHeads(64, 2), widths=(1, 1, 1))


# ---------------------------------------------------------------------------- sampling stays exact

def chi_square_p(counts: np.ndarray, expected: np.ndarray) -> float:
    """Pearson χ² p-value, cells with expected < 5 pooled (Wilson–Hilferty normal approximation)."""
    small = expected < 5
    obs = np.append(counts[~small], counts[small].sum())
    exp = np.append(expected[~small], expected[small].sum())
    keep = exp > 0
    obs, exp = obs[keep], exp[keep]
    stat, dof = float(((obs - exp) ** 2 / exp).sum()), len(obs) - 1
    z = ((stat / dof) ** (1 / 3) - (1 - 2 / (9 * dof))) / math.sqrt(2 / (9 * dof))
    return 0.5 * math.erfc(z / math.sqrt(2))


@pytest.mark.parametrize("name", ["self-spec k=1", "medusa tree", "lookahead", "suffix"])
def test_sampled_chain_verification_keeps_the_two_token_distribution(tiny_lm, name):
    params = SamplingParams(temperature=1.0, top_k=3, max_tokens=2)
    prefix = [4, 4, 4, 4, 4, 4]
    tree = two_token_tree(tiny_lm, tiny_lm, prefix, params)
    exact = tree.exact_joint(params).numpy().ravel()
    n = 600
    engine = SpeculativeEngine(tiny_lm, proposers(tiny_lm)[name], block_size=4, num_blocks=6000, max_num_seqs=n, seed=7)
    outs = engine.generate([prefix] * n, params)
    index = {t: i for i, t in enumerate(tree.vocab)}
    counts = np.zeros(len(tree.vocab) ** 2)
    for o in outs:
        a, b = o.token_ids
        counts[index[a] * len(tree.vocab) + index[b]] += 1
    assert chi_square_p(counts, exact * n) > 1e-3
    assert sum(o.spec_stats.proposed for o in outs) > 0                       # the drafts were really verified
    assert engine.block_manager.num_used_blocks == 0


def test_chi_square_rejects_a_wrong_distribution():
    rng = np.random.default_rng(0)
    p = np.array([0.5, 0.3, 0.2])
    counts = np.bincount(rng.choice(3, 3000, p=[0.45, 0.35, 0.2]), minlength=3).astype(float)
    assert chi_square_p(counts, p * 3000) < 1e-3
    counts = np.bincount(rng.choice(3, 3000, p=p), minlength=3).astype(float)
    assert chi_square_p(counts, p * 3000) > 1e-3


# ---------------------------------------------------------------------------- the on/off policy

def test_policy_switches_drafting_off_under_load(tiny_lm):
    policy = SpecPolicy([[1, 2, 3], [3, 1024, 0]])                     # vLLM's num_speculative_tokens_per_batch_size
    engine = SpeculativeEngine(tiny_lm, LookaheadProposer(window=3, ngram=3), policy=policy, max_num_seqs=8)
    outs = engine.generate(PROMPTS[:4], GREEDY, 8)
    assert engine.speculative_rounds < engine.num_rounds               # batch 4 > 2: plain rounds first
    assert all(o.token_ids == generate(tiny_lm, p, GREEDY, max_new_tokens=8).token_ids
               for p, o in zip(PROMPTS, outs))
    assert policy.speculate(2) and not policy.speculate(3) and policy.num_speculative_tokens(5000, 4) == 4
    assert break_even_batch({1: 1.6, 2: 1.3, 4: 1.02, 8: 0.8}) == 8
    assert break_even_batch({1: 1.2, 2: 1.1}) is None
    got = policy_from_measurements({1: 1.6, 2: 1.3, 4: 0.9, 8: 0.8}, 3).num_speculative_tokens_per_batch_size
    assert got == [[1, 2, 3], [3, 1024, 0]]
    assert policy_from_measurements({1: 0.9}, 3).num_speculative_tokens_per_batch_size == [[1, 1024, 0]]
    assert policy_from_measurements({1: 1.2, 4: 1.1}, 2).num_speculative_tokens_per_batch_size == [[1, 1024, 2]]
    for bad, kind in (([[0, 4, 3]], ValueError), ([[4, 2, 3]], ValueError), ([[1, 4, -1]], ValueError),
                      ([[1, 4, 3], [4, 8, 0]], ValueError), ([[1, 4]], TypeError), ("1-4:3", TypeError)):
        with pytest.raises(kind, match="num_speculative_tokens_per_batch_size"):
            SpecPolicy(bad)


def test_a_smaller_gamma_for_a_batch_size_cuts_every_draft_and_keeps_the_output(tiny_lm):
    ref = [generate(tiny_lm, p, GREEDY, max_new_tokens=10).token_ids for p in PROMPTS[:2]]
    counts = {}
    for k in (4, 1):
        engine = SpeculativeEngine(tiny_lm, NgramProposer(4), policy=SpecPolicy([[1, 8, k]]), max_num_seqs=8)
        outs = engine.generate(PROMPTS[:2], GREEDY, 10)
        assert [o.token_ids for o in outs] == ref
        assert all(len(r.draft_tokens) <= k for o in outs for r in o.rounds)
        counts[k] = engine.num_verified_tokens
    assert counts[1] <= counts[4]


# ---------------------------------------------------------------------------- figures and the panel

def test_tree_figure_and_panel(tiny_lm):
    from labsupport.viz.speculative_variants import batch_sweep_figure, token_tree_figure, tree_layout
    from labsupport.widgets.speculative_variants import variants_panel

    xy = tree_layout([-1, 0, 0, 1])
    assert [p[0] for p in xy] == [0, 1, 1, 2] and xy[3][1] == xy[1][1]           # depth on x; a lone child level
    fig = token_tree_figure([5, 6, 7, 8], [-1, 0, 0, 1], [1, 3], 9)
    assert len(fig.data[1].x) == 6                                                 # two accepted edges
    assert len(batch_sweep_figure({1: 1.4, 8: 0.9}).data) == 2
    heads = random_heads(tiny_lm.model.config.n_embd)
    box = variants_panel(tiny_lm, heads, "Return the", layers=1, max_new_tokens=12)
    assert box.error.value == "" and box.state["output"].token_ids
    for method in ("self-speculation", "lookahead"):
        box.controls["method"].value = method
        assert box.error.value == "", box.error.value
    box.controls["temperature"].value = 0.8
    box.controls["round"].value = 2
    assert box.error.value == ""
    # the tree is a plain plotly output (a FigureWidget rendered as empty axes in JupyterLab), redrawn per round
    (shown,) = box.figure.outputs
    plot = shown["data"]["application/vnd.plotly.v1+json"]
    assert plot["layout"]["title"]["text"].startswith("Round 2:") and plot["data"]
    with pytest.raises(ValueError, match="layers"):
        variants_panel(tiny_lm, heads, "Return the", layers=2)


def test_medusa_training_smoke_run(tmp_path):
    from labsupport import train
    from labsupport.speculative.medusa import load_medusa

    assert train.main(["medusa", "--smoke", "--out", str(tmp_path / "heads"), "--threads", "1"]) == 0
    heads = load_medusa(tmp_path / "heads")
    assert heads.num_heads == 3 and heads.stats["steps"] == 3
    assert len(heads.stats["val_top1_by_head"]) == 3 and all(0 <= a <= 1 for a in heads.stats["val_top1_by_head"])
    with pytest.raises(FileNotFoundError, match="train medusa"):
        load_medusa(tmp_path / "missing")


def test_variants_panel_greys_out_the_controls_a_method_does_not_read(tiny_lm):
    from labsupport.widgets.speculative_variants import variants_panel

    box = variants_panel(tiny_lm, random_heads(tiny_lm.model.config.n_embd), "Return the", layers=1,
                         max_new_tokens=8)
    c = box.controls
    assert c["gamma"].disabled and not c["shape"].disabled and c["layers"].disabled      # Medusa: the shape decides
    c["temperature"].value = 0.8
    assert c["shape"].disabled and box.error.value == ""                                 # a chain at T > 0
    c["method"].value = "self-speculation"
    assert not c["gamma"].disabled and not c["layers"].disabled and c["shape"].disabled
    c["method"].value = "lookahead"
    assert not c["gamma"].disabled and c["layers"].disabled


def test_a_wide_tree_gives_every_label_its_own_row():
    """Issue 22: the (5, 3, 2) tree's labels overlapped at depth 2 (30 leaves in 380 px, labels above
    the markers). Labels now sit right of their node, one leaf per row, and the figure grows with the rows."""
    from labsupport.speculative.tree import choices_from_widths
    from labsupport.viz.speculative_variants import token_tree_figure, tree_layout

    choices = choices_from_widths((5, 3, 2))
    index = {c: i + 1 for i, c in enumerate(choices)}
    parents = [-1] + [index[c[:-1]] if len(c) > 1 else 0 for c in choices]
    fig = token_tree_figure(list(range(len(parents))), parents, [], None, label=lambda t: f"tok{t:03d}-long-label")
    nodes = fig.data[2]
    assert nodes.textposition == "middle right" and all(len(t) <= 10 for t in nodes.text)
    rows = max(y for _, y in tree_layout(parents)) + 1
    assert rows == 30 and fig.layout.height >= 26 * rows                       # ≥ 26 px per label row
    ys_at = {}
    for (x, y) in zip(nodes.x, nodes.y):
        ys_at.setdefault(x, []).append(y)
    assert all(len(set(v)) == len(v) for v in ys_at.values())                 # no two labels of a depth share a row


def test_tree_figure_refuses_malformed_trees_and_deep_trees_hover_only():
    from labsupport.viz.speculative_variants import token_tree_figure

    for tokens, parents, path in (([], [], []), ([1, 2], [-1, 1], []), ([1, 2], [0, 0], []), ([1, 2, 3], [-1, 0, 0], [2, 1]),
                                  ([1, 2], [-1, 0], [7])):
        with pytest.raises((ValueError, TypeError)):
            token_tree_figure(tokens, parents, path)
    with pytest.raises(TypeError, match="label"):
        token_tree_figure([1, 2], [-1, 0], [1], label=lambda t: t)
    chain = token_tree_figure(list(range(61)), [-1, *range(60)], list(range(1, 61)), 5)
    assert chain.data[2].mode == "markers" and len(chain.data[2].hovertext) == 61


def test_head_trainer_options_are_checked_and_smoke_needs_out(capsys):
    from labsupport import train

    with pytest.raises(SystemExit):
        train.main(["medusa", "--smoke"])                  # would replace the shipped heads
    assert "--out" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        train.main(["medusa", "--smoke", "--windows", "0", "--out", "/tmp/never"])
    assert "must be an integer >= 1" in capsys.readouterr().err
