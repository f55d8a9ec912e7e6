"""Issue 30: precision as separate knobs, shape-dependent kernel efficiencies, and the
explanation of where each efficiency came from."""

from __future__ import annotations

import pytest

from simulator.core.batch_shape import BatchShape
from simulator.cost.costmodel import CostModel
from simulator.cost.hardware import get_accelerator
from simulator.cost.kernels import wave_utilization
from simulator.cost.memory_plan import plan_memory
from simulator.cost.precision import QUANT_METHODS, resolve, supported
from simulator.scenario import scenario_from_dict
from tests.bench_helpers import load_diagnostic


def decode(batch: int, ctx: int) -> BatchShape:
    return BatchShape.from_lists([1] * batch, [ctx] * batch)


def prefill(tokens: int, ctx: int = 0) -> BatchShape:
    return BatchShape.from_lists([tokens], [ctx])


# ---------------------------------------------------------------- precision knobs

def test_kv_cache_dtype_is_its_own_knob() -> None:
    """fp8 weights no longer force an fp8 cache, nor int4 a 16-bit one: `auto` is the
    activation dtype, and any cache dtype can be asked for."""
    assert CostModel("llama-3-8b", "h100-sxm", dtype="fp8").kv_cache_dtype == "bf16"
    assert CostModel("llama-3-8b", "h100-sxm", dtype="fp8",
                     kv_cache_dtype="fp8").kv_cache_dtype == "fp8"
    assert CostModel("llama-3-8b", "a100-80gb-sxm", dtype="int4",
                     kv_cache_dtype="fp8").kv_cache_dtype == "fp8"
    bf = plan_memory("llama-3-8b", "h100-sxm", dtype="fp8")
    f8 = plan_memory("llama-3-8b", "h100-sxm", dtype="fp8", kv_cache_dtype="fp8")
    assert f8.num_gpu_blocks == pytest.approx(2 * bf.num_gpu_blocks, abs=1)


def test_scenario_carries_quantization_and_cache_dtype() -> None:
    sc = scenario_from_dict({"dtype": "int4", "quantization": {"method": "gptq", "group_size": 64},
                             "cache": {"kv_cache_dtype": "fp8"}})
    assert sc.quantization.method == "gptq" and sc.quantization.group_size == 64
    assert sc.cache.kv_cache_dtype == "fp8"
    with pytest.raises(ValueError, match=r"quantization.method.*no cost model.*'bnb'.*"
                                         + ", ".join(QUANT_METHODS)):
        scenario_from_dict({"dtype": "int4", "quantization": {"method": "bnb"}})
    with pytest.raises(ValueError, match="cache.kv_cache_dtype.*int4"):
        scenario_from_dict({"cache": {"kv_cache_dtype": "int4"}})


@pytest.mark.parametrize("hw, dtype, quant, supported", [
    ("a100-80gb-sxm", "fp8", None, "int8/w8a8"),  # FP8 on Ampere: no FP8 tensor cores
    ("a10g", "int8", "w8a8", "int4/awq"),  # A10G: no published INT8 tensor figure
    ("m4-max", "int4", "awq", "bf16"),  # Apple: no weight-only kernel profile
])
def test_a_precision_the_part_cannot_run_is_refused_naming_it(hw: str, dtype: str, quant,
                                                              supported: str) -> None:
    with pytest.raises(ValueError, match=rf"{hw} cannot run .*supports: .*{supported}"):
        CostModel("llama-3-8b", hw, dtype=dtype, quantization=quant)


def test_weight_only_on_a_part_with_no_fp32_figure_is_refused_before_pricing() -> None:
    # the dequantization runs at fp32_tflops: without it the part is refused by name, listing
    # what it can run, rather than failing inside the GEMM pricing
    part = {"base": "h100-sxm", "name": "h100-nofp32", "fp32_tflops": None}
    with pytest.raises(ValueError, match=r"h100-nofp32 cannot run int4/awq weights \(weight-only "
                                         r"kernels dequantize at the part's fp32_tflops"):
        CostModel("llama-3-8b", part, dtype="int4", quantization="awq")
    assert "int4/awq" in supported(get_accelerator("b200"))  # B200 has its FP32 figure


def test_method_and_dtype_must_agree() -> None:
    acc = get_accelerator("h100-sxm")
    with pytest.raises(ValueError, match="awq.*int4.*not dtype 'fp8'"):
        resolve(acc, "fp8", {"method": "awq"})
    with pytest.raises(ValueError, match="group_size"):
        resolve(acc, "int4", {"method": "awq", "group_size": 0})
    assert resolve(acc, "int4").method == "awq" and resolve(acc, "int8").compute == "int8"


def test_group_size_changes_the_bytes_read() -> None:
    acc = get_accelerator("a100-80gb-sxm")
    g32 = resolve(acc, "int4", {"method": "gptq", "group_size": 32}).matrix_weight_bytes
    g128 = resolve(acc, "int4", {"method": "gptq", "group_size": 128}).matrix_weight_bytes
    assert 0.5 < g128 < g32


# ---------------------------------------------------------------- physics of precision

