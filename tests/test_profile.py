"""`kvpd profile`: the grid's steps have the shapes asked for, every point is repeated, the
files carry the facts calibration needs, and a profile feeds `kvpd calibrate`."""

from __future__ import annotations

import dataclasses
import json
import time

import pytest
import torch

from kvpd.cli import main as kvpd_main
from realexec.fidelity.profile.facts import (
    catalog_device,
    cpu_available,
    memory_bandwidth_share,
    model_identity,
    sched_times,
)
from realexec.fidelity.profile.profiler import (
    GRID_PRESETS,
    ProfileGrid,
    Profiler,
    grid_preset,
    scatter_free_blocks,
)
from simulator.calibrate.profile_io import read_profile
from simulator.core.block_pool import BlockPool
from simulator.cost.params import CostParams

GRID = ProfileGrid(prefill_lens=(8, 24), chunks=((32, 16),), decode_batches=(1, 3),
                   decode_contexts=(8, 40), mixed_batches=(3,), mixed_contexts=(40,),
                   mixed_prompts=(5, 12), ragged=((4, 20),), swap_blocks=(1, 3),
                   transfer_tokens=(16,), warmup=1,
                   repeats=2)


@pytest.fixture(scope="module")
def rows():
    torch.set_num_threads(1)
    prof = Profiler("tiny-llama", grid=GRID, seed=1)
    return prof, prof.run(("steps", "swap"))


def test_step_points_have_the_shapes_of_the_grid(rows):
    prof, got = rows
    by_kind = {}
    for r in got:
        by_kind.setdefault(r.kind, []).append(r)
    assert sorted((r.shape.num_prefill_tokens, r.shape.prefill_context_tokens)
                  for r in by_kind["prefill"]) == [(8, 8), (24, 24)]
    (chunk,) = by_kind["chunk"]
    assert (chunk.shape.num_prefill_tokens, chunk.shape.prefill_context_tokens) == (16, 48)
    decodes = {(r.shape.num_decode_reqs, r.shape.decode_context_tokens) for r in by_kind["decode"]}
    # every context exactly C; the ragged group spreads [5, 15, 25, 35] around 20
    assert decodes == {(1, 8), (3, 24), (1, 40), (3, 120), (4, 80)}
    assert max(r.shape.max_context for r in by_kind["decode"] if r.shape.num_reqs == 4) == 35
    mixed = sorted((r.shape.num_decode_reqs, r.shape.num_prefill_tokens) for r in by_kind["mixed"])
    assert mixed == [(3, 5), (3, 12)]
    for r in by_kind["mixed"]:
        assert r.shape.num_prefill_reqs == 1 and r.shape.max_context >= 40
    for r in got:
        assert len(r.times_s) == GRID.repeats and min(r.times_s) > 0
    assert {r.num_blocks for r in by_kind["swap_out"]} == {1, 3}
    assert by_kind["swap_in"][1].num_bytes == 3 * prof.llm.kv_cache.spec.bytes_per_block
    assert not prof.llm.has_unfinished_requests()  # every grid point cleaned up after itself


def test_point_order_is_seeded(rows):
    prof, _ = rows
    other = Profiler("tiny-llama", grid=GRID, seed=1)
    assert [p.args for p in other.step_points()] == [p.args for p in prof.step_points()]


def test_facts_and_identity():
    assert catalog_device(torch.device("cpu")) == "cpu"
    cfg, name = model_identity("tiny-llama")
    assert name == "tiny-llama" and cfg["_name_or_path"] == "tiny-llama"
    cfg2, name2 = model_identity({**cfg, "_name_or_path": "mine"})
    assert name2 == "mine"
    with pytest.raises(ValueError, match="not a built-in name"):
        model_identity("no-such-model")
    a = sched_times()
    if a is not None:  # Linux
        assert cpu_available(a, (a[0] + 1.0, a[1] + 1.0)) == pytest.approx(0.5)


def test_grid_checks():
    with pytest.raises(ValueError, match="unknown profile grid 'huge'"):
        grid_preset("huge")
    assert grid_preset("quick", repeats=7).repeats == 7
    assert set(GRID_PRESETS) >= {"default", "quick", "gpu"}
    with pytest.raises(ValueError, match=r"prefill_lens point 600 needs 600 tokens of context but the model holds 512"):
        Profiler("tiny-llama", grid=dataclasses.replace(GRID, prefill_lens=(600,)))


