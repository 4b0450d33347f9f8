"""Scheduler rules without a model: admission by blocks and token budget, chunked prefill,
preemption of the youngest sequence (recompute or swap), requests that can never fit."""

import pytest

from labsupport.engine.block_manager import BlockManager
from labsupport.engine.scheduler import Scheduler, SchedulerConfig, Sequence


def make(num_blocks=16, block_size=4, num_cpu_blocks=0, **cfg):
    bm = BlockManager(num_blocks, block_size, num_cpu_blocks=num_cpu_blocks)
    return Scheduler(SchedulerConfig(**cfg), bm), bm


def step(sch):
    """One engine step with a fake model: every completed prompt samples token 7."""
    out = sch.schedule()
    sch.on_step_done(out)
    for item in out.scheduled:
        if item.completes_prompt:
            item.seq.output_ids.append(7)
            if len(item.seq.output_ids) == item.seq.max_new_tokens:
                sch.finish(item.seq, "length")
    sch.block_manager.audit()
    return out


def first_preemption(sch, max_steps=10):
    for _ in range(max_steps):
        out = step(sch)
        if out.preempted:
            return out
    raise AssertionError("no preemption happened")


def test_admission_by_token_budget_without_chunking():
    sch, _ = make(max_num_batched_tokens=10)
    sch.add(Sequence("a", [1] * 6, 3))
    sch.add(Sequence("b", [1] * 6, 3))
    out = step(sch)
    assert [(s.seq.seq_id, s.num_new_tokens) for s in out.scheduled] == [("a", 6)]      # b's 6 > 4 left
    out = step(sch)
    assert [(s.seq.seq_id, s.num_new_tokens) for s in out.scheduled] == [("a", 1), ("b", 6)]


def test_admission_by_free_blocks_and_max_num_seqs():
    sch, bm = make(num_blocks=4, block_size=4, max_num_seqs=2)
    for i in range(3):
        sch.add(Sequence(str(i), [1] * 5, 2))                      # 2 blocks each
    out = step(sch)
    assert [s.seq.seq_id for s in out.scheduled] == ["0", "1"]
    assert bm.num_free_blocks == 0 and [s.seq_id for s in sch.waiting] == ["2"]
    step(sch)                                                      # both finish (2 tokens)
    out = step(sch)
    assert [s.seq.seq_id for s in out.scheduled] == ["2"]


def test_chunked_prefill_splits_prompt_and_decodes_go_first():
    sch, _ = make(num_blocks=32, max_num_batched_tokens=10, enable_chunked_prefill=True, max_prefill_chunk=8)
    sch.add(Sequence("short", [1] * 3, 5))
    sch.add(Sequence("long", [1] * 20, 2))
    plan = [[(s.seq.seq_id, s.num_new_tokens) for s in step(sch).scheduled] for _ in range(4)]
    assert plan[0] == [("short", 3), ("long", 7)]                  # budget 10: 3 + 7
    assert plan[1] == [("short", 1), ("long", 8)]                  # the decode first, then a chunk
    assert plan[2] == [("short", 1), ("long", 5)]                  # the rest of the prompt
    assert plan[3] == [("short", 1), ("long", 1)]


def test_preemption_takes_the_youngest_and_recompute_requeues_it_first():
    sch, _ = make(num_blocks=3, block_size=2, max_num_seqs=4)
    for name in "abc":
        sch.add(Sequence(name, [1, 1], 10))
    step(sch)                                                      # 3 blocks used; each decode needs one more
    out = step(sch)
    assert out.preempted == ["c", "b"]                             # youngest first, until a fits
    assert [s.seq_id for s in sch.waiting] == ["b", "c"]           # oldest victim in front
    assert all(s.num_computed_tokens == 0 for s in sch.waiting)
    assert [s.seq.seq_id for s in out.scheduled] == ["a"]


def test_swap_mode_swaps_decoding_sequences_and_brings_them_back():
    sch, bm = make(num_blocks=4, block_size=2, num_cpu_blocks=8, max_num_seqs=4, preemption_mode="swap")
    for name in "ab":
        sch.add(Sequence(name, [1, 1], 6))
    out = first_preemption(sch)
    assert out.preempted == ["b"] and out.blocks_to_swap_out and [s.seq_id for s in sch.swapped] == ["b"]
    for _ in range(3):
        out = step(sch)
        if out.blocks_to_swap_in:
            break
    assert out.blocks_to_swap_in and [s.seq_id for s in sch.running] == ["b"]
    while sch.has_unfinished():
        step(sch)
    assert bm.num_free_blocks == 4 and bm.num_free_cpu_blocks == 8


def test_swap_falls_back_to_recompute_without_cpu_space():
    sch, _ = make(num_blocks=4, block_size=2, num_cpu_blocks=0, max_num_seqs=4, preemption_mode="swap")
    for name in "ab":
        sch.add(Sequence(name, [1, 1], 6))
    out = first_preemption(sch)
    assert out.preempted == ["b"] and not out.blocks_to_swap_out and [s.seq_id for s in sch.waiting] == ["b"]


def test_why_never_fits():
    sch, _ = make(num_blocks=4, block_size=4, max_num_batched_tokens=8)
    assert sch.why_never_fits(3, 6) is None                        # 8 slots
    assert "pool" in sch.why_never_fits(10, 8)                    # 17 slots > 16
    assert "max_num_batched_tokens" in sch.why_never_fits(6, 4)   # 9-token recompute > 8
    chunked, _ = make(num_blocks=4, block_size=4, max_num_batched_tokens=8, enable_chunked_prefill=True)
    assert chunked.why_never_fits(6, 4) is None


@pytest.mark.parametrize("kwargs, name", [({"max_num_seqs": 0}, "max_num_seqs"),
                                          ({"max_num_batched_tokens": 4, "max_num_seqs": 8}, "max_num_batched_tokens"),
                                          ({"preemption_mode": "evict"}, "preemption_mode"),
                                          ({"max_prefill_chunk": 0}, "max_prefill_chunk")])
def test_config_validation(kwargs, name):
    with pytest.raises(ValueError, match=name):
        SchedulerConfig(**kwargs)