def test_fp8_is_faster_than_bf16_only_where_compute_bound() -> None:
    """FP8 GEMMs have twice the peak but a lower efficiency: a long prefill gains, yet less
    than 2x; a decode step with a bf16 KV cache gains only its weight bytes."""
    bf, f8 = (CostModel("llama-3-8b", "h100-sxm", dtype=d) for d in ("bf16", "fp8"))
    pf = prefill(4096)
    assert f8.explain(pf).bound == "compute"
    speedup = bf.step_time(pf) / f8.step_time(pf)
    assert 1.2 < speedup < 2.0
    gemm_eff = {cm.dtype: cm.params.gemm_compute_efficiency for cm in (bf, f8)}
    assert gemm_eff["fp8"] < gemm_eff["bf16"]
    # a decode step whose time is mostly KV reads gains far less than a prefill
    dc = decode(64, 4096)
    assert bf.step_time(dc) / f8.step_time(dc) < speedup


def test_int4_decode_is_faster_at_batch_one_but_dequantization_grows_with_the_batch() -> None:
    """Marlin: near-4x less weight traffic at small batches; at large batches the GEMMs are
    compute bound and pay one dequantization pass per 64 rows, so W4A16 falls behind bf16."""
    bf = CostModel("llama-3-8b", "a100-80gb-sxm", dtype="bf16")
    w4 = CostModel("llama-3-8b", "a100-80gb-sxm", dtype="int4", quantization="awq")
    ratio = {b: bf.step_time(decode(b, 128)) / w4.step_time(decode(b, 128))
             for b in (1, 16, 64, 256)}
    assert ratio[1] > 2.0
    assert ratio[1] >= ratio[16] >= ratio[64] >= ratio[256]
    assert w4.step_time(prefill(4096)) > bf.step_time(prefill(4096))
    lin = w4._stages[0]["linear"]["mlp"]
    assert lin.seconds(65) - lin.seconds(64) > 10 * (lin.seconds(64) - lin.seconds(63))


def test_step_time_grows_with_the_batch() -> None:
    for dtype, hw in (("bf16", "h100-sxm"), ("fp8", "h100-sxm"), ("int4", "a10")):
        cm = CostModel("llama-3.1-8b", hw, dtype=dtype)
        times = [cm.step_time(decode(b, 1024)) for b in (1, 2, 8, 32, 128, 256)]
        assert times == sorted(times)
        times = [cm.step_time(prefill(n)) for n in (16, 128, 512, 2048, 8192)]
        assert times == sorted(times)


# ---------------------------------------------------------------- shape terms

