"""The serving loop's host time between engine steps (`loop_overhead_s`, `kv_handoff_s`): what
a calibration measures from the serving probe, and what the simulator does with it."""

from __future__ import annotations

import re

import pytest

from simulator.calibrate.calibrated import overheads_at_speed
from simulator.calibrate.loop import (
    MIN_HANDOFF_STEPS,
    MIN_LAND_STEPS,
    MIN_LOOP_STEPS,
    encode_loop,
    fit_loop,
    format_loop,
    loop_params,
)
from simulator.calibrate.step_pricing import TimedStep
from simulator.core.batch_shape import BatchShape
from simulator.cost.params import CostParams
from simulator.run import run_scenario
from simulator.scenario import scenario_from_dict
from tests.sim_helpers import TINY_HF_CONFIG

CFG = TINY_HF_CONFIG


def _rows(loop_s: list, handoffs: list[int], tokens: list[int] | None = None,
          landings: list[int] | None = None, landed: list[int] | None = None) -> list[list[float]]:
    shape = BatchShape.from_lists([8], [0])
    n = len(handoffs)
    tokens, landings, landed = tokens or [0] * n, landings or [0] * n, landed or [0] * n
    return encode_loop([TimedStep(float(i), 0.01, shape, *row)
                        for i, row in enumerate(zip(loop_s, handoffs, tokens, landings, landed))])


def test_the_loop_and_the_hand_off_cost_are_read_from_the_steps_around_them():
    # colocated / decode: 0.3 ms before every step; prefill: 0.3 ms + 1 ms per hand-off step
    # + 0.4 ms per request and 2 us per prompt token the step before handed off; a heartbeat
    # or a burst of arrivals now and then (the fit is robust to them)
    n = MIN_LOOP_STEPS
    plain = [3e-4] * n
    plain[5] = 5e-3
    handoffs = [1 + i % 3 for i in range(3 * n)]
    tokens = [h * (20 + 37 * (i % 7)) for i, h in enumerate(handoffs)]
    prefill = [0.0] + [3e-4 + 1e-3 + 4e-4 * h + 2e-6 * t
                       for h, t in zip(handoffs[:-1], tokens[:-1])]
    prefill[9] += 8e-3
    # decode: every third step waits for 1-2 landings (0.5 ms each + 1 us per token written)
    landings = [(1 + i % 2) if i % 3 == 1 else 0 for i in range(3 * n)]
    landed = [k * (30 + 11 * (i % 5)) for i, k in enumerate(landings)]
    decode = [3e-4 + 5e-4 * k + 1e-6 * t for k, t in zip(landings, landed)]
    decode[4] += 6e-3
    probe = {"loop": {"colocated": _rows(plain, [0] * n),
                      "decode": _rows(decode, [0] * 3 * n, None, landings, landed),
                      "prefill": _rows(prefill, handoffs, tokens)}}
    got = fit_loop(probe)
    assert got["loop_overhead_s"] == pytest.approx(3e-4)
    assert got["kv_handoff_step_s"] == pytest.approx(1e-3, rel=0.02)
    assert got["kv_handoff_s"] == pytest.approx(4e-4, rel=0.02)
    assert got["kv_handoff_token_s"] == pytest.approx(2e-6, rel=0.02)
    assert got["kv_land_s"] == pytest.approx(5e-4, rel=0.02)
    assert got["kv_land_token_s"] == pytest.approx(1e-6, rel=0.02)
    assert got["num_steps"] == {"loop": n - 1 + 2 * n - 1, "handoff": 3 * n - 1,
                                "land": n} and not got["errors"]
    assert loop_params(got) == pytest.approx({"loop_overhead_s": 3e-4, "kv_handoff_step_s": 1e-3,
                                              "kv_handoff_s": 4e-4, "kv_handoff_token_s": 2e-6,
                                              "kv_land_s": 5e-4, "kv_land_token_s": 1e-6},
                                             rel=0.02)
    text = format_loop(got)
    assert "0.300 ms per step" in text and "ms per request + 2.00 us per prompt token (59 steps)" in text
    assert re.search(r"KV landing 0\.(499|500|501) ms per request \+ 1\.0\d us per token "
                     r"written \(20 steps\)", text)


