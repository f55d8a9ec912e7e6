"""The cost model's error on real steps, per decode batch size, for one or more calibrations.

    python bench/diagnostics/step_errors_by_size.py --calibration A.yaml [--calibration B.yaml]
        [--model llama-50m] [--dtype fp32] STEPS.jsonl [...]

STEPS.jsonl: step logs a real run wrote (`kvpd validate` keeps them under
`runs/colocated-steps/` and `runs/pd-steps/`; serving workers with `step_log_dir`). Prints,
for each calibration, the error (total predicted / total measured - 1) over all steps and by
kind (`simulator.calibrate.step_pricing.step_kind`), then per exact size of all-decode steps, side
by side: where one calibration's error jumps between neighbouring sizes and the other's
does not, the size effect is what it models (see `CostParams.linear_token_factors`).

2026-11-29, the 45,333 colocated steps of a full `bench/validate_cpu.py` run, priced by
one later profile's calibration without and with its size factors: spread (std) of the
per-size errors 3.2% and 2.0%; decode batches of 5, 7, 9, 11 requests -10.3, -7.9, -6.8,
-8.8% without, -7.0, -4.0, -5.7, -5.5% with (the level, about -3%, is the machine's drift
between the run and the profile). The PD decode worker's 52,454 steps: 2.3% and 1.7%.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from realexec.fidelity.profile.facts import model_identity
from realexec.serving.step_log import read_step_log
from simulator.calibrate.calibrated import calibrated_cost_model
from simulator.calibrate.step_pricing import STEP_KINDS, step_errors, step_kind


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("logs", nargs="+", type=Path)
    ap.add_argument("--calibration", action="append", required=True)
    ap.add_argument("--model", default="llama-50m")
    ap.add_argument("--dtype", default="fp32")
    ap.add_argument("--min-steps", type=int, default=5, help="sizes with fewer steps are skipped")
    args = ap.parse_args()
    cfg, name = model_identity(args.model)
    cms = [calibrated_cost_model(c, cfg, name, args.dtype) for c in args.calibration]
    steps = [s for log in args.logs for s in read_step_log(log)[0]
             if s.shape.num_tokens > 0 and s.duration_s > 0]
    print(f"{len(steps)} steps from {len(args.logs)} log(s)")
    for i, (path, cm) in enumerate(zip(args.calibration, cms)):
        e = step_errors(steps, cm)
        kinds = "  ".join(f"{k} {e['by_kind'][k]['total']:+.1%}" for k in STEP_KINDS
                          if k in e["by_kind"])
        print(f"[{i}] {path}: all {e['total']:+.1%} | {kinds}")
    decodes = [s for s in steps if step_kind(s.shape).startswith("decode")]
    real = np.array([s.duration_s for s in decodes])
    size = np.array([s.shape.num_decode_reqs for s in decodes])
    pred = [np.array([cm.step_time(s.shape) for s in decodes]) for cm in cms]
    print(f"\n{'decodes':>7s} {'steps':>6s} {'measured ms':>12s} "
          + " ".join(f"{f'[{i}] error':>10s}" for i in range(len(cms))))
    for n in sorted(set(size.tolist())):
        m = size == n
        if m.sum() < args.min_steps:
            continue
        errs = " ".join(f"{p[m].sum() / real[m].sum() - 1:+10.1%}" for p in pred)
        print(f"{n:7d} {int(m.sum()):6d} {np.median(real[m]) * 1e3:12.1f} {errs}")
    spread = [float(np.std([p[size == n].sum() / real[size == n].sum() - 1
                            for n in set(size.tolist()) if (size == n).sum() >= args.min_steps]))
              for p in pred]
    print("spread of the per-size errors (std): "
          + ", ".join(f"[{i}] {s:.1%}" for i, s in enumerate(spread)))


if __name__ == "__main__":
    main()
