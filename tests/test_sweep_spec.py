"""Sweep files: parsing, point expansion (grid / random / Latin hypercube) and the
messages for bad input, all before any simulation runs."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from simulator.plan.sweep_spec import Axis, expand, load_sweep, point_id, sweep_from_dict

QUICKSTART = Path(__file__).resolve().parents[1] / "scenarios" / "quickstart.yaml"


def spec(axes, **extra):
    return sweep_from_dict({"base": str(QUICKSTART), "axes": axes, **extra}, "t.yaml")


def test_grid_is_the_product_of_axes_in_file_order():
    s = spec({"scheduler.max_num_seqs": [32, 64], "cache.block_size": [16, 32, 64]})
    assert len(s.points) == 6
    assert [p.overrides for p in s.points[:3]] == [
        {"scheduler.max_num_seqs": 32, "cache.block_size": b} for b in (16, 32, 64)]
    assert [p.index for p in s.points] == list(range(6))


def test_grid_range_with_num_and_log():
    s = spec({"workload.target_rate": {"min": 2, "max": 32, "num": 5, "log": True}})
    assert [p.overrides["workload.target_rate"] for p in s.points] == [2.0, 4.0, 8.0, 16.0, 32.0]
    s = spec({"scheduler.max_num_seqs": {"min": 16, "max": 64, "num": 3, "integer": True}})
    assert [p.overrides["scheduler.max_num_seqs"] for p in s.points] == [16, 40, 64]


def test_lhs_stratifies_each_range_and_is_seeded():
    a = spec({"workload.target_rate": {"min": 1.0, "max": 11.0}}, mode="lhs", samples=10, seed=3)
    rates = sorted(p.overrides["workload.target_rate"] for p in a.points)
    # Latin hypercube: exactly one sample in each tenth of the range
    assert [int(r - 1.0) for r in rates] == list(range(10))
    b = spec({"workload.target_rate": {"min": 1.0, "max": 11.0}}, mode="lhs", samples=10, seed=3)
    assert [p.overrides for p in a.points] == [p.overrides for p in b.points]
    c = spec({"workload.target_rate": {"min": 1.0, "max": 11.0}}, mode="lhs", samples=10, seed=4)
    assert [p.overrides for p in a.points] != [p.overrides for p in c.points]


def test_random_draws_categories_and_integers_within_bounds():
    s = spec({"scheduler.max_num_seqs": {"min": 8, "max": 12, "integer": True},
              "hardware": ["h100-sxm", "a100-80gb-sxm"]}, mode="random", samples=40, seed=1)
    seqs = {p.overrides["scheduler.max_num_seqs"] for p in s.points}
    assert seqs <= set(range(8, 13)) and len(seqs) > 1
    assert {p.overrides["hardware"] for p in s.points} == {"h100-sxm", "a100-80gb-sxm"}
    # duplicates are dropped: at most 5 x 2 distinct points
    assert len(s.points) <= 10
    assert len({p.point_id for p in s.points}) == len(s.points)


def test_linked_axis_sets_keys_together_with_a_label():
    s = spec({"split": {"linked": [
        {"cluster.pd.prefill.replicas": 1, "cluster.pd.decode.replicas": 3},
        {"cluster.pd.prefill.replicas": 2, "cluster.pd.decode.replicas": 2}]}})
    assert s.points[1].overrides == {"cluster.pd.prefill.replicas": 2,
                                     "cluster.pd.decode.replicas": 2}
    assert s.points[1].axes["split"] == "prefill.replicas=2,decode.replicas=2"
    assert s.scenario(s.points[0]).cluster.pd.decode.replicas == 3


def test_point_id_is_stable_and_order_free():
    assert point_id({"a": 1, "b": [0, 60]}) == point_id({"b": [0, 60], "a": 1})
    assert point_id({"a": 1}) != point_id({"a": 2})
    assert len(point_id({"a": 1})) == 16


def test_set_and_cli_overrides_reach_every_point_and_the_fingerprint():
    s = spec({"scheduler.max_num_seqs": [32]}, set={"workload.limit": 50})
    assert s.scenario(s.points[0]).workload.limit == 50
    t = sweep_from_dict({"base": str(QUICKSTART), "axes": {"scheduler.max_num_seqs": [32]},
                         "set": ["workload.limit=50"]}, "t.yaml", overrides=["seed=7"])
    assert t.scenario(t.points[0]).seed == 7
    assert s.fingerprint() != t.fingerprint()


def test_load_sweep_resolves_base_relative_to_the_file(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump({"base": str(QUICKSTART), "axes": {"seed": [0, 1]}}))
    s = load_sweep(f)
    assert s.name == "s" and len(s.points) == 2
    assert Path(s.base_dir) == QUICKSTART.parent


# --- bad input: a clear message before any simulation ------------------------------------

def test_unknown_axis_key_names_the_closest_keys():
    with pytest.raises(ValueError) as e:
        spec({"scheduler.max_num_seq": [1, 2]})
    assert "'scheduler.max_num_seq' is not a scenario key" in str(e.value)
    assert "scheduler.max_num_seqs" in str(e.value)


def test_unknown_key_inside_a_linked_axis():
    with pytest.raises(ValueError, match=r"cluster\.pd\.prefil\.replicas.*closest.*prefill"):
        spec({"split": {"linked": [{"cluster.pd.prefil.replicas": 1}]}})


def test_wrong_value_type_names_the_point_and_field():
    with pytest.raises(ValueError) as e:
        spec({"scheduler.max_num_seqs": [64, "lots"]})
    msg = str(e.value)
    assert "point 1" in msg and "scheduler.max_num_seqs" in msg and "lots" in msg


def test_unknown_catalog_name_is_reported_up_front():
    with pytest.raises(ValueError, match=r"hardware: unknown hardware 'h1000'"):
        spec({"hardware": ["h100-sxm", "h1000"]})


def test_a_negative_or_non_finite_price_is_refused():
    with pytest.raises(ValueError, match=r"t.yaml: cost_table.h100-sxm: expected a price >= 0"):
        spec({"seed": [0, 1]}, cost_table={"h100-sxm": -2})
    with pytest.raises(ValueError, match=r"cost_table.h100-sxm: expected a finite number"):
        spec({"seed": [0, 1]}, cost_table={"h100-sxm": float("inf")})


def test_a_cost_table_name_no_point_runs_on_is_refused_up_front():
    """A misspelt part would leave its price silently unknown in every point's cost columns
    (before: taken); inline parts a point runs on are names too."""
    with pytest.raises(ValueError, match=r"t.yaml: cost_table: 'h100-sxn' is neither a catalog "
                                         r"accelerator nor one a point runs on.*did you mean "
                                         r"h100-sxm"):
        spec({"seed": [0, 1]}, cost_table={"h100-sxn": 2.0})
    inline = {"name": "my-part", "base": "h100-sxm"}
    s = spec({"hardware": [inline, "h200-sxm"]}, cost_table={"my-part": 1.0, "a100-80gb-sxm": 1.0})
    assert len(s.points) == 2


def test_a_calibration_that_cannot_serve_a_pool_is_reported_up_front(tmp_path):
    from simulator.cost.params import CostParams

    cal = tmp_path / "cal.yaml"
    CostParams(device="cpu", extra={"serving_speed": {"colocated": 0.9}}).save(str(cal))
    hw = {"calibration": str(cal), "serving_speed": True}
    spec({"scheduler.max_num_seqs": [32]}, set={"hardware": hw})  # colocated: measured
    with pytest.raises(ValueError, match=r"cluster.pd.prefill.hardware: .*no serving speed for "
                                         r"the prefill role"):
        spec({"scheduler.max_num_seqs": [32]},
             set={"hardware": hw, "cluster.pd": {"link": "ib-ndr"}})
    with pytest.raises(ValueError, match=r"point 0 .*\n  hardware: .*calibration file not found: .*missing.yaml"):
        spec({"scheduler.max_num_seqs": [32]},
             set={"hardware": {"calibration": str(tmp_path / "missing.yaml")}})


def test_empty_sweep_is_refused():
    with pytest.raises(ValueError, match="empty sweep"):
        spec({})
    with pytest.raises(ValueError, match="empty sweep axis"):
        spec({"seed": []})
    with pytest.raises(ValueError, match="empty sweep"):
        sweep_from_dict({"base": str(QUICKSTART)}, "t.yaml")


@pytest.mark.parametrize("axes, extra, match", [
    ({"workload.target_rate": {"min": 5, "max": 1}}, {}, "min <= max"),
    ({"workload.target_rate": {"min": 0, "max": 1, "log": True}}, {}, "log range needs min > 0"),
    ({"workload.target_rate": {"min": 1, "max": 2}}, {}, "needs 'num' in a grid"),
    ({"workload.target_rate": {"min": 1, "max": 2, "step": 1}}, {}, "unknown: step"),
    ({"seed": [1]}, {"mode": "sobol"}, "mode must be one of"),
    ({"seed": [1]}, {"mode": "lhs"}, "needs 'samples'"),
    ({"seed": [1]}, {"samples": 0, "mode": "random"}, "samples must be an integer >= 1"),
    ({"seed": [1]}, {"axis": 1}, "unknown keys axis .did you mean axes"),
    ({"seed": [1], "split": {"linked": [{"seed": 2}]}}, {}, "set seed more than once"),
    ({"seed": 3}, {}, "expected a list of values"),
    # a range over a whole-number key sampled reals, refused point by point (a fuzz found it)
    ({"scheduler.max_num_seqs": {"min": 1, "max": 256, "log": True}}, {"mode": "random",
                                                                      "samples": 2},
     "scheduler.max_num_seqs takes whole numbers.*add integer: true"),
])
def test_bad_sweep_files(axes, extra, match):
    with pytest.raises(ValueError, match=match):
        spec(axes, **extra)


def test_missing_files():
    with pytest.raises(FileNotFoundError, match="sweep file not found"):
        load_sweep("/nonexistent/sweep.yaml")
    with pytest.raises(FileNotFoundError, match="base scenario not found"):
        sweep_from_dict({"base": "nope.yaml", "axes": {"seed": [1]}}, "t.yaml", "/tmp")


def test_huge_grid_is_refused_before_building_points():
    axes = [Axis(f"k{i}", tuple(range(10))) for i in range(6)]
    with pytest.raises(ValueError, match="1000000 points"):
        expand(axes, "grid", None, 0)


def test_every_yaml_reader_words_its_errors_alike(tmp_path):
    """Scenario, sweep and trace-spec files: the same three errors, each naming the file."""
    from kvpd.commands.trace import _read_spec
    from simulator.scenario import read_scenario_yaml

    listing = tmp_path / "list.yaml"
    listing.write_text("- a\n- b\n")
    broken = tmp_path / "broken.yaml"
    broken.write_text("a: [1, 2\n")
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"\xff\xfe\x00a: 1\n")
    for read, what in ((read_scenario_yaml, "scenario"), (load_sweep, "sweep"),
                       (lambda p: _read_spec(p, None), "--spec")):
        with pytest.raises(FileNotFoundError, match=f"{what}.* file not found: .*missing.yaml"):
            read(tmp_path / "missing.yaml")
        with pytest.raises(ValueError, match=rf"list.yaml: a {what}.* must be a YAML mapping, got list"):
            read(listing)
        with pytest.raises(ValueError, match="broken.yaml: not valid YAML"):
            read(broken)
        with pytest.raises(ValueError, match=rf"binary.yaml: not a UTF-8 text file \(invalid "
                                             rf"start byte at byte 0\); a {what}.* is YAML"):
            read(binary)  # (before: a bare UnicodeDecodeError naming no file)
