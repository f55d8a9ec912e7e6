"""Wire format (msgpack header + raw tensor frames) and KV block framing, without processes."""

from __future__ import annotations

import re

import msgpack
import pytest
import torch

from realexec.engine.kv_cache import KVCacheSpec, PagedKVCache
from realexec.serving.pd import kv_wire as pd_kv
from realexec.serving.pd.kv_wire import (
    StagedKV,
    block_runs,
    check_kv_message,
    kv_frames,
    stage,
    write_staged,
)
from realexec.serving.transport import PROTOCOL_VERSION, ProtocolError, decode, encode


def _add_body(**kw):
    body = {"request_id": "r1", "prompt_token_ids": [1, 2, 3], "sampling": {"max_tokens": 4}}
    body.update(kw)
    return body


def test_roundtrip_header_and_tensors_zero_copy_views():
    a = torch.arange(24, dtype=torch.float32).view(2, 3, 4)
    b = torch.tensor([1, 2, 3], dtype=torch.int64)
    h = torch.ones(5, dtype=torch.bfloat16)
    frames = encode("kv", {"request_id": "x", "num_tokens": 3, "block_size": 4, "runs": [],
                           "last": True, "t_send": 1.5, "prefill_worker": "p"}, [a, b, h])
    # tensor frames share memory with the source tensors (no copy on send)
    assert frames[1].ctypes.data == a.data_ptr()
    msg = decode([bytes(memoryview(f)) for f in frames])
    assert msg.type == "kv" and msg.body["request_id"] == "x"
    assert torch.equal(msg.tensors[0], a) and msg.tensors[0].dtype == torch.float32
    assert torch.equal(msg.tensors[1], b)
    assert msg.tensors[2].dtype == torch.bfloat16 and torch.equal(msg.tensors[2], h)


def _header(msg_type, body, tensors=()):
    return msgpack.packb({"v": PROTOCOL_VERSION, "type": msg_type, "body": body,
                          "tensors": list(tensors)})


@pytest.mark.parametrize("frames, fragment", [
    ([], "empty message"),
    ([b"\xc1\xff\x00garbage"], "not valid msgpack"),
    ([encode("add", _add_body())[0][:7]], "not valid msgpack"),  # truncated header
    ([msgpack.packb([1, 2, 3])], "header must be a map"),
    ([msgpack.packb({"v": 99, "type": "add", "body": {}, "tensors": []})], "protocol version"),
    ([_header("launch_missiles", {})], "unknown message type"),
    ([_header("add", {"request_id": "r"})], "missing field 'prompt_token_ids'"),
    ([_header("add", _add_body(prompt_token_ids=[1, "2"]))], "must be list[int]"),
    ([_header("add", _add_body(prompt_token_ids=[1, True]))], "must be list[int]"),
    ([_header("abort", {"request_ids": "r1"})], "must be list[str]"),
    ([_header("add", _add_body(), [["float32", [2]]])], "describes 1 tensors but 0"),
    ([_header("add", _add_body(), [["float32", [4]]]), b"\x00" * 15], "truncated"),
    ([_header("add", _add_body(), [["complex64", [1]]]), b"\x00" * 8], "dtype"),
    ([_header("add", _add_body(), [["float32", [-1]]]), b""], "non-negative"),
    ([_header("outputs", {"worker": "w", "step_id": 1, "step_s": 0.1, "t_wall": 1.0,
                          "items": [{"id": "a", "tok": [1]}], "stats": {}})], "missing field 'fin'"),
])
def test_bad_messages_are_rejected_with_a_reason(frames, fragment):
    with pytest.raises(ProtocolError, match=re.escape(fragment)):
        decode(frames)


def test_encode_refuses_unknown_types_and_dtypes():
    with pytest.raises(ValueError, match="unknown message type"):
        encode("nope", {})
    with pytest.raises(ValueError, match="cannot be sent"):
        encode("add", _add_body(), [torch.zeros(2, dtype=torch.complex64)])


def test_block_runs_groups_consecutive_ids():
    assert block_runs([4, 5, 6, 9, 10, 2]) == [(0, 4, 3), (3, 9, 2), (5, 2, 1)]
    assert block_runs([]) == []


def _cache(num_blocks: int, block_size: int, layers: int = 3, planes: int = 2) -> PagedKVCache:
    """K and V of 2 heads x 8 (planes 2), or an MLA latent row of 24 (planes 1)."""
    heads, dim = (2, 8) if planes == 2 else (1, 24)
    return PagedKVCache(KVCacheSpec(layers, heads, dim, block_size, torch.float32,
                                    num_planes=planes), num_blocks, torch.device("cpu"))