def test_wave_quantization_steps_at_whole_waves() -> None:
    """One more tile than a whole wave costs a whole extra wave (132 SMs, 128x128 tiles)."""
    full = wave_utilization(128, 132 * 128, (128, 128), 132)
    over = wave_utilization(128, 133 * 128, (128, 128), 132)
    assert full == pytest.approx(1.0)
    assert over == pytest.approx(133 / 264)
    # the cost model sees the same step: a GEMM just past a wave takes about twice as long
    cm = CostModel("llama-3-70b", "h100-sxm", tp=4)
    lin = cm._stages[0]["linear"]["qkv_proj"]
    n = lin.gemms[0][0]  # 2,560 outputs per rank: 20 column tiles
    tiles_per_row_block = n // 128
    rows_one_wave = 128 * (132 // tiles_per_row_block)  # 6 row blocks = 120 tiles
    t_in = lin.seconds(rows_one_wave)
    t_over = lin.seconds(rows_one_wave + 128)  # 140 tiles: a second wave
    assert t_over / t_in > 1.5


def test_prefill_attention_efficiency_rises_with_the_keys_per_query() -> None:
    cm = CostModel("llama-3-8b", "h100-sxm")
    eff = []
    for n in (256, 1024, 8192):
        op = next(o for o in cm.explain(prefill(n)).ops if o.name == "attn_prefill")
        eff.append(op.efficiency)
        assert "kernels.yaml hopper.attn_prefill" in op.source
    assert eff == sorted(eff) and eff[-1] < 0.635 + 1e-9


def test_decode_attention_costs_a_fixed_share_per_request() -> None:
    """Same KV tokens in more, shorter requests read slower (per-request work)."""
    cm = CostModel("llama-3-8b", "h100-sxm")
    few = decode(8, 4096)
    many = decode(256, 128)
    a = next(o for o in cm.explain(few).ops if o.name == "attn_decode")
    b = next(o for o in cm.explain(many).ops if o.name == "attn_decode")
    assert b.efficiency < a.efficiency


def test_h200_equals_h100_when_compute_bound() -> None:
    """Same compute: a compute-bound prefill takes the same time; decode gains bandwidth."""
    h100, h200 = (CostModel("llama-3-8b", hw, dtype="fp8") for hw in ("h100-sxm", "h200-sxm"))
    pf = prefill(8192)
    assert h200.step_time(pf) == pytest.approx(h100.step_time(pf), rel=0.1)
    assert h200.step_time(decode(64, 2048)) < 0.8 * h100.step_time(decode(64, 2048))


# ---------------------------------------------------------------- explain

@pytest.mark.parametrize("hw, dtype, tp, pp", [("h100-sxm", "fp8", 2, 1), ("a10", "int4", 1, 1),
                                               ("a100-80gb-sxm", "bf16", 4, 2), ("cpu", "fp32", 1, 1)])
def test_explain_totals_equal_step_time_and_name_sources(hw: str, dtype: str, tp: int,
                                                         pp: int) -> None:
    model = "llama-3.1-70b" if tp * pp >= 4 else "llama-3.2-1b"
    cm = CostModel(model, hw, dtype=dtype, tp=tp, pp=pp)
    shape = BatchShape.from_lists([1] * 32 + [300], [900] * 32 + [200])
    br = cm.explain(shape)
    assert br.total_s == pytest.approx(cm.step_time(shape), rel=1e-9)
    for op in br.ops:
        if op.bound in ("compute", "memory"):
            assert op.efficiency is not None and 0 < op.efficiency <= 1
            assert op.source
    sources = cm.efficiency_sources()
    assert set(sources) >= {"gemm_compute_efficiency", "attn_compute_efficiency"}


def test_estimate_explain_prints_efficiencies_and_sources(capsys) -> None:
    from kvpd.cli import main

    rc = main(["estimate", "--model", "llama-3.1-8b", "--hardware", "h100-sxm", "--dtype", "fp8",
               "--prefill", "2048", "--explain"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "efficiency  source" in out and "fp8_relative" in out and "bound:" in out
    assert "GEMMs in fp8" in out


@pytest.mark.parametrize("row", [r for r in load_diagnostic("fp8_kv_decode").TABLES if r[-1]],
                         ids=lambda r: r[1])
def test_fp8_kv_price_matches_the_kernel_tables_it_comes_from(row) -> None:
    """kvpd's FP8 / 16-bit decode attention ratio is within 5% of each published kernel pair
    `fp8_kv_relative` was taken from (bench/diagnostics/fp8_kv_decode.py)."""
    diag = load_diagnostic("fp8_kv_decode")
    _, _, hw, model, batch, ctx, t16, t8, _ = row
    kvpd = (diag.attention_s(hw, model, "fp8", batch, ctx)
            / diag.attention_s(hw, model, "bf16", batch, ctx))
    assert kvpd == pytest.approx(t8 / t16, rel=0.05)


def _decode_attention_s(model: str, hw: str, kv: str, batch: int = 64, ctx: int = 8192) -> float:
    """The KV-read seconds of a decode step's attention (`memory_s`, what fp8_kv_relative
    prices), not the operator's time as the diagnostic's `attention_s`: MLA's absorbed decode
    is compute-bound, so its time would not show the cache's bytes."""
    cm = CostModel(model, hw, dtype="fp8", kv_cache_dtype=kv)
    ops = {o.name: o for o in cm.explain(decode(batch, ctx)).ops}
    return ops["attn_decode"].memory_s


def test_an_fp8_kv_cache_halves_the_bytes_but_not_the_decode_attention_time() -> None:
    """Hopper's and Blackwell's decode kernels convert every FP8 element (kernels.yaml
    attn_decode.fp8_kv_relative, 0.75): half the bytes take 2/3 of the BF16 time, on a
    grouped-query model. MLA's latent and parts without a measurement keep half the time."""
    for hw in ("h100-sxm", "b200"):
        bf, f8 = (_decode_attention_s("llama-3.1-70b", hw, kv) for kv in ("bf16", "fp8"))
        assert f8 / bf == pytest.approx(0.5 / 0.75, rel=0.03)
    bf, f8 = (_decode_attention_s("llama-3.1-70b", "mi300x", kv) for kv in ("bf16", "fp8"))
    assert f8 / bf == pytest.approx(0.5, rel=0.03)
    bf, f8 = (_decode_attention_s("deepseek-v3", "h200-sxm", kv) for kv in ("bf16", "fp8"))
    assert f8 / bf == pytest.approx(0.5, rel=0.03)
    # the step's fast path prices what the breakdown lists
    cm = CostModel("llama-3.1-70b", "h100-sxm", dtype="fp8", kv_cache_dtype="fp8")
    b = decode(64, 8192)
    assert cm.step_time(b) == pytest.approx(cm.explain(b).total_s, rel=1e-6)


def test_explain_names_each_operators_own_efficiency_after_prefill_attention() -> None:
    """In a step with prompt tokens, the operators listed after prefill attention (norms,
    activations and RoPE, the LM head, sampling) keep the weight-streaming efficiency they
    are priced at, not the attention's."""
    cm = CostModel("llama-3.1-70b", "h100-sxm", dtype="fp8", tp=2)
    ops = {o.name: o for o in cm.explain(prefill(5000)).ops}
    for name in ("norm_act_rope", "sampling"):
        assert "weight_stream_efficiency" in ops[name].source, ops[name].source
        assert ops[name].efficiency == pytest.approx(cm.params.gemm_memory_efficiency)
