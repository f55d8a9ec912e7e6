"""Paged forward vs HF's own forward: logits agree (fp32, CPU) for every supported family,
for whole prompts, chunked prefill with mixed prefill/decode steps, and batched decode."""

from __future__ import annotations

import random

import pytest
import torch

from realexec.engine.attention import PagedAttention, build_metadata
from realexec.engine.configs import builtin_config
from realexec.engine.kv_cache import KVCacheSpec, PagedKVCache
from realexec.engine.model_loader import load_model
from realexec.engine.paged_model import PagedCausalLM
from tests.realexec_reference import FAMILIES as REFERENCE_FAMILIES
from tests.realexec_reference import (
    LINEAR_FAMILIES,
    one_thread,  # noqa: F401  (fixture)
)

pytestmark = pytest.mark.usefixtures("one_thread")

BLOCK = 4
LENS = [1, 5, 11, 23, 40]
# every attention family of the correctness matrix (the linear hybrids need their states, which
# this walk-only test does not build), and Gemma 3's multimodal release
FAMILIES = [*(n for n in REFERENCE_FAMILIES if n not in LINEAR_FAMILIES), "tiny-gemma3-mm"]


def _setup(model):
    loaded = load_model(model, dtype="fp32", device="cpu", seed=0)
    pm = PagedCausalLM(loaded.model)
    planes, kv_heads, kv_dim = pm.kv_cache_shape
    spec = KVCacheSpec(pm.num_layers, kv_heads, kv_dim, BLOCK, torch.float32, num_planes=planes)
    cache = PagedKVCache(spec, num_blocks=64, device=torch.device("cpu"))
    rng = random.Random(0)
    free = list(range(64))
    rng.shuffle(free)  # non-contiguous block tables
    seqs, tables = [], []
    vocab = loaded.config.vocab_size
    for n in LENS:
        seqs.append([rng.randrange(vocab) for _ in range(n)])
        tables.append([free.pop() for _ in range((n + BLOCK - 1) // BLOCK)])
    with torch.inference_mode():
        ref = [loaded.model(torch.tensor([s])).logits[0] for s in seqs]
    return pm, cache, seqs, tables, ref


def _run_steps(pm, cache, seqs, tables, schedule):
    """schedule: list of steps, each {seq index: number of new tokens}. Returns logits per seq."""
    done = [0] * len(seqs)
    got = [[] for _ in seqs]
    for step in schedule:
        idx = list(step)
        ids = [t for i in idx for t in seqs[i][done[i] : done[i] + step[i]]]
        meta = build_metadata(
            [step[i] for i in idx], [done[i] for i in idx], [tables[i] for i in idx],
            BLOCK, cache.num_blocks, torch.device("cpu"),
        )
        hidden = pm.forward(torch.tensor(ids), meta.positions, PagedAttention(cache, meta))
        logits = pm.compute_logits(hidden)
        off = 0
        for i in idx:
            got[i].append(logits[off : off + step[i]])
            off += step[i]
            done[i] += step[i]
    assert done == [len(s) for s in seqs]
    return [torch.cat(g) for g in got]


def _check(got, ref):
    # fp32 GEMMs over different row counts take different BLAS kernels (and differ between
    # CPUs: an AMD EPYC host put one tiny-qwen2-moe logit 1.4e-4 off at a logit scale of 12),
    # so the tolerance is 1e-4 of the logits' scale; a misplaced KV block moves them by O(1)
    for g, r in zip(got, ref):
        scale = max(1.0, float(r.abs().max()))
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-4 * scale)


@pytest.mark.parametrize("model", FAMILIES)
def test_whole_prompts_in_one_flat_batch(model):
    pm, cache, seqs, tables, ref = _setup(model)
    _check(_run_steps(pm, cache, seqs, tables, [{i: len(s) for i, s in enumerate(seqs)}]), ref)


@pytest.mark.parametrize("model", FAMILIES)
def test_chunked_prefill_with_mixed_steps(model):
    pm, cache, seqs, tables, ref = _setup(model)
    # each sequence advances by chunks of 7, 1, 3, 1, 16, ...: steps mix prefill and decode rows
    sizes = [7, 1, 3, 1, 16]
    done = [0] * len(seqs)
    schedule = []
    k = 0
    while any(d < len(s) for d, s in zip(done, seqs)):
        step = {}
        for i, s in enumerate(seqs):
            if done[i] < len(s):
                step[i] = min(sizes[(k + i) % len(sizes)], len(s) - done[i])
                done[i] += step[i]
        schedule.append(step)
        k += 1
    _check(_run_steps(pm, cache, seqs, tables, schedule), ref)


@pytest.mark.parametrize("model", FAMILIES)
def test_batched_decode_after_prefill(model):
    pm, cache, seqs, tables, ref = _setup(model)
    start = [max(1, len(s) - 6) for s in seqs]
    schedule = [{i: start[i] for i in range(len(seqs))}]
    for t in range(6):
        step = {i: 1 for i, s in enumerate(seqs) if start[i] + t < len(s)}
        if step:
            schedule.append(step)
    _check(_run_steps(pm, cache, seqs, tables, schedule), ref)


def test_sliding_window_matches_hf():
    cfg = builtin_config("tiny-mistral")
    cfg["sliding_window"] = 6
    pm, cache, seqs, tables, ref = _setup(cfg)
    schedule = [{i: min(9, len(s)) for i, s in enumerate(seqs)}]
    # then a chunk and single-token (batched decode) steps, both past the window
    schedule.append({i: min(5, len(s) - 9) for i, s in enumerate(seqs) if len(s) > 9})
    while any(sum(st.get(i, 0) for st in schedule) < len(s) for i, s in enumerate(seqs)):
        schedule.append({i: 1 for i, s in enumerate(seqs)
                         if sum(st.get(i, 0) for st in schedule) < len(s)})
    _check(_run_steps(pm, cache, seqs, tables, schedule), ref)


def test_sdpa_backends_leave_out_cudnn_on_cuda_only():
    from realexec.engine.attention import sdpa_backends

    assert torch.backends.cuda.cudnn_sdp_enabled()
    with sdpa_backends(torch.device("cuda")):
        assert not torch.backends.cuda.cudnn_sdp_enabled()
        assert torch.backends.cuda.flash_sdp_enabled()
        assert torch.backends.cuda.mem_efficient_sdp_enabled()
        assert torch.backends.cuda.math_sdp_enabled()
    assert torch.backends.cuda.cudnn_sdp_enabled()
    with sdpa_backends(torch.device("cpu")):
        assert torch.backends.cuda.cudnn_sdp_enabled()


def test_every_attention_call_of_the_walk_runs_under_the_backend_choice(monkeypatch):
    """The paged forward's SDPA calls (decode batch and prefill chunks) all run inside
    `sdpa_backends` of the model's device: on CUDA none may pick cuDNN, whose per-shape
    graph builds made served decode steps ~3x slower on an H200."""
    import realexec.engine.attention as attention
    import realexec.engine.paged_model as paged_model

    pm, cache, seqs, tables, _ = _setup("tiny-llama")  # HF's own forward uses SDPA too
    real_backends, real_sdpa = attention.sdpa_backends, attention.F.scaled_dot_product_attention
    cudnn_on_at_call = []

    def sdpa(*a, **kw):
        cudnn_on_at_call.append(torch.backends.cuda.cudnn_sdp_enabled())
        return real_sdpa(*a, **kw)

    monkeypatch.setattr(paged_model, "sdpa_backends", lambda _dev: real_backends(torch.device("cuda")))
    monkeypatch.setattr(attention.F, "scaled_dot_product_attention", sdpa)
    start = [max(1, len(s) - 2) for s in seqs]
    schedule = [{i: start[i] for i in range(len(seqs))},
                {i: 1 for i in range(len(seqs)) if start[i] < len(seqs[i])}]
    _run_steps(pm, cache, [s[: start[i] + 1] for i, s in enumerate(seqs)], tables, schedule)
    assert cudnn_on_at_call and not any(cudnn_on_at_call)
    assert torch.backends.cuda.cudnn_sdp_enabled()


def test_mla_caches_only_the_latent():
    """DeepSeek MLA: one plane of kv_lora_rank + qk_rope_head_dim per token and layer, not
    K and V of every head."""
    pm = PagedCausalLM(load_model("tiny-deepseek-v3", dtype="fp32", device="cpu").model)
    cfg = pm.config
    assert pm.kv_cache_shape == (1, 1, cfg.kv_lora_rank + cfg.qk_rope_head_dim)
    spec = KVCacheSpec(pm.num_layers, 1, 24, BLOCK, torch.float32, num_planes=1)
    assert spec.bytes_per_token == pm.num_layers * 24 * 4
    dense = PagedCausalLM(load_model("tiny-mixtral", dtype="fp32", device="cpu").model)
    assert dense.kv_cache_shape == (2, dense.num_kv_heads, dense.head_dim)


def test_deepseek_v32_caches_its_indexer_key_beside_the_latent_and_attends_sparsely(monkeypatch):
    """DeepSeek-V3.2: each token's cache row is the MLA latent plus the indexer's key; a query
    attends to the `index_topk` keys its indexer scores best. With every key selected instead,
    the logits of prompts longer than top-k move far from HF's (the selection is what matches)."""
    pm = PagedCausalLM(load_model("tiny-deepseek-v32", dtype="fp32", device="cpu").model)
    cfg = pm.config
    assert pm.kv_cache_shape == (1, 1, cfg.kv_lora_rank + cfg.qk_rope_head_dim
                                 + cfg.index_head_dim)
    from realexec.engine import sparse_index

    keep_all = sparse_index.IndexSelection.__init__

    def dense(self, q, w, keys, topk, scale):
        keep_all(self, q, w, keys, 10**9, scale)

    monkeypatch.setattr(sparse_index.IndexSelection, "__init__", dense)
    pm, cache, seqs, tables, ref = _setup("tiny-deepseek-v32")
    got = _run_steps(pm, cache, seqs, tables, [{i: len(s) for i, s in enumerate(seqs)}])
    for g, r, s in zip(got, ref, seqs):
        off = float((g - r).abs().max())
        assert (off > 1.0) == (len(s) > cfg.index_topk), (len(s), off)


def test_glm5_rotates_its_indexer_interleaved_and_shared_layers_reuse_the_top_k(monkeypatch):
    """GLM-5: the indexer's rotary is interleaved (DeepSeek-V3.2's is half-split), and a layer
    without an indexer ("shared") attends to the previous layer's selection. Either changed,
    the logits of prompts longer than top-k leave HF's."""
    from realexec.engine import sparse_index

    def off(pm, cache, seqs, tables, ref):
        got = _run_steps(pm, cache, seqs, tables, [{i: len(s) for i, s in enumerate(seqs)}])
        return [float((g - r).abs().max()) for g, r in zip(got, ref)]

    pm, cache, seqs, tables, ref = _setup("tiny-glm5")
    long = [len(s) > pm.config.index_topk for s in seqs]
    assert max(off(pm, cache, seqs, tables, ref)) < 1e-3
    from transformers.models.deepseek_v32 import modeling_deepseek_v32 as v32

    pm.index_rotate = v32.apply_rotary_pos_emb  # DeepSeek-V3.2's half-split rotary
    assert [d > 1.0 for d in off(pm, cache, seqs, tables, ref)] == long
    pm, cache, seqs, tables, ref = _setup("tiny-glm5")
    own = sparse_index.SparseIndexState.select

    def dense_when_shared(self, sa, x, q_latent, cos, sin, keys):
        if sa.indexer is None:  # attend to every key instead of reusing the last top-k
            key, last = own(self, sa, x, q_latent, cos, sin, keys)
            return key, sparse_index.IndexSelection(last.q, last.weights, last.keys, 10**9,
                                                    last.scale)
        return own(self, sa, x, q_latent, cos, sin, keys)

    monkeypatch.setattr(sparse_index.SparseIndexState, "select", dense_when_shared)
    assert [d > 1.0 for d in off(pm, cache, seqs, tables, ref)] == long


def test_the_indexer_scores_long_contexts_in_row_chunks_with_the_same_selection(monkeypatch):
    """Scores of many queries over many keys are computed a few query rows at a time (a
    2,048-token chunk over 128k keys would need 64 GiB at once); the keys kept are the same."""
    from realexec.engine import sparse_index

    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 37, 16, 16, generator=g)
    w = torch.randn(2, 37, 16, generator=g)
    k = torch.randn(2, 300, 16, generator=g)
    allowed = torch.rand(2, 37, 300, generator=g) > 0.3
    sel = sparse_index.IndexSelection(q, w, lambda s: s, 8, 0.25)
    whole = sel._select(q, w, k, allowed)
    for rows in (5, 1):  # query rows of one sequence a chunk
        monkeypatch.setattr(sparse_index, "SCORE_BYTES", 16 * 300 * 4 * rows)
        assert torch.equal(sel._select(q, w, k, allowed), whole)
    assert whole.sum(-1).max() == 8 and whole.sum(-1).min() > 0
    decode = sparse_index.IndexSelection(q, w, lambda s: s, 8, 0.25)  # one row, 2 sequences
    one = decode._select(q[:, :1], w[:, :1], k, allowed[:, :1])
    monkeypatch.setattr(sparse_index, "SCORE_BYTES", 16 * 300 * 4)  # one sequence a chunk
    assert torch.equal(decode._select(q[:, :1], w[:, :1], k, allowed[:, :1]), one)
    assert sparse_index._chunks(3, 1, 2) == [(0, 2, 0, 1), (2, 3, 0, 1)]
    assert sparse_index._chunks(2, 5, 2) == [(0, 1, 0, 2), (0, 1, 2, 4), (0, 1, 4, 5),
                                             (1, 2, 0, 2), (1, 2, 2, 4), (1, 2, 4, 5)]