def test_landings_are_measured_only_from_a_probe_that_logged_them():
    n = MIN_LOOP_STEPS + 1  # the first step has no loop time before it
    old_rows = [row[:3] for row in _rows([3e-4] * n, [0] * n)]  # a profile from before landings
    got = fit_loop({"loop": {"decode": old_rows}})
    assert got["loop_overhead_s"] == pytest.approx(3e-4) and "kv_land_s" not in got
    assert "did not log landings" in got["errors"]["kv_land_s"]
    few = [1 if i in (3, 7) else 0 for i in range(n + 2)]
    got = fit_loop({"loop": {"decode": _rows([3e-4] * (n + 2), [0] * (n + 2), None, few, few)}})
    assert got["errors"]["kv_land_s"] == (f"2 decode step(s) after a landing, need >= "
                                          f"{MIN_LAND_STEPS}")
    assert "kv_land_s" not in fit_loop({"loop": {"colocated": _rows([3e-4] * n, [0] * n)}})["errors"]


def test_steps_without_a_loop_time_are_skipped_and_too_few_measure_nothing():
    rows = _rows([None] * 30, [0] * 30)  # a log from before loop times were recorded
    assert rows[3] == [-1.0, 0, 0, 0, 0]
    got = fit_loop({"loop": {"colocated": rows}})
    assert "loop_overhead_s" not in got and "kv_handoff_s" not in got
    assert got["errors"]["loop_overhead_s"] == f"0 loop time(s), need >= {MIN_LOOP_STEPS}"
    assert "not measured: loop_overhead_s" in format_loop(got)
    got = fit_loop({"loop": {"colocated": _rows([2e-4] * 30, [0] * 30),
                             "prefill": _rows([1e-3] * 3, [1] * 3, [40] * 3)}})
    assert got["loop_overhead_s"] == pytest.approx(2e-4) and "kv_handoff_s" not in got
    assert got["errors"]["kv_handoff_s"].startswith(f"2 prefill step(s) after a hand-off, need >= "
                                                    f"{MIN_HANDOFF_STEPS}")
    old = fit_loop({"steps": {}})  # a probe from before loop times
    assert "no loop times" in old["error"] and loop_params(old) == {}
    assert format_loop(old).startswith("serving loop: not measured")


def test_a_malformed_loop_row_names_the_role_and_row():
    with pytest.raises(ValueError, match="prefill row 1 must be"):
        fit_loop({"loop": {"prefill": [[1e-3, 0, 0], [1e-3, 1]]}})
    with pytest.raises(ValueError, match="decode must be a list"):
        fit_loop({"loop": {"decode": {"a": 1}}})


def test_cost_params_keep_the_loop_terms_and_refuse_bad_values(tmp_path):
    p = CostParams(loop_overhead_s=2.5e-4, kv_handoff_step_s=2e-3, kv_handoff_s=8e-4,
                   kv_handoff_token_s=1e-6, device="cpu", model="m")
    path = tmp_path / "cal.yaml"
    p.save(str(path))
    back = CostParams.load(str(path))
    assert (back.loop_overhead_s, back.kv_handoff_step_s, back.kv_handoff_s,
            back.kv_handoff_token_s) == (2.5e-4, 2e-3, 8e-4, 1e-6)
    # a device twice as fast runs its loop twice as fast too (the host is the device on CPU)
    fast = overheads_at_speed(back, 2.0)
    assert (fast.loop_overhead_s, fast.kv_handoff_step_s, fast.kv_handoff_s,
            fast.kv_handoff_token_s) == pytest.approx((1.25e-4, 1e-3, 4e-4, 5e-7))
    with pytest.raises(ValueError, match="kv_handoff_s must be seconds >= 0"):
        CostParams(kv_handoff_s=-1e-3)
    assert "loop_overhead_s" not in CostParams().to_dict()["params"]  # off: not written


