"""Hardware and link catalogs: contents, sources, units, hypothetical parts, bad names."""

from __future__ import annotations

import re
from importlib import resources

import pytest

from simulator.cost.hardware import (
    GIB,
    get_accelerator,
    get_link,
    list_accelerators,
    list_links,
)

REQUIRED_ACCELERATORS = ["a10", "a10g", "l4", "l40s", "a100-40gb-sxm", "a100-80gb-sxm", "h100-sxm",
                         "h100-pcie", "h200-sxm", "b200", "gb200", "mi250x", "mi300x", "mi325x",
                         "m2-ultra", "m3-max", "m4-max", "cpu"]
REQUIRED_LINKS = ["nvlink3", "nvlink4", "nvlink5", "pcie4", "pcie5", "ib-hdr", "ib-ndr",
                  "ethernet-100g", "ethernet-400g", "loopback"]


def _catalog_text(name: str) -> str:
    return resources.files("simulator").joinpath("catalog", name).read_text()


def test_catalog_has_every_required_entry() -> None:
    assert set(REQUIRED_ACCELERATORS) <= set(list_accelerators())
    assert set(REQUIRED_LINKS) <= set(list_links())
    for name in list_accelerators():
        acc = get_accelerator(name)
        assert acc.bf16_tflops > 0 and acc.memory_bytes > 0 and acc.mem_bw_bytes_per_s > 0
        for kind in ("scale_up_link", "pcie", "scale_out"):
            if getattr(acc, kind):
                assert acc.link(kind).bandwidth_bytes_per_s > 0
    for name in list_links():
        link = get_link(name)
        assert link.bandwidth_bytes_per_s > 0 and link.latency_s >= 0


@pytest.mark.parametrize("filename", ["hardware.yaml", "links.yaml", "models.yaml"])
def test_every_number_in_the_catalogs_carries_a_source_comment(filename: str) -> None:
    number_line = re.compile(r"^\s+[a-z0-9_]+:\s*-?[0-9][0-9.eE+-]*\s*(#.*)?$")
    missing = [line for line in _catalog_text(filename).splitlines()
               if number_line.match(line) and "#" not in line]
    assert missing == []


def test_cpu_entry_is_marked_placeholder() -> None:
    cpu = get_accelerator("cpu")
    assert cpu.placeholder
    block = _catalog_text("hardware.yaml").split("\ncpu:")[1]
    assert block.count("PLACEHOLDER") >= 3
    assert not get_accelerator("h100-sxm").placeholder


def test_units_are_converted_from_datasheet_figures() -> None:
    h100 = get_accelerator("h100-sxm")
    assert h100.mem_bw_bytes_per_s == pytest.approx(3.35e12)  # H100 datasheet 3.35 TB/s
    assert h100.memory_bytes == 80 * GIB
    assert h100.peak_flops("bf16") == pytest.approx(989.4e12)  # dense BF16, H100 datasheet
    assert h100.peak_flops("fp8") == pytest.approx(2 * 989.4e12, rel=1e-3)
    assert h100.scale_up_link == "nvlink4" and h100.pcie == "pcie5" and h100.scale_out == "ib-ndr"
    nvl4 = get_link("nvlink4")
    assert nvl4.bandwidth_bytes_per_s == pytest.approx(450e9)  # 900 GB/s bidirectional / 2
    assert get_link("ib-ndr").bandwidth_bytes_per_s == pytest.approx(400e9 / 8)
    assert nvl4.transfer_time(450e9) == pytest.approx(1.0 + nvl4.latency_s)


def test_dtype_peaks_fall_back_sensibly() -> None:
    a100 = get_accelerator("a100-80gb-sxm")
    with pytest.raises(ValueError, match="no FP8 tensor units"):  # issue 30: no silent BF16
        a100.peak_flops("fp8")
    assert a100.peak_flops("int8") == pytest.approx(624e12)  # dense INT8, A100 datasheet
    assert a100.peak_flops("int4") == a100.peak_flops("bf16")  # W4A16 computes in 16 bits
    assert a100.peak_flops("fp32") < a100.peak_flops("bf16")
    with pytest.raises(ValueError, match="fp32"):  # a part with no FP32 figure
        get_accelerator({"base": "b200", "fp32_tflops": None}).peak_flops("fp32")
    with pytest.raises(ValueError, match="dtype"):
        a100.peak_flops("int3")


def test_names_are_exact_and_never_mapped_to_another_part() -> None:
    """Issue 30: case and `_` aside, a name is the catalog's or it is refused with suggestions;
    `a10` is the A10 (125 TFLOP/s), not the A10G (70)."""
    assert get_accelerator("H100_SXM").name == "h100-sxm"
    assert get_accelerator("a10").bf16_tflops == 125.0
    assert get_accelerator("a10g").bf16_tflops == 70.0
    for short, suggested in (("h100", "h100-sxm"), ("a100", "a100-80gb-sxm"), ("mps", None)):
        with pytest.raises(ValueError, match=f"unknown hardware '{short}'") as exc:
            get_accelerator(short)
        if suggested:
            assert suggested in str(exc.value)


