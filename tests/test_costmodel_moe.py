"""MoE, expert-parallel and MLA terms of the cost model and the memory plan."""

from __future__ import annotations

import subprocess
import sys

import pytest

from simulator.core.batch_shape import BatchShape
from simulator.cost.costmodel import CostModel
from simulator.cost.hardware import get_accelerator
from simulator.cost.memory_plan import plan_memory
from simulator.cost.models import get_model
from simulator.cost.moe_cost import mla_terms


def _decode(b: int, ctx: int = 1024) -> BatchShape:
    return BatchShape.from_lists([1] * b, [ctx] * b)


def _mixed() -> BatchShape:
    s = _decode(24, 700)
    s.add(300, 512)
    s.add(200, 0)
    return s


CONFIGS = [("mixtral-8x7b", "h100-sxm", "bf16", 2, 1, 1), ("mixtral-8x7b", "h100-sxm", "bf16", 2, 1, 2),
           ("qwen3-30b-a3b", "h100-sxm", "bf16", 1, 1, 1),
           ("deepseek-v2-lite", "h100-sxm", "bf16", 1, 2, 1),
           ("deepseek-v3", "h200-sxm", "fp8", 8, 1, 8), ("deepseek-v3", "h200-sxm", "fp8", 8, 2, 1),
           ("mixtral-8x7b", "h100-sxm", "bf16", 4, 1, 2), ("deepseek-v3", "h200-sxm", "fp8", 8, 1, 4)]


@pytest.mark.parametrize("model,hw,dtype,tp,pp,ep", CONFIGS)
def test_explain_and_decode_runs_agree_with_step_time(model, hw, dtype, tp, pp, ep):
    cm = CostModel(model, hw, dtype, tp, pp, ep=ep)
    for shape in (_decode(1), _decode(3), _decode(64), _mixed()):
        t = cm.step_time(shape)
        assert cm.explain(shape).total_s == pytest.approx(t, rel=1e-12)
    run = cm.decode_run_times(_decode(16, 900), 5)
    for k in range(5):
        assert run[k] == pytest.approx(cm.step_time(_decode(16, 900 + k)), rel=1e-9)


def test_decode_bytes_grow_with_the_batch_until_every_expert_is_hot():
    cm = CostModel("qwen3-30b-a3b", "h100-sxm")
    loaded = [cm.expected_experts_loaded(b) for b in (1, 4, 16, 64, 512)]
    assert loaded[0] == pytest.approx(8.0)  # one token: its top-8
    assert loaded == sorted(loaded) and loaded[-1] == pytest.approx(128.0, rel=1e-3)
    moe_bytes = [next(op.bytes for op in cm.explain(_decode(b)).ops if op.name == "moe_experts")
                 for b in (4, 16, 64)]
    assert moe_bytes[0] < moe_bytes[1] < moe_bytes[2]


def test_shared_experts_and_dense_layers_are_always_read():
    m = get_model("deepseek-v3")
    cm = CostModel(m, "h200-sxm", "fp8", 8, ep=8)
    op = next(o for o in cm.explain(_decode(1)).ops if o.name == "moe_experts")
    # one token: 8 routed experts over 8 ranks (1 whole expert per rank and MoE layer), the
    # shared expert and 3 dense MLPs split 8 ways, and the router
    d, f = m.hidden_size, m.ffn_size
    routed = m.num_moe_layers * 1 * 3 * d * f
    fixed = (m.num_moe_layers * (m.shared_expert_params / 8 + 0) + 3 * m.dense_mlp_params / 8)
    assert op.bytes >= routed + fixed  # fp8: 1 byte per weight