def _run(tmp_path, loop_s: float, handoff_s: float, pd: bool, handoff_token_s: float = 0.0,
         handoff_step_s: float = 0.0, serving_loop: bool = True, rate: float = 0.01,
         **land: float):
    cal = tmp_path / f"cal-{loop_s}-{handoff_s}-{handoff_token_s}-{handoff_step_s}-{land}.yaml"
    CostParams(step_overhead_s=2e-3, loop_overhead_s=loop_s, kv_handoff_s=handoff_s,
               kv_handoff_token_s=handoff_token_s, kv_handoff_step_s=handoff_step_s,
               device="cpu", model=None, **land).save(str(cal))
    hw = {"calibration": str(cal), **({} if serving_loop is True else {"serving_loop": serving_loop})}
    sc = {"model": CFG, "dtype": "fp32", "hardware": hw,
          "cache": {"num_gpu_blocks": 256}, "output": {"plots": False},
          "workload": {"synthetic": {
              "num_requests": 6, "arrival": {"process": "poisson", "rate": rate},
              "prompt_len": {"dist": "uniform", "min": 40, "max": 40},
              "output_len": {"dist": "uniform", "min": 10, "max": 10}}}}
    if pd:
        sc["cluster"] = {"pd": {"link": "ib-ndr", "first_token": "prefill"}}
    return run_scenario(scenario_from_dict(sc)).records


def test_every_simulated_step_carries_the_loop_and_prefill_steps_the_hand_offs(tmp_path):
    # requests ~100 s apart: each runs alone, 1 prompt step + 9 decode steps
    base = _run(tmp_path, 0.0, 0.0, pd=False)
    loop = _run(tmp_path, 1e-3, 5e-3, pd=False)  # colocated: no hand-offs
    assert loop["ttft_s"] - base["ttft_s"] == pytest.approx([1e-3] * 6, abs=1e-9)
    assert loop["e2e_s"] - base["e2e_s"] == pytest.approx([10e-3] * 6, abs=1e-9)
    # an engine driven in-process has no worker loop: `serving_loop: false` leaves it out
    inproc = _run(tmp_path, 1e-3, 5e-3, pd=False, serving_loop=False)
    assert inproc["e2e_s"] == pytest.approx(base["e2e_s"], abs=1e-12)
    with pytest.raises(ValueError, match="serving_loop must be true or false, got 'no'"):
        _run(tmp_path, 1e-3, 0.0, pd=False, serving_loop="no")
    pd_base = _run(tmp_path, 0.0, 0.0, pd=True)
    pd_loop = _run(tmp_path, 1e-3, 5e-3, pd=True, handoff_token_s=1e-4, handoff_step_s=3e-3)
    # the first token waits for its step's loop and the step's hand-off (3 ms + 5 ms + 40
    # tokens x 0.1 ms); the decode worker's 9 steps each carry the loop
    assert pd_loop["ttft_s"] - pd_base["ttft_s"] == pytest.approx([13e-3] * 6, abs=1e-9)
    assert pd_loop["e2e_s"] - pd_base["e2e_s"] == pytest.approx([22e-3] * 6, abs=1e-9)
    # the decode worker writes each landed prompt (2 ms + 40 tokens x 0.1 ms) before the
    # request's first decode step: every later token waits for it, the first does not
    pd_land = _run(tmp_path, 0.0, 0.0, pd=True, kv_land_s=2e-3, kv_land_token_s=1e-4)
    assert pd_land["ttft_s"] == pytest.approx(pd_base["ttft_s"], abs=1e-9)
    assert pd_land["e2e_s"] - pd_base["e2e_s"] == pytest.approx([6e-3] * 6, abs=1e-9)


