"""The front end's worker supervision (`realexec.serving.supervisor`) on hand-made worker
states: what a down worker does to the requests that needed it, without processes."""

from __future__ import annotations

from realexec.serving.client import EngineClient
from realexec.serving.client_types import ClientRequest, Delta, WorkerState
from realexec.serving.config import ServeConfig


def _pd_client() -> tuple[EngineClient, list[Delta]]:
    """A PD client with one ready prefill and one ready decode worker (no processes, no
    sockets) holding request `r`, whose deltas go to the returned list."""
    c = EngineClient(ServeConfig(model="tiny-llama", pd=(1, 1)))
    for name, role in (("prefill-0", "prefill"), ("decode-0", "decode")):
        c.workers[name] = WorkerState(name, role, ready=True)
    c.started.set()
    got: list[Delta] = []
    req = ClientRequest("r", [5, 6], {}, 0.0, token_ids=[7], sink=got.append,
                        worker="prefill-0", prefill_worker="prefill-0", decode_worker="decode-0")
    c.requests["r"] = req
    return c, got


def test_a_hand_off_to_a_decoder_that_is_not_up_ends_with_an_error():
    c, got = _pd_client()
    try:
        c.workers["decode-0"].ready = False  # restarting: not up, not down
        c._hand_off(c.requests["r"])
        assert "r" not in c.requests
        assert len(got) == 1 and got[0].finished and got[0].finish_reason == "error"
        assert got[0].error_kind == "down" and "decode-0" in got[0].error
    finally:
        c.close()


def test_a_dead_decoder_fails_its_requests_then_reports_itself():
    c, got = _pd_client()
    told: list[tuple[str, str]] = []
    c.on_worker_down = lambda name, why: told.append((name, why))
    try:
        c.supervisor.mark_down(c.workers["decode-0"], "process exited with code -9")
        assert "r" not in c.requests and got[0].error_kind == "down"
        assert "worker decode-0 is down: process exited with code -9" in got[0].error
        assert told == [("decode-0", "process exited with code -9")]
        assert not c.is_healthy()
        c.supervisor.mark_down(c.workers["decode-0"], "again")  # once only
        assert len(told) == 1 and len(got) == 1
    finally:
        c.close()