def test_expert_parallel_moves_tokens_not_weights():
    tp = CostModel("mixtral-8x7b", "h100-sxm", tp=2)
    ep = CostModel("mixtral-8x7b", "h100-sxm", tp=2, ep=2)
    a2a = CostModel("mixtral-8x7b", "h100-sxm", tp=2, ep=2, moe_a2a_backend="all_to_all")
    shape = _decode(32)
    ops = {name: {op.name: op for op in cm.explain(shape).ops}
           for name, cm in (("tp", tp), ("ep", ep), ("a2a", a2a))}
    # the engines' default: no all-to-all, the same two all-reduces per layer as TP
    assert "ep_all_to_all" not in ops["tp"] and "ep_all_to_all" not in ops["ep"]
    assert ops["ep"]["tp_allreduce"].time_s == pytest.approx(ops["tp"]["tp_allreduce"].time_s)
    # the all-to-all backend: dispatch + combine of 2 (k) x 1/2 ((ep-1)/ep) hidden states per
    # token and MoE layer replaces the MLP's all-reduce (one of the two per layer)
    m = get_model("mixtral-8x7b")
    assert ops["a2a"]["ep_all_to_all"].bytes == pytest.approx(
        32 * m.num_layers * 2 * 2 * 0.5 * m.hidden_size * 2)
    assert ops["a2a"]["tp_allreduce"].bytes == pytest.approx(0.5 * ops["ep"]["tp_allreduce"].bytes)
    assert a2a.step_time(shape) == pytest.approx(a2a.explain(shape).total_s)
    assert ep.describe()["moe_a2a_backend"] == "none"
    assert ep.expected_experts_loaded(1) == pytest.approx(1.0)  # 2 of 8 experts over 2 GPUs
    assert tp.expected_experts_loaded(1) == pytest.approx(2.0)  # both, each a half slice
    mt, me = plan_memory("mixtral-8x7b", "h100-sxm", tp=2), plan_memory("mixtral-8x7b", "h100-sxm", tp=2, ep=2)
    assert mt.expert_weight_bytes_per_gpu == pytest.approx(me.expert_weight_bytes_per_gpu)
    m = get_model("mixtral-8x7b")
    assert me.expert_weight_bytes_per_gpu == pytest.approx(
        32 * 4 * 3 * m.hidden_size * m.ffn_size * 2)  # 4 whole experts x 32 layers, bf16


def test_unknown_a2a_backend_is_refused():
    with pytest.raises(ValueError, match="moe_a2a_backend 'deepep' unknown; allowed: none, "
                                         "all_to_all"):
        CostModel("mixtral-8x7b", "h100-sxm", tp=2, ep=2, moe_a2a_backend="deepep")


@pytest.mark.parametrize("ep,tp,match", [(3, 4, "does not divide the 8 experts"),
                                         (4, 2, "does not divide tp=2"),
                                         (2, 3, "does not divide tp=3"),
                                         (0, 2, "positive integer")])
def test_bad_ep_is_refused(ep, tp, match):
    with pytest.raises(ValueError, match=match):
        CostModel("mixtral-8x7b", "h100-sxm", tp=tp, ep=ep)
    with pytest.raises(ValueError, match="dense model"):
        CostModel("llama-3-8b", "h100-sxm", tp=2, ep=2)


def test_scenario_cluster_ep_is_checked_naming_the_key(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "kvpd.cli", "simulate", "scenarios/mixtral_8x7b_ep2.yaml",
         "--set", "cluster.ep=3", "--set", "cluster.tp=4", "--no-plots", "--out", str(tmp_path)],
        capture_output=True, text=True)
    assert r.returncode != 0
    assert "cluster.ep: ep=3 does not divide the 8 experts of mixtral-8x7b" in r.stderr


def test_mla_decode_absorbed_prefill_expanded_and_the_pool_holds_latents():
    m = get_model("deepseek-v3")
    t = mla_terms(m, 8)
    assert t.decode_flops_per_pair == 2 * 16 * (2 * 512 + 64)
    assert t.prefill_flops_per_pair == 2 * 16 * (192 + 128)
    plan = plan_memory("deepseek-v3", "h200-sxm", "fp8", tp=8, ep=8)
    assert plan.kv_bytes_per_block == 16 * 61 * 576 * 2  # auto: the bf16 activation dtype
    plan = plan_memory("deepseek-v3", "h200-sxm", "fp8", tp=8, ep=8, kv_cache_dtype="fp8")
    assert plan.kv_bytes_per_block == 16 * 61 * 576 * 1
    cm = CostModel(m, "h200-sxm", "fp8", 8, ep=8)
    op = next(o for o in cm.explain(_decode(4, 1000)).ops if o.name == "attn_decode")
    assert op.flops == pytest.approx(4 * 1001 * 61 * t.decode_flops_per_pair)


def test_estimate_explain_names_experts_loaded_and_the_bound():
    out = subprocess.run(
        [sys.executable, "-m", "kvpd.cli", "estimate", "--model", "mixtral-8x7b", "--hardware",
         "h100-sxm", "--tp", "2", "--ep", "2", "--decode", "4x512", "--explain"],
        capture_output=True, text=True, check=True).stdout
    assert "expected experts loaded per GPU" in out and "of 4 per MoE layer" in out
    assert "step bound" in out and "expert GEMMs" in out and "-bound" in out