def test_the_first_step_after_an_idle_spell_pays_the_wake_cost(tmp_path):
    # requests ~100 s apart: each later one finds the replica idle since the previous ended, and
    # only its prompt step (the first after the spell) pays 20 ms x (1 - exp(-idle / 0.25 s))
    base = _run(tmp_path, 0.0, 0.0, pd=False)
    woke = _run(tmp_path, 0.0, 0.0, pd=False, idle_wake_s=0.02, idle_wake_tau_s=0.25)
    idle = base["arrival_s"].copy()
    idle[1:] -= base["arrival_s"][:-1] + base["e2e_s"][:-1]
    assert idle[0] == 0.0 and (idle[1:] > 1.0).all()  # the first arrives at t = 0
    extra = [CostParams(idle_wake_s=0.02, idle_wake_tau_s=0.25).wake_extra_s(g) for g in idle]
    assert woke["ttft_s"] - base["ttft_s"] == pytest.approx(extra, abs=1e-9)
    assert woke["e2e_s"] - base["e2e_s"] == pytest.approx(extra, abs=1e-9)
    assert woke["tpot_s"] == pytest.approx(base["tpot_s"], abs=1e-12)
    # back-to-back load never idles long: a burst pays it once, on its first step
    burst = _run(tmp_path, 0.0, 0.0, pd=False, rate=1e6, idle_wake_s=0.02, idle_wake_tau_s=0.25)
    burst0 = _run(tmp_path, 0.0, 0.0, pd=False, rate=1e6)
    assert (burst["e2e_s"] - burst0["e2e_s"]).max() < 1e-3
    # a spell shorter than tau costs less than one longer, both less than idle_wake_s
    p = CostParams(idle_wake_s=0.02, idle_wake_tau_s=0.25)
    assert 0 < p.wake_extra_s(0.05) < p.wake_extra_s(0.5) < 0.02
    with pytest.raises(ValueError, match="idle_wake_s must be seconds >= 0"):
        CostParams(idle_wake_s=-1.0)


def test_speed_pricing_charges_the_wake_cost_as_the_simulator_does():
    # a probe's steps: back to back (0.3 ms loop gaps), then one after 0.5 s idle; priced with
    # the wake cost the simulator adds, the idle step does not read as a slower engine
    from simulator.calibrate.step_pricing import step_errors, wake_extras
    from simulator.cost.costmodel import CostModel

    p = CostParams(idle_wake_s=0.02, idle_wake_tau_s=0.25)
    cm = CostModel(CFG, "cpu", "fp32", params=p)
    shape = BatchShape.from_lists([8], [0])
    t = cm.step_time(shape)
    steps, start = [], 0.0
    for gap in (0.0, 3e-4, 3e-4, 0.5, 3e-4):
        start += gap
        idle = p.wake_extra_s(gap) if gap > 0.002 else 0.0
        steps.append(TimedStep(start, t + idle, shape))
        start += t + idle
    assert list(wake_extras(steps, p).values()) == pytest.approx([p.wake_extra_s(0.5)])
    assert step_errors(steps, cm)["total"] == pytest.approx(0.0, abs=1e-12)
    plain = CostModel(CFG, "cpu", "fp32", params=CostParams())
    assert step_errors(steps, plain)["total"] < -0.01  # without it: "slower than calibrated"


def test_loop_clock_counts_post_step_and_wake_up_work_not_idle_iterations(monkeypatch):
    import realexec.serving.engine_proc as engine_proc

    now = {"wall": 0.0, "cpu": 0.0}
    monkeypatch.setattr(engine_proc.time, "perf_counter", lambda: now["wall"])
    monkeypatch.setattr(engine_proc.time, "thread_time", lambda: now["cpu"])

    def at(wall_ms: float, cpu_ms: float) -> None:
        now["wall"], now["cpu"] = wall_ms / 1e3, cpu_ms / 1e3

    clock = engine_proc.LoopClock()
    assert clock.step_starting() == (None, None)  # a worker's first step
    at(0, 0)
    clock.step_ended()
    at(0.4, 0.3)  # straight on to the next step
    assert clock.step_starting() == pytest.approx((0.4e-3, 0.3e-3))
    at(10, 5)
    clock.step_ended()
    at(11, 5.9)  # 1 ms handing off and pushing, then the loop waits
    clock.waiting()
    at(500, 6)  # woken by an ack: idle work, then it waits again
    clock.woke()
    at(502, 8)
    clock.waiting()
    at(900, 8.1)  # a request arrives: 0.5 ms to read it and start the step
    clock.woke()
    at(900.5, 8.5)
    assert clock.step_starting() == pytest.approx((1.5e-3, 1.3e-3))