def test_cli_profile_then_calibrate(tmp_path, capsys):
    out = tmp_path / "prof" / "profile.csv"
    assert kvpd_main(["profile", "--model", "tiny-llama", "--grid", "quick", "--threads", "1",
                      "--repeats", "2", "--serving-requests", "6", "--out", str(out)]) == 0
    prof = read_profile(out)
    meta = json.loads(out.with_suffix(".json").read_text())
    assert meta["device"] == "cpu" and meta["model"] == "tiny-llama"
    assert meta["kv_block_order"] == "scattered (seeded shuffle)"
    assert meta["device_facts"]["torch_threads"] == 1 and "versions" in meta["device_facts"]
    assert meta["device_facts"]["mem_bw_share"] > 0 and meta["device_facts"]["mem_bw_gb_s"] > 0
    assert len(meta["device_facts"]["host_contention"]["points"]) >= 2
    kinds = set(prof.columns["kind"])
    assert kinds == {"prefill", "chunk", "decode", "mixed", "linear", "lm_head", "swap_out",
                     "swap_in", "kv_transfer"}
    lin = prof.mask("linear")
    assert sorted(prof.columns["num_tokens"][lin]) == list(range(1, 9))
    assert sorted(prof.columns["num_reqs"][prof.mask("lm_head")]) == list(range(1, 9))
    t = prof.columns["median_s"][prof.mask("kv_transfer")]
    assert (t > 0).all()
    cal = tmp_path / "cal.yaml"
    # 2 repeats of a tiny model's quick grid: the plumbing is checked, not the fit's quality,
    # which the noisy-fit gate may refuse on a busy machine
    assert kvpd_main(["calibrate", str(out), "--out", str(cal), "--no-plot", "--accept-noisy"]) == 0
    printed = capsys.readouterr().out
    # the profiled model's HF config rides along, for `kvpd validate` to build it again
    assert CostParams.load(str(cal)).extra["model_config"] == meta["model_config"]
    assert "link kv_transfer" in printed and "host sharing: memory share" in printed
    assert "size factors, linears by tokens 1-8" in printed
    # the serving probe ran through a real engine and a real 1P1D pair; 6 requests give
    # the colocated engine enough steps for a speed, not the prefill worker
    probe = meta["serving_probe"]
    assert set(probe["steps"]) == {"colocated", "prefill", "decode"} and not probe["errors"]
    assert len(probe["steps"]["prefill"]) >= 1 and len(probe["steps"]["colocated"]) >= 20
    speed = CostParams.load(str(cal)).extra["serving_speed"]
    assert speed["colocated"] > 0 and "prefill" not in speed
    assert "need >= 20" in speed["errors"]["prefill"]
    assert "serving speed (the serving probe's steps, predicted / measured): colocated" in printed
    # and the serving loop's host time between steps: per step from every role, per KV
    # hand-off from the prefill worker (6 prompts are too few steps after a hand-off)
    assert [len(r) for r in probe["loop"].values()] == [len(r) for r in probe["steps"].values()]
    loaded = CostParams.load(str(cal))
    assert 0 < loaded.loop_overhead_s < 0.05
    assert loaded.extra["serving_loop"]["loop_overhead_s"] == loaded.loop_overhead_s
    assert "serving loop (host time between steps): " in printed
    factors = CostParams.load(str(cal)).linear_token_factors
    # every size timed (1-8 rows on the quick grid), relative to their median
    assert len(factors) == 8 and sorted(factors)[3] <= 1.0 <= sorted(factors)[4]
    # and the first step after an idle spell, timed against one run back to back
    wake = json.loads((out.with_suffix(".json")).read_text())["device_facts"]["idle_wake"]
    assert wake["gaps_s"][0] == 0.0 and len(wake["median_s"]) == len(wake["gaps_s"])
    assert "idle wake: " in printed
    assert kvpd_main(["profile", "--model", "tiny-llama", "--threads", "0", "--out", str(out)]) == 2
    assert "threads must be >= 1" in capsys.readouterr().err


def test_memory_bandwidth_share_of_two_processes():
    threads = torch.get_num_threads()
    m = memory_bandwidth_share(processes=2, seconds=0.3, nbytes=64 << 20)
    assert m["mem_bw_gb_s"] > 0.1 and m["mem_bw_share_processes"] == 2
    # two streams on one host get at most (about) what one gets alone
    assert 0.05 < m["mem_bw_share"] < 1.3
    assert torch.get_num_threads() == threads


def test_steps_beside_a_busy_neighbour(rows):
    from realexec.fidelity.profile.contention import MODES, contention_points, host_contention

    prof, _ = rows
    # prompts of 16..512 tokens from the grid, the smallest and largest decode batch <= 16
    assert contention_points(GRID) == [("prefill", (24,)), ("decode", (1, 40, ())),
                                       ("decode", (3, 40, ()))]
    res = host_contention(prof, repeats=2, warmup=0, nbytes=32 << 20)
    assert res["neighbour_modes"] == list(MODES) and res["repeats"] == 2
    got = [(p["kind"], p["shape"]["num_tokens"], p["shape"]["num_decode_reqs"]) for p in res["points"]]
    assert got == [("prefill", 24, 0), ("decode", 1, 1), ("decode", 3, 3)]
    for p in res["points"]:
        assert all(p[f"{m}_s"] > 0 for m in MODES)
    assert not prof.llm.has_unfinished_requests()  # every timed request was drained


def _ids(pool: BlockPool, n: int) -> list[int]:
    blocks = pool.get_new_blocks(n)
    pool.free_blocks(blocks)
    return [b.block_id for b in blocks]


