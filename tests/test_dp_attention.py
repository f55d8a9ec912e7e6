"""`cluster.dp_attention`: a replica's tp GPUs as attention ranks (own scheduler, KV pool and
whole attention weights each) that run the MoE layers together, stepping in lockstep."""

from __future__ import annotations

import numpy as np
import pytest

from simulator.core.batch_shape import BatchShape
from simulator.cost.breakdown import explain_step
from simulator.cost.costmodel import CostModel
from simulator.cost.dp_attention import (
    ATTENTION_OPS,
    EXPERT_OPS,
    REPLACED_OPS,
    DPAttentionCost,
    merged_shape,
)
from simulator.cost.memory_plan import plan_memory
from simulator.cost.models import get_model
from simulator.cost.parallel import shard_model
from simulator.scenario import scenario_from_dict
from tests.sim_helpers import merged, sim

DSV3 = {"model": "deepseek-v3", "dtype": "fp8", "hardware": "h200-sxm",
        "cluster": {"tp": 8, "ep": 8, "dp_attention": True}}
BURST = {"workload": {"synthetic": {"num_requests": 160, "arrival": {"process": "burst"},
                                    "prompt_len": {"dist": "fixed", "value": 1500},
                                    "output_len": {"dist": "fixed", "value": 200}}}}


def dp_sim(patch: dict | None = None):
    return sim(merged(merged(DSV3, BURST), patch or {}))


# ------------------------------------------------------------------ bad input
@pytest.mark.parametrize("cluster, message", [
    ({"tp": 8, "ep": 8, "dp_attention": True, "pp": 2}, "cluster.pp = 2"),
    ({"tp": 1, "dp_attention": True}, "cluster.tp = 1"),
    ({"tp": 8, "dp_attention": True, "host_memory_share": 0.5}, "cluster.host_memory_share"),
    ({"dp_attention": True, "tp": 4, "pd": {"prefill": {"tp": 4}, "decode": {"tp": 4}}},
     "cluster.pd (a PD deployment"),  # not the pools' Python repr
    ({"tp": 8, "dp_attention": "yes"}, "cluster.dp_attention: Input should be a valid boolean"),
])
def test_combinations_it_cannot_run_are_refused_naming_the_key(cluster, message):
    with pytest.raises(ValueError, match="cluster") as err:
        scenario_from_dict(merged(merged(DSV3, BURST), {"cluster": cluster}))
    assert message in str(err.value)


def test_a_dense_model_and_swapping_are_refused_before_the_run():
    with pytest.raises(ValueError, match="cluster.dp_attention: llama-3-70b is a dense model"):
        sim(merged(BURST, {"model": "llama-3-70b", "cluster": {"tp": 4, "dp_attention": True}}))
    with pytest.raises(ValueError, match="preemption_mode swap is not modelled"):
        dp_sim({"scheduler": {"preemption_mode": "swap"}, "cache": {"swap_space_gb": 4}})


# ------------------------------------------------------------------ memory plan
@pytest.mark.parametrize("name, tp", [("deepseek-v3", 8), ("qwen3-235b-a22b", 4),
                                      ("mixtral-8x7b", 2)])
def test_each_gpu_holds_whole_attention_and_every_kv_head(name, tp):
    model = get_model(name)
    dtype = "fp8"
    base = plan_memory(model, "h200-sxm", dtype, tp=tp, ep=tp)
    dp = plan_memory(model, "h200-sxm", dtype, tp=tp, ep=tp, dp_attention=True)
    one, split = shard_model(model, 1), shard_model(model, tp, 1, tp)
    extra = model.num_layers * (one.attention_params(model) - split.attention_params(model))
    assert dp.weight_bytes_per_gpu == pytest.approx(base.weight_bytes_per_gpu + extra * 1.0)
    if model.is_mla:  # the latent is whole on every TP rank already
        assert dp.kv_bytes_per_block == base.kv_bytes_per_block
    else:
        assert dp.kv_bytes_per_block == base.kv_bytes_per_block * min(tp, model.num_kv_heads)
    assert dp.dp_attention and not base.dp_attention


def test_mla_gets_far_more_kv_per_replica():
    """MLA's latent KV is whole on every TP rank, so tp ranks of their own hold ~tp x the tokens."""
    base = plan_memory("deepseek-v3", "h200-sxm", "fp8", tp=8, ep=8)
    dp = plan_memory("deepseek-v3", "h200-sxm", "fp8", tp=8, ep=8, dp_attention=True)
    assert 8 * dp.num_gpu_blocks > 5 * base.num_gpu_blocks


# ------------------------------------------------------------------ cost
def _costs(ep: int = 8, a2a: str = "none") -> tuple[DPAttentionCost, CostModel]:
    attn = CostModel("deepseek-v3", "h200-sxm", "fp8", tp=1)
    experts = CostModel("deepseek-v3", "h200-sxm", "fp8", tp=8, ep=ep, moe_a2a_backend=a2a)
    return DPAttentionCost(attn, experts), experts


