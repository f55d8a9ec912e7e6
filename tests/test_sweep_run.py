"""Running sweeps: the process pool gives the same numbers as serial runs and as each
point simulated alone; resuming skips finished points; failures are recorded, not fatal."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from kvpd.cli import main
from simulator.plan.sweep import POINTS, read_points, run_sweep
from simulator.plan.sweep_spec import load_sweep
from simulator.plan.table import read_table
from simulator.plan.worker import WALL_CLOCK_METRICS, flatten_summary
from simulator.run import run_scenario
from simulator.scenario import load_scenario

QUICKSTART = Path(__file__).resolve().parents[1] / "scenarios" / "quickstart.yaml"
# 80 requests of the Azure conversation trace: each point simulates in well under a second.
SMALL = {"workload.limit": 80}
GRID = {"scheduler.max_num_batched_tokens": [512, 8192], "workload.target_rate": [4.0, 16.0]}


def write_sweep(tmp_path: Path, axes: dict, name: str = "sweep") -> Path:
    f = tmp_path / f"{name}.yaml"
    f.write_text(yaml.safe_dump({"name": name, "base": str(QUICKSTART), "set": SMALL,
                                 "axes": axes}))
    return f


def same_numbers(a: dict, b: dict) -> list[str]:
    """Keys whose values differ (wall-clock metrics excepted; NaN equals NaN)."""
    diff = []
    for k in set(a) | set(b):
        if k in WALL_CLOCK_METRICS:
            continue
        x, y = a.get(k), b.get(k)
        if isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y):
            continue
        if x != y:
            diff.append(k)
    return diff


@pytest.fixture(scope="module")
def pool_and_serial(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sweep")
    spec = load_sweep(write_sweep(tmp, GRID))
    pool = run_sweep(spec, tmp / "pool", backend="process", workers=2, progress=False)
    serial = run_sweep(spec, tmp / "serial", backend="serial", progress=False)
    return spec, pool, serial


def test_pool_serial_and_alone_give_the_same_numbers(pool_and_serial):
    spec, pool, serial = pool_and_serial
    assert pool.ran == serial.ran == 4 and pool.failed == 0
    assert [r["point_id"] for r in pool.rows] == [r["point_id"] for r in serial.rows]
    for a, b in zip(pool.rows, serial.rows):
        assert same_numbers(a, b) == ["point_wall_s"] or same_numbers(a, b) == []
    # each point alone, through the ordinary scenario path (time series on)
    for row, point in zip(pool.rows, spec.points):
        sets = [f"{k}={v}" for k, v in {**SMALL, **point.overrides}.items()]
        alone = flatten_summary(run_scenario(load_scenario(QUICKSTART, sets)).summary)
        cols = {k: row[k] for k in alone if k in row}
        assert same_numbers(cols, alone) == []
    # the axes changed the results
    assert len({r["ttft_s.p90"] for r in pool.rows}) == 4


def test_table_has_axes_status_and_flat_metrics(pool_and_serial):
    spec, pool, _ = pool_and_serial
    cols = read_table(pool.out_dir / "results.parquet")
    assert cols["point"] == [0, 1, 2, 3]
    assert cols["scheduler.max_num_batched_tokens"] == [512, 512, 8192, 8192]
    assert cols["workload.target_rate"] == [4.0, 16.0, 4.0, 16.0]
    assert cols["status"] == ["ok"] * 4
    for key in ("ttft_s.p90", "tpot_s.p99", "slo.goodput_rps", "throughput.output_tokens_per_s",
                "requests.total", "cost.usd_per_hour", "cost.gpus"):
        assert key in cols, key
    assert cols["requests.total"] == [80] * 4
    csv = read_table(pool.out_dir / "results.csv")
    assert csv["ttft_s.p90"] == pytest.approx(cols["ttft_s.p90"])
    meta = json.loads((pool.out_dir / "sweep.json").read_text())
    assert meta["num_points"] == 4 and meta["fingerprint"] == spec.fingerprint()


def test_resume_skips_finished_points(pool_and_serial, tmp_path):
    spec, pool, _ = pool_and_serial
    again = run_sweep(spec, pool.out_dir, backend="serial", progress=False)
    assert (again.ran, again.skipped) == (0, 4)
    assert [r["ttft_s.p90"] for r in again.rows] == [r["ttft_s.p90"] for r in pool.rows]
    # drop one finished point (and tear the last line as an interrupted write would)
    lines = (pool.out_dir / POINTS).read_text().splitlines()
    kept = [ln for ln in lines if json.loads(ln)["point_id"] != spec.points[2].point_id]
    # (and a line of binary garbage, e.g. a disk error: before, a UnicodeDecodeError)
    (pool.out_dir / POINTS).write_bytes(("\n".join(kept) + "\n").encode() + b"\xff\xfe\n"
                                        + b'{"point_id": "torn')
    resumed = run_sweep(spec, pool.out_dir, backend="serial", progress=False)
    assert (resumed.ran, resumed.skipped) == (1, 3)
    assert set(read_points(pool.out_dir / POINTS)) == {p.point_id for p in spec.points}
    assert [r["ttft_s.p90"] for r in resumed.rows] == [r["ttft_s.p90"] for r in pool.rows]


def test_a_different_base_is_refused_unless_restarted(pool_and_serial):
    spec, pool, _ = pool_and_serial
    other = load_sweep(Path(spec.source), ["seed=1"])
    with pytest.raises(ValueError, match="different base scenario.*--restart"):
        run_sweep(other, pool.out_dir, backend="serial", progress=False)


def test_a_failing_point_is_recorded_and_the_others_finish(tmp_path):
    # 5% of an H100 cannot hold Llama-3-8B's weights: that point fails at run time
    spec = load_sweep(write_sweep(tmp_path, {"cache.gpu_memory_utilization": [0.9, 0.05, 0.8]}))
    out = run_sweep(spec, tmp_path / "out", backend="process", workers=2, progress=False)
    assert [r["status"] for r in out.rows] == ["ok", "failed", "ok"]
    assert out.failed == 1 and out.ran == 3
    assert "weights do not fit" in out.rows[1]["error"]
    assert out.rows[0]["requests.finished"] == 80 and out.rows[1].get("requests.finished") is None
    # failed points count as done on resume unless retried
    assert run_sweep(spec, out.out_dir, backend="serial", progress=False).ran == 0
    assert run_sweep(spec, out.out_dir, backend="serial", progress=False,
                     retry_failed=True).ran == 1


def test_cost_table_of_the_sweep_file_prices_the_points(tmp_path):
    f = tmp_path / "cost.yaml"
    f.write_text(yaml.safe_dump({"base": str(QUICKSTART), "set": SMALL,
                                 "cost_table": {"h100-sxm": 1.25, "h200-sxm": 4.0},
                                 "axes": {"hardware": ["h100-sxm", "h200-sxm"],
                                          "cluster.tp": [2]}}))
    rows = run_sweep(load_sweep(f), tmp_path / "out", backend="serial", progress=False).rows
    assert [r["cost.gpus"] for r in rows] == [2, 2]
    assert [r["cost.usd_per_hour"] for r in rows] == [2.5, 8.0]
    r = rows[0]
    assert r["cost.usd_per_m_output_tokens"] == pytest.approx(
        2.5 / (r["throughput.output_tokens_per_s"] * 3600) * 1e6)
    assert r["cost.good_requests_per_usd"] == pytest.approx(r["slo.goodput_rps"] * 3600 / 2.5)


def test_point_timeout_fails_only_that_point(tmp_path):
    spec = load_sweep(write_sweep(tmp_path, {"seed": [0]}))
    out = run_sweep(spec, tmp_path / "out", backend="serial", progress=False,
                    point_timeout_s=1e-3)
    assert out.rows[0]["status"] == "failed"
    assert "PointTimeout" in out.rows[0]["error"]


def test_cli_sweep_end_to_end(tmp_path, capsys):
    f = write_sweep(tmp_path, {"scheduler.max_num_seqs": [16, 64]}, "cli")
    out = tmp_path / "res"
    assert main(["sweep", str(f), "--out", str(out), "--backend", "serial", "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert "2 points, 2 simulated, 0 already done, 0 failed" in text
    assert (out / "results.parquet").is_file() and (out / "results.csv").is_file()
    assert main(["sweep", str(f), "--out", str(out), "--no-progress"]) == 0
    assert "0 simulated, 2 already done" in capsys.readouterr().out
    assert main(["sweep", str(f), "--dry-run"]) == 0
    assert '"scheduler.max_num_seqs": 64' in capsys.readouterr().out


def test_cli_bad_input_exits_2_before_any_work(tmp_path, capsys):
    f = write_sweep(tmp_path, {"scheduler.max_num_seq": [16]}, "bad")
    out = tmp_path / "never"
    assert main(["sweep", str(f), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "not a scenario key" in err and "scheduler.max_num_seqs" in err
    assert not out.exists()
    good = write_sweep(tmp_path, {"seed": [0]}, "good")
    assert main(["sweep", str(good), "--out", str(out), "--address", "127.0.0.1:1"]) == 2
    assert "--address applies to --backend ray only" in capsys.readouterr().err
    assert not out.exists()
    # timeouts and pool sizes are finite positive numbers, refused by argparse
    for flag, value in (("--point-timeout", "nan"), ("--connect-timeout", "inf"),
                        ("--workers", "0")):
        with pytest.raises(SystemExit) as info:
            main(["sweep", str(good), "--out", str(out), flag, value])
        assert info.value.code == 2 and f"argument {flag}: expects" in capsys.readouterr().err
    assert not out.exists()


def test_ranking_keeps_only_points_that_meet_the_attainment_target(capsys):
    from kvpd.commands.sweep import print_ranking

    rows = [{"slo.goodput_rps": 9.0, "slo.attainment": 0.73, "x": 1},
            {"slo.goodput_rps": 5.0, "slo.attainment": 0.95, "x": 2},
            {"slo.goodput_rps": 4.0, "slo.attainment": 1.0, "x": 3}]
    print_ranking(rows, ["x"], 0.9)
    out = capsys.readouterr().out
    assert "(2 of 3 points" in out and "x=1" not in out
    assert out.index("x=2") < out.index("x=3")  # by goodput among those kept
    print_ranking(rows, ["x"], 0.99)
    assert "x=2" not in capsys.readouterr().out
    print_ranking(rows[:1], ["x"], 0.9)
    assert "none: the highest attainment is 0.730" in capsys.readouterr().out


def test_a_sweep_json_that_is_not_an_object_is_replaced_not_a_crash(tmp_path):
    """(before: valid JSON that is not an object, e.g. a list, was an AttributeError)"""
    from simulator.plan.sweep import META, prepare_out_dir

    out = tmp_path / "out"
    out.mkdir()
    (out / META).write_text("[1, 2]")
    spec = load_sweep(write_sweep(tmp_path, {"seed": [0]}))
    prepare_out_dir(spec, out, restart=False)
    assert json.loads((out / META).read_text())["fingerprint"] == spec.fingerprint()