def test_layer_floor_counts_the_kernels_moe_and_mla_layers_add():
    """Default kernel floor: seconds per dependent kernel x the kernels of each layer; an MoE
    layer adds routing and grouped GEMMs, shared experts and MLA add theirs (kernels.yaml),
    and its fused_experts call costs the measured `grouped_gemm.call_s` in place of its five
    kernels' share."""
    from simulator.cost.kernels import FUSED_EXPERTS_KERNELS, kernel_profile
    from simulator.cost.moe_cost import stage_layer_split

    k = kernel_profile(get_accelerator("h200-sxm"))
    extra = dict(k.extra_kernels)
    dense = CostModel("llama-3-70b", "h200-sxm", "fp8", 8)
    assert dense._stages[0]["raw"]["layer_floor_s"] == pytest.approx(80 * k.layer_floor_s)
    m = get_model("deepseek-v3")
    cm = CostModel(m, "h200-sxm", "fp8", 8)
    n_dense, n_moe = stage_layer_split(m, cm.shard.layers_per_stage, 0)
    base = k.layer_floor_s / k.kernel_s
    want = k.kernel_s * (n_dense * (base + extra["mla"])
                         + n_moe * (base + extra["mla"] + extra["moe"] + extra["shared_expert"]
                                    - FUSED_EXPERTS_KERNELS))
    want += n_moe * k.grouped_gemm.call_s
    assert k.grouped_gemm.call_s > FUSED_EXPERTS_KERNELS * k.kernel_s
    assert cm._stages[0]["raw"]["layer_floor_s"] == pytest.approx(want)
    op = next(o for o in cm.explain(_decode(4, 1000)).ops if o.name == "layer_overhead")
    assert op.time_s == pytest.approx(want)


def test_moe_activation_and_topk_sum_passes_add_their_bytes():
    """vLLM's fused MoE runs silu_and_mul over each token's k experts and moe_sum over their
    k outputs as kernels of their own: the elementwise bytes per token per MoE layer count
    k x 3 x (moe_intermediate / tp) + (k + 1) x hidden, not one expert's intermediate."""
    m = get_model("qwen3-235b-a22b")
    cm = CostModel(m, "h100-sxm", tp=8)
    ops = {o.name: o for o in cm.explain(BatchShape.from_lists([4096], [0])).ops}
    d, k, f = m.hidden_size, m.experts_per_token, m.ffn_size / 8
    base = 8 * d + 2 * (cm.shard.heads + cm.shard.kv_heads) * m.head_dim
    per_layer = (base + k * 3 * f + (k + 1) * d) * 2
    assert ops["norm_act_rope"].bytes == pytest.approx(4096 * m.num_layers * per_layer)
    dense = CostModel("llama-3-8b", "h100-sxm")  # a dense model keeps its one SiLU x up pass
    dops = {o.name: o for o in dense.explain(BatchShape.from_lists([4096], [0])).ops}
    dm = dense.model
    assert dops["norm_act_rope"].bytes == pytest.approx(
        4096 * dm.num_layers * 2 * (8 * dm.hidden_size + 3 * dm.ffn_size
                                    + 2 * (dm.num_heads + dm.num_kv_heads) * dm.head_dim))


def test_fp8_fused_moe_runs_at_the_measured_speedup_over_bf16_not_the_doubled_peak():
    """kernels.yaml grouped_gemm.fp8_speedup (vLLM PR #35457): W8A8 fused-MoE kernels are
    ~1.15x the BF16 ones, while the dense FP8 GEMMs keep their own (higher) gain."""
    pf = BatchShape.from_lists([8192], [0])
    ops = {}
    for dt in ("bf16", "fp8"):
        cm = CostModel("mixtral-8x7b", "h100-sxm", tp=2, dtype=dt)
        ops[dt] = {o.name: o for o in cm.explain(pf).ops}
    moe = ops["bf16"]["moe_experts"].compute_s / ops["fp8"]["moe_experts"].compute_s
    qkv = ops["bf16"]["qkv_proj"].compute_s / ops["fp8"]["qkv_proj"].compute_s
    assert moe == pytest.approx(1.15, rel=0.03)  # router GEMM is dense: a little off 1.15
    assert qkv > 1.5