def test_a10_against_its_datasheet() -> None:
    a10 = get_accelerator("a10")
    assert a10.memory_bytes == 24 * GIB and a10.mem_bw_bytes_per_s == pytest.approx(600e9)
    assert a10.peak_flops("int8") == pytest.approx(250e12) and a10.sm_count == 72
    assert a10.fp8_tflops is None and a10.arch == "ampere"


def test_rtx_pro_6000_is_its_own_blackwell_family() -> None:
    """The RTX PRO 6000 Blackwell (sm_120) is not a B200 (sm_100): its own kernel family, found
    by the device names CUDA reports for its 600 W boards, with FP4 and no scale-up link."""
    from simulator.cost.hardware import device_alias
    from simulator.cost.kernels import kernel_profile

    rtx = get_accelerator("rtx-pro-6000")
    assert rtx.arch == "blackwell_rtx" and rtx.sm_count == 188
    assert rtx.memory_bytes == 96 * GIB and rtx.mem_bw_bytes_per_s == pytest.approx(1.792e12)
    assert rtx.peak_flops("fp4") == pytest.approx(4 * rtx.peak_flops("bf16"))
    assert rtx.intra_node_link().name == "pcie5"
    for device in ("NVIDIA RTX PRO 6000 Blackwell Server Edition",
                   "NVIDIA RTX PRO 6000 Blackwell Workstation Edition"):
        assert device_alias(device) == "rtx-pro-6000"
    assert device_alias("NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition") is None
    assert kernel_profile(rtx).arch == "blackwell_rtx"
    with pytest.raises(ValueError, match=r"unknown hardware 'rtx-6000'.*rtx-pro-6000"):
        get_accelerator("rtx-6000")


def test_every_gpu_with_a_kernel_profile_has_its_sm_count_and_arch() -> None:
    from simulator.cost.kernels import list_archs

    for name in list_accelerators():
        acc = get_accelerator(name)
        if acc.vendor in ("nvidia", "amd"):
            assert acc.arch in list_archs(), name
        if acc.sm_count is not None:
            assert acc.sm_count >= 58


def test_memory_has_one_field_name_everywhere() -> None:
    """Issue 30: `memory_gib` in the catalog, inline parts and `kvpd hardware show`; the old
    name is refused with the new one."""
    assert get_accelerator({"base": "h100-sxm", "memory_gib": 96}).memory_bytes == 96 * GIB
    for bad in ({"base": "h100-sxm", "memory_gb": 96}, {"base": "h100-sxm", "memory_gb_scale": 2}):
        with pytest.raises(ValueError, match="'memory_gib"):
            get_accelerator(bad)


def test_parts_without_a_scale_up_link_use_pcie_then_loopback() -> None:
    assert get_accelerator("l4").intra_node_link().name == "pcie4"
    assert get_accelerator("m4-max").intra_node_link().name == "loopback"
    assert get_accelerator("h100-pcie").intra_node_link().name == "nvlink-bridge"


def test_unknown_names_list_close_matches() -> None:
    with pytest.raises(ValueError, match=r"unknown hardware 'h100-sx'.*h100-sxm"):
        get_accelerator("h100-sx")
    with pytest.raises(ValueError, match=r"unknown hardware 'mi300'.*mi300x"):
        get_accelerator("mi300")
    with pytest.raises(ValueError, match=r"unknown link 'nvlink'.*nvlink4"):
        get_link("nvlink")


def test_hypothetical_accelerator_scales_and_overrides_a_base() -> None:
    base = get_accelerator("h100-sxm")
    fast = get_accelerator({"base": "h100-sxm", "mem_bw_tbps_scale": 2})
    assert fast.mem_bw_bytes_per_s == pytest.approx(2 * base.mem_bw_bytes_per_s)
    assert fast.bf16_tflops == base.bf16_tflops and fast.name == "h100-sxm-custom"
    big = get_accelerator({"base": "h100-sxm", "name": "h100-192", "memory_gib": 192,
                           "scale_up_link": {"base": "nvlink4", "bandwidth_gb_s_scale": 2}})
    assert big.name == "h100-192" and big.memory_bytes == 192 * GIB
    assert big.link("scale_up_link").bandwidth_bytes_per_s == pytest.approx(900e9)
    scratch = get_accelerator({"name": "toy", "bf16_tflops": 100, "memory_gib": 8,
                               "mem_bw_tbps": 1, "scale_up_link": "pcie5"})
    assert scratch.fp8_tflops is None and scratch.intra_node_link().name == "pcie5"


