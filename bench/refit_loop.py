"""Re-measure the serving loop's terms from a profile's serving probe and write a copy of a
calibration with them, for `bench/resimulate_validation.py --calibration`.

    python bench/refit_loop.py PROFILE.json CALIBRATION.yaml --out NEW.yaml
        [--no-serving-speed]

PROFILE.json: the `kvpd profile` metadata whose serving probe logged loop times (commit
5b5607b on). Probes of commit 5b5607b logged [loop_s, handoffs] per step without the prompt
tokens handed off; for those, a hand-off step's tokens are its prefill context when every
prompt in it completed (the only case a step's shape pins them), and other hand-off steps
are left out. Prints the terms (`simulator.calibrate_loop`) before writing.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from simulator.calibrate_loop import fit_loop, format_loop, loop_params
from simulator.calibrate_serving import decode_steps
from simulator.costparams import LOOP_FIELDS, CostParams


def upgraded_loop(probe: dict) -> dict:
    """The probe's `loop` rows as [loop_s, handoffs, handoff_tokens]."""
    steps = decode_steps(probe)
    loop = {}
    for role, rows in probe["loop"].items():
        out = []
        for row, step in zip(rows, steps[role]):
            if len(row) == 3:
                out.append(row)
                continue
            loop_s, h = row
            shape = step.shape
            known = h == 0 or (h == shape.num_prefill_reqs and not shape.num_decode_reqs)
            out.append([loop_s, h, shape.prefill_context_tokens if h else 0] if known
                       else [loop_s, -1, 0])  # marks the next step's loop time as unusable
        loop[role] = out
    return loop


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("profile", type=Path)
    ap.add_argument("calibration", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--no-serving-speed", action="store_true",
                    help="drop the calibration's serving_speed (as kvpd validate does by default)")
    args = ap.parse_args()
    probe = json.loads(args.profile.read_text())["serving_probe"]
    loop = upgraded_loop(probe)
    # a step after an unknown hand-off: drop its loop time (its cost is not pinned)
    for role, rows in loop.items():
        for i in range(1, len(rows)):
            if rows[i - 1][1] < 0:
                rows[i] = [-1.0, max(rows[i][1], 0), rows[i][2]]
        loop[role] = [[s, max(h, 0), t] for s, h, t in rows]
    fit = fit_loop({"loop": loop})
    print(format_loop(fit))
    params = CostParams.load(str(args.calibration))
    for name in LOOP_FIELDS:
        setattr(params, name, 0.0)
    for name, value in loop_params(fit).items():
        setattr(params, name, value)
    params.extra["serving_loop"] = fit
    if args.no_serving_speed:
        params.extra.pop("serving_speed", None)
    params.save(str(args.out))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