@pytest.mark.parametrize("layerwise", [False, True])
@pytest.mark.parametrize("gather", [False, True])
@pytest.mark.parametrize("planes", [2, 1])
def test_kv_moves_between_pools_with_different_blocks_and_block_sizes(layerwise, gather, planes,
                                                                      monkeypatch):
    """Planes 1: an MLA model's latent pool (DeepSeek), which PD once could not send."""
    if not gather:  # send every run as a zero-copy view of the pool, however small
        monkeypatch.setattr(pd_kv, "ZERO_COPY_MIN_BYTES", 0)
    n = 23  # prompt tokens: the last source block is partial
    src, dst = _cache(16, 4, planes=planes), _cache(12, 8, planes=planes)
    src_ids = [7, 8, 9, 2, 3, 11]  # 6 blocks of 4 >= 23 tokens, three runs
    g = torch.Generator().manual_seed(0)
    src.kv.copy_(torch.randn(src.kv.shape, generator=g))
    dst.kv.copy_(torch.randn(dst.kv.shape, generator=g))
    dst_ids = [5, 1, 9]  # 3 blocks of 8 >= 23 tokens
    skip = 8  # the first block is cached on the decode side already
    before = dst.kv.clone()
    staged = StagedKV("r", "p", n, 3, planes)
    groups = [range(i, i + 1) for i in range(3)] if layerwise else [range(3)]
    for k, layers in enumerate(groups):
        runs, tensors = kv_frames(src, src_ids, n, layers)
        views = [t.untyped_storage().data_ptr() == src.kv.untyped_storage().data_ptr()
                 for t in tensors]
        # 3 runs of blocks: a view per run, layer and plane, or all of it in one gathered frame
        assert len(tensors) == (1 if gather else planes * len(layers) * 3)
        assert all(views) != gather
        msg = decode([bytes(memoryview(f)) for f in encode("kv", {
            "request_id": "r", "num_tokens": n, "block_size": 4, "runs": runs,
            "last": k == len(groups) - 1, "t_send": 0.0, "prefill_worker": "p"}, tensors)])
        check_kv_message(msg, dst)
        stage(staged, msg)
    assert staged.complete
    write_staged(dst, staged, dst_ids, skip)

    def tokens(kv, ids, bs):
        slots = torch.tensor([ids[t // bs] * bs + t % bs for t in range(n)])
        return kv[:, :, slots]

    got = tokens(dst.kv, dst_ids, 8)
    assert torch.equal(got[:, :, skip:], tokens(src.kv, src_ids, 4)[:, :, skip:])
    assert torch.equal(got[:, :, :skip], tokens(before, dst_ids, 8)[:, :, :skip])
    untouched = [b for b in range(12) if b not in dst_ids]
    slots = torch.tensor([b * 8 + o for b in untouched for o in range(8)])
    assert torch.equal(dst.kv[:, :, slots], before[:, :, slots])


def test_incomplete_or_mismatched_kv_is_detected():
    src, dst = _cache(8, 4), _cache(8, 4, layers=2)
    runs, tensors = kv_frames(src, [0, 1], 8, range(3))
    msg = decode(encode("kv", {"request_id": "r", "num_tokens": 8, "block_size": 4, "runs": runs,
                               "last": True, "t_send": 0.0, "prefill_worker": "p"}, tensors))
    with pytest.raises(ProtocolError, match="out of range"):
        check_kv_message(msg, dst)  # 3 layers into a 2-layer pool
    staged = StagedKV("r", "p", 8, 3)
    runs, tensors = kv_frames(src, [0, 1], 8, range(2))  # layer 2 missing
    stage(staged, decode(encode("kv", {"request_id": "r", "num_tokens": 8, "block_size": 4,
                                       "runs": runs, "last": True, "t_send": 0.0,
                                       "prefill_worker": "p"}, tensors)))
    assert staged.got_last and not staged.complete


def _kv_msg(runs, tensors):
    return decode(encode("kv", {"request_id": "r", "num_tokens": 8, "block_size": 4, "runs": runs,
                                "last": True, "t_send": 0.0, "prefill_worker": "p"}, tensors))


@pytest.mark.parametrize("runs, shape, fragment", [
    ([[0, 0, 0, 8]], [1, 1, 8, 2, 8], "expected \\[first_layer, num_layers, first_kv"),  # v1 run
    ([[0, 3, 0, 2, 0, 8]], [3, 2, 8, 2, 8], "out of range"),  # layers 0-2 of a 2-layer pool
    ([[1, 1, 1, 2, 0, 8]], [1, 2, 8, 2, 8], "out of range"),  # K/V 1-2: there is no third
    ([[0, 2, 0, 2, 0, 8]], [2, 1, 8, 2, 8], r"frame is float32\[2, 1, 8, 2, 8\].*\[2, 2, 8, 2, 8\]"),
    ([[0, 1, 0, True, 0, 8]], [1, 1, 8, 2, 8], "expected"),  # a bool is not a count
])
def test_kv_runs_that_do_not_fit_the_pool_are_refused_by_name(runs, shape, fragment):
    msg = _kv_msg(runs, [torch.zeros(shape)])
    with pytest.raises(ProtocolError, match=fragment):
        check_kv_message(msg, _cache(8, 4, layers=2))


def test_gathered_frame_holds_every_layer_and_both_k_and_v_of_scattered_blocks():
    src = _cache(16, 4)
    src.kv.copy_(torch.randn(src.kv.shape, generator=torch.Generator().manual_seed(1)))
    ids = [9, 2, 5]  # three runs of one block: gathered
    runs, tensors = kv_frames(src, ids, 10, range(1, 3))
    assert runs == [[1, 2, 0, 2, 0, 12]] and len(tensors) == 1
    slots = torch.tensor([b * 4 + o for b in ids for o in range(4)])
    assert torch.equal(tensors[0], src.kv[1:3, :, slots])
    check_kv_message(_kv_msg(runs, tensors), src)
    with pytest.raises(ValueError, match="consecutive layers"):
        kv_frames(src, ids, 10, range(0, 3, 2))
