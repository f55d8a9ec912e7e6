"""`kvpd hardware list|show`: the accelerator and link catalogs."""

from __future__ import annotations

import argparse
import json


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("hardware", help="list or show accelerators and links")
    hsub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    lp = hsub.add_parser("list", help="list accelerators and links")
    lp.add_argument("--json", action="store_true")
    sp = hsub.add_parser("show", help="show one accelerator or link")
    sp.add_argument("name", help="accelerator or link name")
    sp.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


def _fmt(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def run(args: argparse.Namespace) -> int:
    from simulator.cost import hardware as hw
    if args.action == "list":
        accs = [hw.get_accelerator(n) for n in hw.list_accelerators()]
        links = [hw.get_link(n) for n in hw.list_links()]
        if args.json:
            print(json.dumps({"accelerators": [_acc_dict(a) for a in accs],
                              "links": [_link_dict(x) for x in links]}, indent=2))
            return 0
        print(f"{'accelerator':15s} {'BF16 TF':>8s} {'FP8 TF':>8s} {'FP4 TF':>8s} {'GiB':>5s} {'TB/s':>6s} "
              f"{'scale-up':23s} {'PCIe':11s} {'scale-out':14s} {'$/h':>6s}")
        for a in accs:
            print(f"{a.name:15s} {a.bf16_tflops:8.1f} {_fmt(a.fp8_tflops, '8.1f'):>8s} "
                  f"{_fmt(a.fp4_tflops, '8.1f'):>8s} "
                  f"{a.memory_bytes / 2**30:5.0f} {a.mem_bw_bytes_per_s / 1e12:6.3f} "
                  f"{a.scale_up_link or '-':23s} {a.pcie or '-':11s} {a.scale_out or '-':14s} "
                  f"{_fmt(a.price_per_hour, '6.2f'):>6s}"
                  + ("  (placeholder)" if a.placeholder else ""))
        print()
        print(f"{'link':23s} {'GB/s/dir':>9s} {'latency us':>10s}  description")
        for x in links:
            print(f"{x.name:23s} {x.bandwidth_bytes_per_s / 1e9:9.2f} {x.latency_s * 1e6:10.1f}"
                  f"  {x.description}")
        return 0
    name = args.name
    if name.strip().lower() in hw.list_links():
        link = hw.get_link(name)
        print(json.dumps(_link_dict(link), indent=2) if args.json else
              "\n".join(f"{k:28s} {v}" for k, v in _link_dict(link).items()))
        return 0
    acc = hw.get_accelerator(name)
    d = _acc_dict(acc)
    if args.json:
        print(json.dumps(d, indent=2))
        return 0
    for k, v in d.items():
        if k != "links":
            print(f"{k:22s} {v}")
    for kind, link in d["links"].items():
        if link:
            print(f"{kind:22s} {link['name']}: {link['bandwidth_gb_s']:.2f} GB/s per direction, "
                  f"{link['latency_us']:.1f} us")
    return 0


def _link_dict(x) -> dict:
    """One link with the field names of the catalog (the all-reduce fits and mesh only where
    the link has them)."""
    d = {"name": x.name, "bandwidth_gb_s": x.bandwidth_bytes_per_s / 1e9,
         "latency_us": x.latency_s * 1e6}
    if x.allreduce_call_s is not None:
        d.update(allreduce_call_us=x.allreduce_call_s * 1e6, allreduce_rank_us=x.allreduce_rank_s * 1e6,
                 allreduce_efficiency=x.allreduce_efficiency)
    if x.mesh_links:
        d["mesh_links"] = x.mesh_links
    if x.large_allreduce_call_s is not None:
        d.update(large_allreduce_call_us=x.large_allreduce_call_s * 1e6,
                 large_allreduce_nvls_gb_s=x.large_allreduce_nvls_bytes_per_s / 1e9,
                 large_allreduce_nvls_min_tp=x.large_allreduce_nvls_min_tp,
                 large_allreduce_ring_gb_s=x.large_allreduce_ring_bytes_per_s / 1e9)
    d["description"] = x.description
    return d


def _acc_dict(a) -> dict:
    """One accelerator with the field names of the catalog and of inline parts."""
    from simulator.cost.precision import supported

    links = {k: (_link_dict(a.link(k)) if getattr(a, k) else None)
             for k in ("scale_up_link", "pcie", "scale_out")}
    return {"name": a.name, "description": a.description, "vendor": a.vendor,
            "arch": a.arch or None, "bf16_tflops": a.bf16_tflops, "fp8_tflops": a.fp8_tflops,
            "fp4_tflops": a.fp4_tflops,
            "int8_tops": a.int8_tops, "fp32_tflops": a.fp32_tflops,
            "memory_gib": a.memory_bytes / 2**30, "mem_bw_tbps": a.mem_bw_bytes_per_s / 1e12,
            "sm_count": a.sm_count, "price_per_hour": a.price_per_hour,
            "matmul_efficiency": a.matmul_efficiency, "placeholder": a.placeholder,
            "supports": supported(a), "links": links}
