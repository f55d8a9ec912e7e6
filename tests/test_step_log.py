"""Step logs of serving workers (`realexec.serving.step_log`) and the cost model checked on the
PD workers' own steps (`simulator.calibrate.step_pricing`)."""

from __future__ import annotations

import pytest

from realexec.serving.step_log import FLUSH_EVERY, LoggedStep, StepLogWriter, read_step_log
from simulator.calibrate.step_pricing import STEP_KINDS, pd_step_errors, step_errors
from simulator.core.batch_shape import BatchShape
from simulator.cost.costmodel import CostModel
from simulator.cost.host_share import HostSharing, contended_cost_model


def _prefill(n: int) -> BatchShape:
    return BatchShape.from_lists([n], [0])


def _decode(k: int, ctx: int = 64) -> BatchShape:
    return BatchShape.from_lists([1] * k, [ctx] * k)


def test_written_steps_read_back_and_partial_lines_wait(tmp_path):
    path = tmp_path / "w" / "prefill-0.steps.jsonl"
    w = StepLogWriter(str(path))
    w.add(10.0, 0.02, _prefill(17))
    w.add(10.03, 0.01, _decode(3))
    assert read_step_log(path) == ([], 0)  # buffered until flushed
    w.flush()
    steps, off = read_step_log(path)
    assert [(s.t_start, s.duration_s) for s in steps] == [(10.0, 0.02), (10.03, 0.01)]
    assert steps[0].shape == _prefill(17) and steps[1].shape == _decode(3)
    assert steps[0].t_end == pytest.approx(10.02)
    with path.open("a") as f:  # a line still being written is left for the next read
        f.write('{"t": 11.0, "s": 0.0')
    assert read_step_log(path, off) == ([], off)
    with path.open("a") as f:
        f.write(', "shape": {"num_reqs": 1, "num_tokens": 1}}\n')
    more, off2 = read_step_log(path, off)
    assert len(more) == 1 and more[0].shape.num_tokens == 1 and off2 > off
    assert read_step_log(tmp_path / "missing.jsonl", 5) == ([], 5)


def test_the_writer_flushes_on_its_own_when_the_buffer_fills(tmp_path):
    w = StepLogWriter(str(tmp_path / "d.jsonl"))
    for i in range(FLUSH_EVERY):
        w.add(float(i), 0.01, _decode(1))
    assert len(read_step_log(tmp_path / "d.jsonl")[0]) == FLUSH_EVERY


def test_a_malformed_line_names_the_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"t": 1, "s": 0.1, "shape": {"num_reqs": 1}}\n{"t": 2, "s": 0.1}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl: step log line 2"):
        read_step_log(path)
    path.write_text('{"t": 1, "s": 0.1, "shape": {"bogus": 1}}\n')
    with pytest.raises(ValueError, match="line 1"):
        read_step_log(path)


@pytest.fixture(scope="module")
def cm() -> CostModel:
    return CostModel("llama-3-8b", "cpu", "fp32")


def test_plain_errors_compare_predicted_and_measured_totals(cm):
    shapes = [_prefill(100), _decode(4)]
    real = [2 * cm.step_time(s) for s in shapes]  # the real steps took twice as long
    steps = [LoggedStep(float(i), r, s) for i, (r, s) in enumerate(zip(real, shapes))]
    e = step_errors(steps, cm)
    assert e["num_steps"] == 2 and e["total"] == pytest.approx(-0.5) and e["median"] == pytest.approx(-0.5)
    assert step_errors([LoggedStep(0.0, 0.0, BatchShape())], cm) is None


def test_errors_by_kind_separate_prompts_mixed_steps_and_decode_batch_sizes(cm):
    """A speed factor over all steps cannot fix an error that depends on the batch: the
    kinds are reported apart (decode-only steps by batch size)."""
    mixed = BatchShape.from_lists([64, 1, 1], [0, 100, 200])
    cases = [(_prefill(100), 1.0), (mixed, 1.25), (_decode(3), 2.0), (_decode(4), 2.0),
             (_decode(5), 0.5), (_decode(16), 0.5), (_decode(17), 1.0), (_decode(64), 1.0)]
    steps = [LoggedStep(float(i), k * cm.step_time(s), s) for i, (s, k) in enumerate(cases)]
    by = step_errors(steps, cm)["by_kind"]
    assert list(by) == sorted(by) and set(by) == set(STEP_KINDS)
    want = {"prefill": 0.0, "mixed": -0.2, "decode 1-4": -0.5, "decode 5-16": 1.0, "decode 17+": 0.0}
    for kind, err in want.items():
        assert by[kind]["total"] == pytest.approx(err), kind
    assert [by[k]["num_steps"] for k in STEP_KINDS] == [1, 1, 2, 2, 2]


def _overlapped_then_alone(alone_s: float, shared_s: float, overlap_s: float) -> float:
    """Seconds of a step priced `shared_s` beside its neighbour for the first `overlap_s`
    of wall time and `alone_s` after it."""
    if shared_s <= overlap_s:
        return shared_s
    return overlap_s + (1 - overlap_s / shared_s) * alone_s