@pytest.mark.parametrize("spec, message", [
    ({"base": "h100-sxm", "mem_bandwidth": 9}, "unknown field"),
    ({"base": "h100-sxm", "mem_bw_tbps_scale": -1}, "positive"),
    ({"base": "h100-sxm", "fp8_tflops": "fast"}, "fp8_tflops"),
    ({"base": "a100-80gb-sxm", "fp8_tflops_scale": 2}, "cannot scale fp8_tflops"),
    ({"name": "x", "bf16_tflops": 1, "memory_gib": 1}, "mem_bw_tbps"),
    ({"bf16_tflops": 1}, "name"),
    ({"base": "h100-sxm", "scale_up_link": "nvlink9"}, "unknown link"),
    ({"base": "h100-sxm", "matmul_efficiency": 1.5}, "matmul_efficiency"),
    # found by a fuzz of inline parts (each crashed with an OverflowError or TypeError)
    ({"base": "b200", "sm_count": float("inf")}, "'sm_count' must be a finite"),
    ({"base": "l4", "memory_gib": float("inf")}, "'memory_gib' must be a finite"),
    ({"base": "l4", "bf16_tflops": {}, "bf16_tflops_scale": 2}, "cannot scale bf16_tflops: {}"),
    ({"base": "l4", "fp8_tflops_scale": float("inf")}, "fp8_tflops_scale must be a positive"),
    ({"base": "l4", "name": 1}, "'name' must be a string, got 1"),
    ({"base": "l4", "arch": True}, "'arch' must be a string, got True"),
])
def test_bad_hypothetical_accelerators_are_rejected_with_the_field(spec: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        get_accelerator(spec)


def test_hypothetical_link() -> None:
    slow = get_link({"base": "ib-ndr", "latency_us": 5, "name": "ib-far"})
    assert slow.latency_s == pytest.approx(5e-6) and slow.name == "ib-far"
    assert slow.bandwidth_bytes_per_s == get_link("ib-ndr").bandwidth_bytes_per_s
    with pytest.raises(ValueError, match="bandwidth_gb_s"):
        get_link({"name": "x", "latency_us": 1})


def test_device_names_the_drivers_report_resolve_exactly():
    """`aliases` are the exact names CUDA / ROCm report (as in vLLM's fused_moe config files):
    each finds its own part, none is shared, and a bare family name is still refused."""
    from importlib import resources

    import yaml

    catalog = yaml.safe_load(resources.files("simulator").joinpath("catalog", "hardware.yaml").read_text())
    owner: dict[str, str] = {}
    for name, entry in catalog.items():
        for alias in entry.get("aliases") or ():
            assert alias.lower() not in owner, alias
            owner[alias.lower()] = name
            assert get_accelerator(alias).name == name
    assert get_accelerator("NVIDIA_H100_80GB_HBM3").name == "h100-sxm"
    assert get_accelerator("NVIDIA A10").name == "a10" and get_accelerator("NVIDIA A10G").name == "a10g"
    with pytest.raises(ValueError, match="unknown hardware 'h100'; did you mean"):
        get_accelerator("h100")


def test_blackwell_ultra_parts_carry_the_nvfp4_gain_and_the_int8_cut():
    """B300 / GB300 (Blackwell Ultra): 1.5x GB200's dense NVFP4, the same FP8 and BF16 peaks,
    a small fraction of its INT8 tensor rate, 288 GB-class memory at 8 TB/s; a W8A8 INT8 GEMM
    is priced at that cut rate rather than at Blackwell's."""
    gb200, gb300 = get_accelerator("gb200"), get_accelerator("gb300")
    b200, b300 = get_accelerator("b200"), get_accelerator("b300")
    assert gb300.peak_flops("fp4") == pytest.approx(1.5 * gb200.peak_flops("fp4"))
    assert gb300.peak_flops("fp8") == gb200.peak_flops("fp8")
    assert b300.peak_flops("bf16") == b200.peak_flops("bf16")
    assert b300.peak_flops("fp4") > 1.5 * b200.peak_flops("fp4") * 0.99
    for new, old in ((gb300, gb200), (b300, b200)):
        assert new.peak_flops("int8") < 0.05 * old.peak_flops("int8")
        assert new.memory_bytes > 1.45 * old.memory_bytes
        assert new.arch == "blackwell"


@pytest.mark.parametrize("name", ["nvlink4", "infinity-fabric-mi300", "pcie5"])
def test_link_show_writes_fields_an_inline_link_reads_back(name: str) -> None:
    """`kvpd hardware show <link> --json` names every field as the catalog and inline links do,
    so its output, given as an inline link, is the same link."""
    from kvpd.commands.hardware import _link_dict

    link = get_link(name)
    shown = _link_dict(link)
    again = get_link({k: v for k, v in shown.items()})
    assert again == link
