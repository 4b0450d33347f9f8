"""KV tiers when their storage goes wrong: a tier file deleted, cut short, overwritten with garbage,
with a tensor of another shape or dtype, or with other numbers of the right shape (even carrying the
original digest in its metadata), and a CPU-tier entry whose numbers were changed. Each is a cache
miss counted in ``rejected``: the prefix is recomputed, the tokens equal an engine without tiers,
no block leaks (``audit()``), and the same prompt is served again afterwards."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import make_tiny_lm
from safetensors.torch import load_file, save_file

from labsupport.engine import LLMEngine
from labsupport.sampling import GREEDY
from labsupport.serving.tiers import TieredKVCache, kv_digest

BS = 4


@pytest.fixture(scope="module")
def lm():
    return make_tiny_lm(seed=3, n_positions=128)


@pytest.fixture(scope="module")
def prompts(lm):
    rng = np.random.default_rng(9)
    v = lm.model.config.vocab_size
    return rng.integers(0, v, 17).tolist(), rng.integers(0, v, 23).tolist()   # A: 4 full blocks + 1; B evicts them


@pytest.fixture(scope="module")
def expected(lm, prompts):
    eng = LLMEngine(lm, block_size=BS, num_blocks=6)
    return eng.generate([prompts[0]], GREEDY, 6)[0].token_ids


def _chain_keys(pool, ids: list[int]) -> list[int]:
    keys, parent = [], None
    for i in range((len(ids) - 1) // BS):
        parent = pool.hash_fn(parent, [int(t) for t in ids[i * BS:(i + 1) * BS]])
        keys.append(parent)
    return keys


def _demoted(lm, prompts, cpu: int, disk: int, tmp_path):
    """An engine whose pool was emptied of prompt A's blocks into the tiers."""
    eng = LLMEngine(lm, block_size=BS, num_blocks=6, enable_prefix_caching=True)
    tiers = TieredKVCache(eng, cpu_capacity=cpu, disk_capacity=disk, disk_dir=str(tmp_path))
    a, b = prompts
    tiers.add_request(a, GREEDY, 1)
    eng.run()
    tiers.add_request(b, GREEDY, 1)
    eng.run()
    keys = _chain_keys(eng.block_manager.pool, a)
    assert all(k in tiers.cpu or k in tiers.disk for k in keys)
    return eng, tiers, keys


def _serve_a(eng, tiers, prompts) -> tuple[list[int], dict]:
    rid = tiers.add_request(prompts[0], GREEDY, 6)
    eng.run()
    return eng.output(rid).token_ids, tiers.records[-1]


def _spoil(path: str, how: str) -> None:
    if how == "deleted":
        os.remove(path)
    elif how == "truncated":
        data = Path(path).read_bytes()
        Path(path).write_bytes(data[:len(data) // 2])
    elif how == "garbage":
        Path(path).write_bytes(np.random.default_rng(0).bytes(os.path.getsize(path)))
    elif how == "wrong_shape":
        save_file({"kv": torch.zeros(2, 3)}, path)
    elif how == "wrong_dtype":
        kv = load_file(path)["kv"]
        save_file({"kv": kv.to(torch.float16)}, path)
    elif how == "no_kv":
        save_file({"values": torch.zeros(1)}, path)
    elif how == "other_numbers":                            # same shape, dtype and even the stored digest
        kv = load_file(path)["kv"]
        save_file({"kv": kv.flip(2).contiguous() * 1.5 + 0.25}, path, metadata={"blake2b": kv_digest(kv)})
    else:
        raise AssertionError(how)


@pytest.mark.parametrize("how", ["deleted", "truncated", "garbage", "wrong_shape", "wrong_dtype", "no_kv",
                                 "other_numbers"])
def test_a_spoiled_disk_tier_file_is_a_counted_miss(lm, prompts, expected, tmp_path, how):
    eng, tiers, keys = _demoted(lm, prompts, cpu=0, disk=16, tmp_path=tmp_path)
    with tiers:
        _spoil(tiers.disk[keys[1]].path, how)                 # the second block of A's prefix
        tokens, record = _serve_a(eng, tiers, prompts)
        assert tokens == expected
        assert tiers.rejected == {"cpu": 0, "disk": 1}
        assert len(tiers.rejections) == 1 and "disk tier block" in tiers.rejections[0]
        assert record["disk"] == 1 and record["miss"] == 3    # block 0 served, 1 rejected, 2-3 recomputed
        tiers.audit()
        assert eng.block_manager.num_used_blocks == 0
        again, record = _serve_a(eng, tiers, prompts)         # served again, now from the pool
        assert again == expected and record["pool"] == 4
        tiers.audit()


def test_what_each_spoiled_file_is_told_apart_by(lm, prompts, tmp_path):
    said = {}
    for how in ("deleted", "wrong_shape", "wrong_dtype", "no_kv", "other_numbers"):
        _, tiers, keys = _demoted(lm, prompts, cpu=0, disk=16, tmp_path=tmp_path / how)
        with tiers:
            _spoil(tiers.disk[keys[0]].path, how)
            tiers.promote(prompts[0])
            said[how] = tiers.rejections[0]
            tiers.audit()
    assert "unreadable (FileNotFoundError" in said["deleted"]
    assert "shape (2, 3)" in said["wrong_shape"] and "torch.float16" in said["wrong_dtype"]
    assert "no K/V tensor" in said["no_kv"] and "digest" in said["other_numbers"]


def test_a_changed_cpu_tier_entry_is_a_counted_miss(lm, prompts, expected, tmp_path):
    eng, tiers, keys = _demoted(lm, prompts, cpu=16, disk=0, tmp_path=tmp_path)
    with tiers:
        entry = tiers.cpu[keys[0]]
        entry.kv += 1.0                                       # in place: the same tensor, other numbers
        tokens, record = _serve_a(eng, tiers, prompts)
        assert tokens == expected
        assert tiers.rejected == {"cpu": 1, "disk": 0} and record["miss"] == 4
        tiers.audit()
        assert eng.block_manager.num_used_blocks == 0


def test_tier_files_deleted_behind_its_back_do_not_break_eviction_or_close(lm, prompts, expected, tmp_path):
    """Every file deleted: demoting more blocks evicts the disk tier's oldest entries (their files
    gone), the prompt is recomputed, and close() cleans up."""
    eng, tiers, _ = _demoted(lm, prompts, cpu=0, disk=5, tmp_path=tmp_path)
    for entry in list(tiers.disk.values()):
        os.remove(entry.path)
    rng = np.random.default_rng(1)
    for _ in range(3):                                        # push the dead entries out of the disk tier
        tiers.add_request(rng.integers(0, lm.model.config.vocab_size, 21).tolist(), GREEDY, 1)
        eng.run()
    tokens, _ = _serve_a(eng, tiers, prompts)
    assert tokens == expected
    tiers.close()
    assert os.listdir(tmp_path) == []