def test_pd_steps_are_priced_with_the_neighbour_while_it_is_in_a_step(cm):
    hs = HostSharing(cm, 0.5, 0.9)
    d = _decode(8, 512)
    td = cm.step_time(d)
    p1, p2 = _prefill(16), _prefill(400)
    # decode step [0, td); prefill 1 starts inside it, prefill 2 after it ended
    steps = {"decode": [LoggedStep(0.0, td, d)],
             "prefill": [LoggedStep(td / 2, cm.step_time(p1), p1),
                         LoggedStep(td * 3, cm.step_time(p2), p2)]}
    out = pd_step_errors(steps, cm, 0.5, 0.9)
    pre = out["prefill"]
    assert pre["overlapped_fraction"] == 0.5
    assert pre["alone"]["shared"]["total"] == pytest.approx(0.0)  # alone: the plain time
    a1 = cm.step_time(p1)
    f = hs.memory_seconds(d, td) / td
    beside = hs.price(a1, hs.memory_seconds(p1, a1), f)
    assert beside > a1  # a memory-bound neighbour slows the small prefill
    want = _overlapped_then_alone(a1, beside, td / 2)  # beside it until the decode step ends
    assert pre["overlapped"]["shared"]["total"] == pytest.approx(want / a1 - 1)
    assert pre["shared_at_start"]["total"] == pytest.approx(
        (beside + cm.step_time(p2)) / (a1 + cm.step_time(p2)) - 1)
    dec = out["decode"]  # alone at its start, then beside prefill 1 (as logged) for a while
    assert dec["overlapped_fraction"] == 0.0
    md, mp1 = hs.memory_seconds(d, td), hs.memory_seconds(p1, a1) / a1
    pd_ = hs.price(td, md, mp1)  # half its work alone, then beside prefill 1
    want_d = td / 2 + _overlapped_then_alone(td / 2, pd_ / 2, a1)
    assert dec["shared"]["total"] == pytest.approx(want_d / td - 1) and want_d > td
    assert dec["shared_at_start"]["total"] == pytest.approx(0.0)
    # without shares (or shares of 1) only the plain error is reported
    assert "shared" not in pd_step_errors(steps, cm, None)["prefill"]
    assert "shared" not in pd_step_errors(steps, cm, 1.0, 1.0)["prefill"]
    assert "shared" in pd_step_errors(steps, cm, None, 0.9)["prefill"]


def test_finish_time_walks_the_neighbours_steps(cm):
    """`HostSharing.finish_s`: each stretch of wall time does 1 / (the price then) of the
    work: alone, beside one step, alone in a gap, beside the next."""
    hs = HostSharing(cm, 0.5, 0.8)
    shape = _prefill(256)
    a = cm.step_time(shape)
    m = hs.memory_seconds(shape, a)
    p1, p2 = hs.price(a, m, 1.0), hs.price(a, m, 0.2)
    assert hs.finish_s(a, m, 5.0, []) == pytest.approx(a)
    assert hs.finish_s(a, m, 0.0, [(-1.0, 10 * p1, 1.0)]) == pytest.approx(p1)
    # alone 0.1 a, beside f=1 for 0.2 a of wall time, alone 0.1 a, then beside f=0.2 to the end
    spans = [(0.1 * a, 0.3 * a, 1.0), (0.4 * a, 100 * a, 0.2)]
    done = 0.1 + 0.2 * a / p1 + 0.1
    assert hs.finish_s(a, m, 0.0, spans) == pytest.approx(0.4 * a + (1 - done) * p2)
    # spans that ended before the start count for nothing
    assert hs.finish_s(a, m, 200 * a, spans) == pytest.approx(a)


def test_host_sharing_splits_memory_and_compute(cm):
    """Alone: the plain time; beside a pure stream (f = 1): memory at the memory share;
    beside a neighbour that streams nothing (f = 0): only the compute share applies."""
    shape = _prefill(128)
    a = cm.step_time(shape)
    hs = HostSharing(cm, 0.5, 0.8)
    m = hs.memory_seconds(shape, a)
    assert 0 < m < a
    slow = contended_cost_model(cm, 0.5).step_time(shape)
    assert hs.price(a, m, None) == a
    assert hs.price(a, m, 1.0) == pytest.approx((a - m) / 0.8 + m / 0.5)
    assert HostSharing(cm, 0.5, 1.0).price(a, m, 1.0) == pytest.approx(slow)
    assert hs.price(a, m, 0.0) == pytest.approx((a - m) / 0.8 + m)
    with pytest.raises(ValueError, match="host shares"):
        HostSharing(cm, 0.5, 0.0)


def test_a_rates_steps_are_those_logged_while_its_real_runs_ran(cm, tmp_path):
    """`real_windows` from validation.json, or (older folders) from each run summary's file
    time and `wall_s`; `steps_within` keeps the steps that started inside one."""
    import json
    import os

    from realexec.fidelity.validate.steps import real_windows, steps_within

    assert real_windows({"real_windows": [[1.0, 2.0], [5, 6]]}, tmp_path, 0) == [(1.0, 2.0), (5.0, 6.0)]
    for rep, end in ((0, 100.0), (1, 200.0)):
        p = tmp_path / f"rate0-real{rep}" / "summary.json"
        p.parent.mkdir()
        p.write_text(json.dumps({"wall_s": 30.0}))
        os.utime(p, (end, end))
    windows = real_windows({}, tmp_path, 0)
    assert windows == [(70.0, 100.0), (170.0, 200.0)]
    steps = [LoggedStep(t, 0.01, _decode(2)) for t in (60.0, 75.0, 150.0, 199.0)]
    got = steps_within({"decode": steps}, windows)["decode"]
    assert [s.t_start for s in got] == [75.0, 199.0]
