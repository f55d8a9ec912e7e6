"""Re-measure the serving loop's terms from a profile's serving probe and write a copy of a
calibration with them, for `bench/resimulate_validation.py --calibration`.

    python bench/refit_loop.py PROFILE.json CALIBRATION.yaml --out NEW.yaml
        [--no-serving-speed]

PROFILE.json: the `kvpd profile` metadata whose serving probe logged loop times (commit
5b5607b on). Probes of commit 5b5607b logged [loop_s, handoffs] per step without the prompt
tokens handed off; for those, a hand-off step's tokens are its prefill context when every
prompt in it completed (the only case a step's shape pins them), and other hand-off steps
are left out. Prints the terms (`simulator.calibrate.loop`) before writing.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from simulator.calibrate.loop import fit_loop, format_loop, loop_params
from simulator.calibrate.serving_speed import decode_steps
from simulator.cost.params import LOOP_FIELDS, CostParams


def upgraded_loop(probe: dict) -> dict:
    """The probe's `loop` rows as [loop_s, handoffs, handoff_tokens]; after a hand-off step
    whose tokens its shape cannot pin, the next step's loop time is dropped (-1)."""
    steps = decode_steps(probe)
    loop = {}
    for role, rows in probe["loop"].items():
        out, unpinned = [], False
        for row, step in zip(rows, steps[role]):
            loop_s = -1.0 if unpinned else row[0]
            if len(row) == 3:
                out.append([loop_s, *row[1:]])
                unpinned = False
                continue
            h, shape = row[1], step.shape
            unpinned = h > 0 and (h != shape.num_prefill_reqs or shape.num_decode_reqs > 0)
            out.append([loop_s, 0 if unpinned else h,
                        shape.prefill_context_tokens if h and not unpinned else 0])
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
    fit = fit_loop({"loop": upgraded_loop(probe)})
    print(format_loop(fit))
    params = CostParams.load(str(args.calibration))
    params = dataclasses.replace(params, **{**dict.fromkeys(LOOP_FIELDS, 0.0), **loop_params(fit)})
    params.extra["serving_loop"] = fit
    if args.no_serving_speed:
        params.extra.pop("serving_speed", None)
    params.save(str(args.out))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