def decodes(n: int, ctx: int = 2000) -> BatchShape:
    return BatchShape.from_lists([1] * n, [ctx] * n)


def test_a_step_is_the_slowest_ranks_attention_plus_the_shared_moe_side():
    dp, _ = _costs()
    small, big = decodes(2), decodes(40, 4000)
    t = dp.step_time([small, big, BatchShape()])
    assert t == pytest.approx(dp.attention_s(big) + dp.expert_s(merged_shape([small, big])))
    assert dp.attention_s(big) > dp.attention_s(small)
    assert dp.step_time([BatchShape()] * 8) == 0.0
    # spreading the same decodes over the ranks: attention shrinks, the MoE side is the same
    assert dp.step_time([decodes(8)] * 8) < dp.step_time([decodes(64)])
    assert merged_shape([decodes(8)] * 8).num_tokens == 64


def test_the_moe_side_follows_the_expert_split():
    shape = decodes(64)
    for ep in (1, 8):
        dp, experts = _costs(ep)
        ops = {op.name: op.time_s for op in explain_step(experts, shape).ops}
        # the experts' GEMMs, then all-gather + reduce-scatter: half the two all-reduces
        want = sum(t for name, t in ops.items() if name in EXPERT_OPS) + 0.5 * ops["tp_allreduce"]
        assert dp.expert_s(shape) == pytest.approx(want)
        assert "ep_all_to_all" not in ops


def test_the_all_to_all_moves_the_busiest_ranks_tokens():
    dp, experts = _costs(8, "all_to_all")
    ranks = [decodes(4)] * 7 + [decodes(36)]
    total = merged_shape(ranks)
    ops = {op.name: op for op in dp.expert_ops(total, ranks[-1])}
    # the dispatch + combine of the rank with 36 tokens, not of the step's 64
    want = next(op for op in explain_step(experts, decodes(36)).ops if op.name == "ep_all_to_all")
    assert ops["ep_all_to_all"].time_s == pytest.approx(want.time_s)
    # the 3 dense layers (of 61) still gather and scatter: 3 of the experts model's 61 + 3
    # all-reduces (one per layer, one per dense MLP)
    ar = next(op for op in explain_step(experts, total).ops if op.name == "tp_allreduce")
    assert ops["dp_gather_scatter"].time_s == pytest.approx(ar.time_s * 3 / 64)
    assert dp.step_time(ranks) == pytest.approx(dp.breakdown(ranks).total_s)
    # the same 64 tokens spread evenly over the ranks move less than with one busy rank
    assert dp.expert_s(total, decodes(8)) < dp.expert_s(total, ranks[-1])


def test_every_operator_is_priced_on_one_side():
    dp, experts = _costs(8)
    known = ATTENTION_OPS | EXPERT_OPS | REPLACED_OPS | {"tp_allreduce", "logits_gather"}
    mixed = BatchShape.from_lists([1] * 16 + [512], [2000] * 16 + [0])
    for cm in (dp.attention, experts):
        assert {op.name for op in explain_step(cm, mixed).ops} <= known


# ------------------------------------------------------------------ simulation
def test_every_request_finishes_spread_over_the_ranks_deterministically():
    a, b = dp_sim(), dp_sim()
    assert a.summary["requests"]["finished"] == 160
    for key in a.records:
        np.testing.assert_array_equal(a.records[key], b.records[key])
    ranks = {r.annotations["replica"] for r in a.requests}
    assert ranks == {f"r0.dp{j}" for j in range(8)}
    pool = a.summary["cluster"][0]
    assert pool["dp_attention"] is True
    assert pool["num_gpu_blocks"] == plan_memory("deepseek-v3", "h200-sxm", "fp8", tp=8, ep=8,
                                                 dp_attention=True).num_gpu_blocks


def test_the_ranks_step_in_lockstep():
    res = dp_sim({"output": {"timeseries": True}})
    rows = res.timeline.rows
    starts = {}
    for row in rows:
        starts.setdefault(row[0], []).append((row[1], row[2]))
    steps = res.summary["sim"]["num_steps"]
    # every rank's steps are group steps: the same start and end times, at most one per step
    group = {t for v in starts.values() for t in v}
    assert len(group) == steps
    assert all(len(v) <= steps for v in starts.values())
    assert max(len(v) for v in starts.values()) == steps  # some rank ran in every step


def test_mla_serves_a_kv_bound_burst_faster_than_tensor_parallel_attention():
    patch = {"workload": {"synthetic": {"num_requests": 600}}}
    dp = dp_sim(patch)
    tp = sim(merged(merged(merged(DSV3, BURST), patch), {"cluster": {"dp_attention": False}}))
    assert (dp.summary["throughput"]["output_tokens_per_s"]
            > 1.2 * tp.summary["throughput"]["output_tokens_per_s"])


