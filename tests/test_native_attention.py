"""The in-place paged-attention kernel (CPU_ATTN) against the gather reference (TORCH_SDPA)."""

import pytest
import torch

from labsupport.engine import LLMEngine, ModelRunner, native_attention
from labsupport.engine.attention import build_metadata, paged_attention
from labsupport.engine.native_attention import (
    MAX_MULTI_QUERY_TOKENS,
    MAX_QUERY_LEN,
    paged_attention_in_place,
    resolve_backend,
    takes_step,
)
from labsupport.sampling import GREEDY

needs_kernel = pytest.mark.skipif(native_attention.unavailable_reason() is not None,
                                  reason=f"CPU_ATTN unavailable: {native_attention.unavailable_reason()}")


def _batch(query_lens, starts, block_size, heads, dim, seed=0):
    """A pool with each sequence's cached prefix in scattered blocks, and the new tokens' q|k|v rows."""
    gen = torch.Generator().manual_seed(seed)
    ctx = [s + q for s, q in zip(starts, query_lens)]
    need = [-(-c // block_size) for c in ctx]
    num_blocks = sum(need) + 3
    order = torch.randperm(num_blocks, generator=gen).tolist()
    tables, used = [], 0
    for n in need:
        tables.append(order[used:used + n])
        used += n
    cache = torch.randn(2, num_blocks, block_size, heads, dim, generator=gen)   # stale data everywhere
    qkv = torch.randn(sum(query_lens), 3, heads, dim, generator=gen)
    return cache, tables, qkv


@needs_kernel
@pytest.mark.parametrize(("query_lens", "starts", "block_size", "heads", "dim"), [
    ([1], [0], 16, 4, 64),                          # the first token: one key
    ([1], [37], 16, 4, 64),                         # one request decoding (GPT-2's head size)
    ([1, 1, 1], [2, 40, 17], 32, 4, 64),            # ragged decode, block size 32 (vLLM's CPU default)
    ([5], [30], 16, 4, 64),                         # verifying 4 drafted tokens
    ([5, 3, 1], [9, 0, 33], 4, 3, 8),               # verification chains next to a decode, another head size
    ([MAX_QUERY_LEN, 2], [3, 60], 1, 2, 16),        # block size 1, the longest chain it takes
])
def test_in_place_equals_gather(query_lens, starts, block_size, heads, dim):
    cache, tables, qkv = _batch(query_lens, starts, block_size, heads, dim)
    ref_cache = cache.clone()
    q, k, v = qkv.unbind(1)
    meta = build_metadata(query_lens, starts, tables, block_size, num_heads=heads)
    expected = paged_attention(q, k, v, ref_cache, meta, dim ** -0.5)
    lean = build_metadata(query_lens, starts, tables, block_size, num_heads=heads, mask=False)
    assert lean.mask is None
    scores = torch.empty(lean.max_query_len * heads * lean.max_context_len)
    out = paged_attention_in_place(qkv.reshape(len(qkv), -1), cache, lean, dim ** -0.5, scores)
    torch.testing.assert_close(out, expected, atol=2e-6, rtol=1e-5)
    assert torch.equal(cache, ref_cache)                 # the same K/V written to the same slots, nothing else


@needs_kernel
def test_in_place_refuses_what_it_cannot_run():
    cache, tables, qkv = _batch([2], [5], 4, 2, 8)
    flat = qkv.reshape(2, -1)
    meta = build_metadata([2], [5], tables, 4, mask=False)
    scores = torch.empty(100)
    with pytest.raises(ValueError, match="float32"):
        paged_attention_in_place(flat.double(), cache, meta, 0.3, scores)
    with pytest.raises(ValueError, match="contiguous"):
        paged_attention_in_place(torch.randn(48, 2).t(), cache, meta, 0.3, scores)
    with pytest.raises(ValueError, match=r"scores must hold at least 28"):
        paged_attention_in_place(flat, cache, meta, 0.3, torch.empty(27))
    tree = build_metadata([2], [5], tables, 4, tree_parents=[[-1, -1]])
    with pytest.raises(ValueError, match="token tree"):
        paged_attention_in_place(flat, cache, tree, 0.3, scores)
    long_cache, long_tables, long_qkv = _batch([MAX_QUERY_LEN + 1], [0], 4, 2, 8)
    with pytest.raises(ValueError, match=f"at most {MAX_QUERY_LEN} new tokens"):
        paged_attention_in_place(long_qkv.reshape(MAX_QUERY_LEN + 1, -1), long_cache,
                                 build_metadata([MAX_QUERY_LEN + 1], [0], long_tables, 4, mask=False), 0.3, scores)


@needs_kernel
@pytest.mark.parametrize("table", [[-1], [-100_000_000], [6], [10_000_000]])
def test_in_place_refuses_blocks_outside_the_pool(table):
    cache, qkv = torch.randn(2, 6, 4, 2, 8), torch.randn(1, 48)
    meta = build_metadata([1], [0], [[0]], 4, mask=False)
    meta.block_tables = torch.tensor([table])                         # a hand-made table: no builder check
    meta.slot_mapping = torch.tensor([table[0] * 4])
    before = cache.clone()
    with pytest.raises(ValueError, match=r"blocks in \[0, 6\)"):
        paged_attention_in_place(qkv, cache, meta, 0.3, torch.empty(100))
    assert torch.equal(cache, before)                                 # nothing written anywhere
    with pytest.raises(ValueError, match="block ids >= 0"):
        build_metadata([1], [0], [[-1]], 4)


@needs_kernel
def test_in_place_checks_the_tensors_it_reads():
    cache, qkv, scores = torch.randn(2, 6, 4, 2, 8), torch.randn(1, 48), torch.empty(100)
    meta = build_metadata([1], [3], [[2]], 4, mask=False)
    with pytest.raises(ValueError, match="scores must be a contiguous"):
        paged_attention_in_place(qkv, cache, meta, 0.3, torch.empty(1).expand(100))
    with pytest.raises(ValueError, match="qkv must be a contiguous float32 tensor on the CPU, got .* on meta"):
        paged_attention_in_place(torch.empty(1, 48, device="meta"), cache, meta, 0.3, scores)
    with pytest.raises(TypeError, match="qkv must be a torch.Tensor, got ndarray"):
        paged_attention_in_place(qkv.numpy(), cache, meta, 0.3, scores)
    with pytest.raises(TypeError, match="scale"):
        paged_attention_in_place(qkv, cache, meta, "x", scores)
    meta.lens = torch.tensor([[1], [4_000_000]])                      # lengths that disagree with the lists
    with pytest.raises(ValueError, match="meta.lens must hold query_lens and context_lens"):
        paged_attention_in_place(qkv, cache, meta, 0.3, scores)
    meta.lens = torch.tensor([[1], [4]], dtype=torch.int32)
    with pytest.raises(ValueError, match="meta.lens must be a contiguous int64"):
        paged_attention_in_place(qkv, cache, meta, 0.3, scores)


@needs_kernel
def test_runner_hidden_states_checks_a_hand_made_meta(tiny_lm):
    runner = ModelRunner(tiny_lm, 16, 8, attention_backend="CPU_ATTN")
    for table in ([10_000_000], [-3]):
        meta = build_metadata([1], [5], [[0]], 16, mask=False)
        meta.block_tables = torch.tensor([table])
        with pytest.raises(ValueError, match=r"meta must address blocks in \[0, 8\)"):
            runner.hidden_states(torch.tensor([1]), meta)


def test_a_kept_library_cut_short_is_built_again(tmp_path, monkeypatch):
    if native_attention._compiler() is None:
        pytest.skip("no C compiler")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    first = native_attention._build(native_attention._compiler())
    whole = first.read_bytes()
    first.write_bytes(whole[:len(whole) // 2])                        # a crash while writing it
    assert not native_attention._intact(first)
    again = native_attention._build(native_attention._compiler())
    assert again == first and again.read_bytes() == whole and native_attention._intact(again)


def test_an_unusable_cache_folder_falls_back_to_the_temp_folder(tmp_path, monkeypatch):
    if native_attention._compiler() is None:
        pytest.skip("no C compiler")
    (tmp_path / "not-a-folder").write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "not-a-folder"))
    monkeypatch.setattr(native_attention.tempfile, "gettempdir", lambda: str(tmp_path / "tmp"))
    built = native_attention._build(native_attention._compiler())
    assert built.parent == tmp_path / "tmp" / "labsupport" and native_attention._intact(built)


def test_the_gather_refuses_a_meta_built_without_its_mask():
    cache, tables, qkv = _batch([1, 1], [3, 9], 4, 2, 8)
    q, k, v = qkv.unbind(1)
    lean = build_metadata([1, 1], [3, 9], tables, 4, mask=False)      # ragged contexts: a mask is needed
    with pytest.raises(ValueError, match="built with mask=False"):
        paged_attention(q, k, v, cache, lean, 0.3)
    cache, tables, qkv = _batch([1, 1], [9, 9], 4, 2, 8)
    q, k, v = qkv.unbind(1)
    equal = build_metadata([1, 1], [9, 9], tables, 4, mask=False)     # equal contexts: no mask needed anyway
    assert paged_attention(q, k, v, cache, equal, 0.3).shape == (2, 16)


def test_which_steps_run_in_place():
    assert takes_step([1] * 64)                                      # decode: any batch
    assert takes_step([5]) and takes_step([2, 2, 2, 2])              # a short verification
    assert not takes_step([MAX_MULTI_QUERY_TOKENS + 1])              # a longer one, or a prompt: SDPA
    assert not takes_step([5, 5]) and not takes_step([1, 134])
    assert not takes_step([1], tree=True)                            # a token tree's mask is not causal


def test_backend_choice(monkeypatch):
    cpu = torch.device("cpu")
    assert resolve_backend("TORCH_SDPA", cpu, torch.float32) == "TORCH_SDPA"
    with pytest.raises(ValueError, match="attention_backend must be None or one of"):
        resolve_backend("FLASH_ATTN", cpu, torch.float32)
    for bad in (1, True, ["CPU_ATTN"]):
        with pytest.raises(TypeError, match="attention_backend must be None or one of"):
            resolve_backend(bad, cpu, torch.float32)
    with pytest.raises(ValueError, match="float32 KV on the CPU.*kv_cache_dtype='int8'"):
        resolve_backend("CPU_ATTN", cpu, torch.float32, "int8")
    assert resolve_backend(None, cpu, torch.float16) == "TORCH_SDPA"
    assert resolve_backend(None, cpu, torch.float32, head_dim=512) == "TORCH_SDPA"
    with pytest.raises(ValueError, match="heads of at most 256 numbers, got 512"):
        resolve_backend("CPU_ATTN", cpu, torch.float32, head_dim=512)
    assert resolve_backend(None, cpu, torch.float32, "fp8") == "TORCH_SDPA"
    monkeypatch.setattr(native_attention, "_load", lambda: (None, "no C compiler found"))
    assert resolve_backend(None, cpu, torch.float32) == "TORCH_SDPA"         # falls back, same numbers
    with pytest.raises(ValueError, match="cannot run here: no C compiler found"):
        resolve_backend("CPU_ATTN", cpu, torch.float32)


def test_a_failing_compiler_is_reported_not_raised(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(native_attention.tempfile, "gettempdir", lambda: str(tmp_path / "tmp"))
    monkeypatch.setattr(native_attention, "_compiler", lambda: "/bin/false")
    native_attention._load.cache_clear()
    try:
        fn, why = native_attention._load()
        assert fn is None and why.startswith("the C compiler failed: /bin/false -O3") and "exited with 1" in why
        assert not list(tmp_path.rglob("*.so"))                              # nothing half-built is kept
    finally:
        native_attention._load.cache_clear()


@needs_kernel
@pytest.mark.slow
def test_engine_tokens_and_logits_equal_on_both_backends(tiny_lm):
    prompts = [tiny_lm.encode("Return the number of items in the list."), tiny_lm.encode("The default")]
    outs = {}
    for backend in ("TORCH_SDPA", "CPU_ATTN"):
        engine = LLMEngine(tiny_lm, block_size=16, num_blocks=64, attention_backend=backend)
        assert engine.runner.attention_backend == backend
        outs[backend] = [o.token_ids for o in engine.generate(prompts, GREEDY.replace(ignore_eos=True),
                                                             max_tokens=40)]
    assert outs["CPU_ATTN"] == outs["TORCH_SDPA"]
    runners = {b: ModelRunner(tiny_lm, 16, 16, attention_backend=b) for b in ("TORCH_SDPA", "CPU_ATTN")}
    ids = prompts[0]
    for b, r in runners.items():                                          # the prompt: prefill (SDPA on both)
        r.forward([ids], [0], [[3, 1, 7]])
    steps = [([[5]], [len(ids)]), ([[9, 2, 11, 4, 8]], [len(ids) + 1])]   # a decode, then a verification chain
    for new, start in steps:
        a, b = (r.forward(new, start, [[3, 1, 7]], all_logits=True) for r in runners.values())
        torch.testing.assert_close(b, a, atol=1e-4, rtol=1e-5)
    tree = [[-1, 0, 0]]                                                   # a token tree: SDPA on both
    a, b = (r.forward([[6, 3, 12]], [len(ids) + 6], [[3, 1, 7]], all_logits=True, tree_parents=tree)
            for r in runners.values())
    torch.testing.assert_close(b, a, atol=1e-4, rtol=1e-5)