def test_scatter_free_blocks_is_a_seeded_permutation_of_the_free_pool():
    import random

    pools = [BlockPool(64, enable_caching=False) for _ in range(3)]
    held = pools[0].get_new_blocks(4)  # blocks in use stay in use
    scatter_free_blocks(pools[0], random.Random(5))
    scatter_free_blocks(pools[1], random.Random(5))
    scatter_free_blocks(pools[2], random.Random(6))
    assert pools[0].num_free_blocks == 60 and all(b.ref_cnt == 1 for b in held)
    order = _ids(pools[0], 60)
    assert sorted(order) == list(range(4, 64)) and order != sorted(order)
    assert _ids(pools[1], 64) != _ids(pools[2], 64)  # the seed sets the order
    assert _ids(BlockPool(64), 8) == list(range(8))  # a fresh pool: id order


def test_profiler_hands_out_scattered_blocks_unless_asked_for_id_order():
    def first_blocks(grid: ProfileGrid) -> list[int]:
        prof = Profiler("tiny-llama", grid=grid, seed=3)
        return _ids(prof.llm.kv_cache_manager.block_pool, 6)

    scattered = first_blocks(GRID)
    assert scattered == first_blocks(GRID) and scattered != list(range(6))
    assert first_blocks(dataclasses.replace(GRID, scatter_blocks=False)) == list(range(6))


def test_cli_blocks_in_id_order_reaches_the_grid(monkeypatch, tmp_path):
    import realexec.fidelity.profile.device_profile as profile

    grids = []
    monkeypatch.setattr(profile, "profile_device",
                        lambda out, *a, **kw: grids.append(a[4]) or tmp_path / "p.csv")
    assert kvpd_main(["profile", "--model", "tiny-llama", "--blocks-in-id-order"]) == 0
    assert kvpd_main(["profile", "--model", "tiny-llama", "--grid", "quick"]) == 0
    assert [g.scatter_blocks for g in grids] == [False, True]


def test_fresh_shape_check_compares_never_run_shapes_with_repeated_ones(rows):
    from realexec.fidelity.profile.fresh_shapes import fresh_points, fresh_shape_check

    prof, _ = rows
    check = fresh_shape_check(prof, repeats=2)
    assert [(p["kind"], p["batch"], p["tokens"]) for p in check["points"]] == fresh_points(GRID)
    assert fresh_points(GRID) == [("prefill", 1, 24), ("decode", 1, 40), ("decode", 3, 40)]
    for p in check["points"]:
        assert p["repeated_s"] > 0 and p["fresh_s"] > 0
    assert check["ratio"] == pytest.approx(sorted(p["ratio"] for p in check["points"])[1])
    assert not prof.llm.has_unfinished_requests()


def test_fresh_shape_check_sees_a_per_shape_setup_cost(rows, monkeypatch):
    """An engine that pays 80 ms the first time it meets a step shape (as cuDNN attention
    building its graph on a GPU): repeated grid shapes are free of it, fresh ones are not.
    (80 ms, several times a tiny model's step even on a loaded machine, so the ratio is not
    decided by how busy the machine is.)"""
    from realexec.fidelity.profile.fresh_shapes import fresh_shape_check

    prof, _ = rows
    runner = prof.llm.engine.executor
    execute, seen = runner.execute, set()

    def execute_with_setup(output):
        key = (output.shape.num_reqs, output.shape.num_tokens, output.shape.max_context)
        if output.reqs and key not in seen:
            seen.add(key)
            time.sleep(0.08)
        return execute(output)

    monkeypatch.setattr(runner, "execute", execute_with_setup)
    check = fresh_shape_check(prof, repeats=3)  # the first repeated step pays it, once
    assert check["ratio"] > 3 and check["warn"]
    assert all(p["ratio"] > 3 for p in check["points"])


@pytest.mark.parametrize(("args", "message"), [
    (["--out", "{file}/profile.csv"], "is a file, so no folder can be made there"),
    (["--out", "{tmp}/prof/profile.txt"], "a profile is NAME.csv (+ NAME.json) or an existing folder"),
    (["--out", "{tmp}"], None),  # an existing folder is fine: profile.csv goes in it
    (["--model", "qwen2.5-7b"], "not a built-in name"),
    (["--hardware", "no-such-gpu"], "no-such-gpu"),
    (["--repeats", "0"], "--repeats must be >= 1, got 0"),
    (["--serving-requests", "-1"], "--serving-requests must be >= 0"),
])
def test_profile_refuses_bad_arguments_before_it_measures(monkeypatch, tmp_path, capsys, args,
                                                          message):
    """A bad --out (or any bad argument) is refused at once, not after the profile ran."""
    import realexec.fidelity.profile.device_profile as profile

    ran = []
    monkeypatch.setattr(profile, "profile_device",
                        lambda out, *a, **kw: ran.append(out) or tmp_path / "p.csv")
    (tmp_path / "file").write_text("in the way")
    argv = [a.format(tmp=tmp_path, file=tmp_path / "file") for a in args]
    rc = kvpd_main(["profile", "--model", "tiny-llama", "--grid", "quick", *argv])
    if message is None:
        assert rc == 0 and len(ran) == 1
        return
    assert rc == 2 and not ran
    assert message in capsys.readouterr().err