def test_sglangs_chunked_prefill_size_is_divided_over_the_ranks():
    sc = scenario_from_dict(merged(merged(DSV3, BURST),
                                   {"engine": {"name": "sglang", "version": "0.5.7"}}))
    from packaging.version import Version

    from simulator.cost.hardware import get_accelerator
    from simulator.engines.sglang_server import chunked_prefill_size

    size = chunked_prefill_size(Version("0.5.7"), get_accelerator("h200-sxm").memory_bytes / 2**20)
    assert sc.scheduler.max_num_batched_tokens == size // 8
    assert any("divided by its 8 data-parallel attention ranks" in n for n in sc.engine_notes)
    assert sc.scheduler.schedule_conservativeness == 0.3  # SGLang's flag x 0.3
    # up to v0.4.4 --enable-dp-attention set dp = tp itself and halved the chunk instead
    old = scenario_from_dict(merged(merged(DSV3, BURST),
                                    {"engine": {"name": "sglang", "version": "0.4.3.post2"}}))
    assert old.scheduler.max_num_batched_tokens == chunked_prefill_size(
        Version("0.4.3.post2"), get_accelerator("h200-sxm").memory_bytes / 2**20) // 2


def test_estimate_spreads_the_step_over_the_ranks(capsys):
    """`kvpd estimate --dp-attention`: the requests go to the ranks one by one; the step time
    is the DP cost of those ranks' shapes, and the breakdown's operators sum to it."""
    import json

    from kvpd.cli import main as kvpd_main

    args = ["estimate", "--model", "deepseek-v3", "--hardware", "h200-sxm", "--dtype", "fp8",
            "--tp", "8", "--ep", "8", "--dp-attention", "--decode", "20x3000", "--json"]
    assert kvpd_main(args) == 0
    out = json.loads(capsys.readouterr().out)
    dp, _ = _costs()
    ranks = [decodes(3, 3000)] * 4 + [decodes(2, 3000)] * 4
    assert out["step_time_s"] == pytest.approx(dp.step_time(ranks))
    assert sum(op["time_s"] for op in out["ops"]) == pytest.approx(out["step_time_s"])
    assert {"dp_gather_scatter", "moe_experts", "attn_decode"} <= {op["name"] for op in out["ops"]}
    assert out["memory_plan"]["dp_attention"] is True
    assert kvpd_main(args[:-3] + ["--model", "llama-3-70b", "--decode", "8x100"]) == 2
    assert "--dp-attention needs an MoE model" in capsys.readouterr().err
    assert kvpd_main(args[:-3] + ["--ep", "4", "--decode", "8x100"]) == 2  # 1 < ep < tp
    assert "--dp-attention with --ep = 4 < --tp = 8" in capsys.readouterr().err


def test_estimate_prices_the_all_to_all_when_asked(capsys):
    """`kvpd estimate --moe-a2a-backend all_to_all`: the DP step as the cost with that backend
    prices it (the busiest rank's dispatch and combine); refused without expert parallelism."""
    import json

    from kvpd.cli import main as kvpd_main

    args = ["estimate", "--model", "deepseek-v3", "--hardware", "h200-sxm", "--dtype", "fp8",
            "--tp", "8", "--ep", "8", "--dp-attention", "--decode", "20x3000", "--json",
            "--moe-a2a-backend", "all_to_all"]
    assert kvpd_main(args) == 0
    out = json.loads(capsys.readouterr().out)
    dp, _ = _costs(8, "all_to_all")
    ranks = [decodes(3, 3000)] * 4 + [decodes(2, 3000)] * 4
    assert out["step_time_s"] == pytest.approx(dp.step_time(ranks))
    assert "ep_all_to_all" in {op["name"] for op in out["ops"]}
    assert kvpd_main(args[:7] + ["--tp", "8", "--ep", "1", "--decode", "8x100",
                                 "--moe-a2a-backend", "all_to_all"]) == 2
    assert "--moe-a2a-backend all_to_all, but --ep is 1: an all-to-all" in capsys.readouterr().err


def test_the_attention_side_from_the_fast_path_equals_its_operators():
    """`attention_s` (the one-GPU model's step less its MLP operators, cached by tokens) is the
    sum of `attention_ops` for any rank batch: decodes, prompt chunks and both."""
    import random

    dp, _ = _costs()
    rng = random.Random(7)
    for _ in range(60):
        decodes_n, prompts = rng.randint(0, 30), rng.randint(0, 2)
        tokens = [1] * decodes_n + [rng.randint(1, 600) for _ in range(prompts)]
        if not tokens:
            continue
        ctx = [rng.randint(8, 3000) for _ in range(decodes_n)] + [rng.randint(0, 1500)
                                                                for _ in range(prompts)]
        shape = BatchShape.from_lists(tokens, ctx)
        want = sum(op.time_s for op in dp.attention_ops(shape))
        assert dp.attention_s(shape) == pytest.approx(want, rel=1e-9)