MIXTRAL_BURST = {"model": "mixtral-8x7b", "hardware": "h100-sxm",
                 "workload": {"synthetic": {"num_requests": 40, "arrival": {"process": "burst"},
                                            "prompt_len": {"dist": "fixed", "value": 600},
                                            "output_len": {"dist": "fixed", "value": 50}}}}


@pytest.mark.parametrize("cluster, message", [
    ({"tp": 2, "ep": 1, "moe_a2a_backend": "all_to_all"},
     "cluster.moe_a2a_backend: all_to_all, but cluster.ep is 1"),
    ({"tp": 2, "ep": 2, "ep_link": "scale_out"},
     "cluster.ep_link: scale_out is the link of the MoE all-to-all, which "
     "cluster.moe_a2a_backend: none does not run"),
    ({"tp": 2, "pd": {"prefill": {"tp": 2, "ep": 2, "ep_link": "scale_out"}}},
     "cluster.pd.prefill.ep_link: scale_out"),
    ({"tp": 2, "ep": 2, "moe_a2a_backend": "deepep"}, "cluster.moe_a2a_backend"),
])
def test_an_all_to_all_setting_that_cannot_run_is_refused_naming_the_key(cluster, message):
    from tests.sim_helpers import merged, sim

    with pytest.raises(ValueError) as err:
        sim(merged(MIXTRAL_BURST, {"cluster": cluster}), base={})
    assert message in str(err.value)


def test_the_all_to_all_backend_slows_a_simulated_ep_replica():
    from tests.sim_helpers import merged, sim

    runs = {a2a: sim(merged(MIXTRAL_BURST, {"cluster": {"tp": 2, "ep": 2,
                                                        "moe_a2a_backend": a2a}}), base={})
            for a2a in ("none", "all_to_all")}
    assert all(r.summary["requests"]["finished"] == 40 for r in runs.values())
    # the same steps, each also dispatching and combining its tokens over NVLink
    assert runs["all_to_all"].summary["span_s"] > runs["none"].summary["span_s"]


@pytest.mark.parametrize("model,hw,dtype,tp", [("mixtral-8x7b", "h100-sxm", "bf16", 4),
                                               ("deepseek-v3", "h200-sxm", "fp8", 8)])
def test_expert_groups_smaller_than_tp_split_each_expert_within_the_group(model, hw, dtype, tp):
    """ep dividing tp: each of the ep groups of tp/ep GPUs holds E/ep experts split tp/ep ways,
    so a GPU holds the same expert weights at every ep, and a compute-bound prefill of many
    tokens costs about the same; at decode the expected experts a GPU streams lie between
    those of ep 1 and ep = tp."""
    m = get_model(model)
    acc = get_accelerator(hw)
    plans = {ep: plan_memory(m, acc, dtype, tp, 1, ep=ep) for ep in (1, 2, tp)}
    assert plans[2].weight_bytes_per_gpu == pytest.approx(plans[1].weight_bytes_per_gpu, rel=1e-9)
    assert plans[2].weight_bytes_per_gpu == pytest.approx(plans[tp].weight_bytes_per_gpu, rel=1e-9)
    cms = {ep: CostModel(model, hw, dtype, tp, 1, ep=ep) for ep in (1, 2, tp)}
    hit = {ep: cm.expected_experts_loaded(4.0) for ep, cm in cms.items()}
    assert hit[tp] < hit[2] < hit[1]  # experts per GPU: E/tp < E/2 < E (each a 1/(tp/ep) slice)
    prefill = BatchShape.from_lists([8192], [0])
    times = {ep: cm.step_time(prefill) for ep, cm in cms.items()}
    assert times[2] == pytest.approx(times[1], rel=0.1)
    br = cms[2].explain(_decode(8))
    assert br.total_s == pytest.approx(cms[2].step_time(_decode(8)), rel=1e-12)


def test_expert_groups_smaller_than_tp_refuse_the_all_to_all_and_dp_attention():
    from tests.sim_helpers import merged, sim

    with pytest.raises(ValueError, match="all_to_all with cluster.ep = 2 < cluster.tp = 4"):
        sim(merged(MIXTRAL_BURST, {"cluster": {"tp": 4, "ep": 2,
                                               "moe_a2a_backend": "all_to_all"}}), base={})
    with pytest.raises(ValueError, match="dp_attention with cluster.ep = 2 < cluster.tp = 4"):
        sim(merged(MIXTRAL_BURST, {"cluster": {"tp": 4, "ep": 2, "dp_attention": True}}),
            base={})
