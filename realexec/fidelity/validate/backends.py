"""The real engines `kvpd validate` replays its runs on: one colocated engine in a worker
process (as `kvpd serve` runs it) or in the validating process, or a PD deployment of
prefill and decode worker processes; each replays a trace through the replay client
(`realexec.serving.replay.runner`) and keeps the steps its engines ran."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import workloads


class ColocatedBackend:
    """One in-process `LLM`, replayed through `realexec.serving.replay.runner` (target `inproc`)."""

    def __init__(self, model_config: dict[str, Any], llm_kwargs: dict[str, Any],
                 step_log: Path) -> None:
        from realexec.engine.llm import LLM
        from realexec.serving.step_log import StepLogWriter

        self.llm = LLM(model_config, record_steps=True, **llm_kwargs)
        self.steps: dict[str, list] = {}  # role -> StepRecords of the last replay
        self.log = StepLogWriter(str(step_log))  # kept beside the results, as PD workers do

    def replay(self, trace: workloads.Trace, seed: int):
        """(ReplayResult, preemptions, CPU availability of the engine thread)."""
        from realexec.fidelity.profile.facts import cpu_available, sched_times
        from realexec.serving.replay.runner import replay

        before, s0 = self.llm.scheduler.num_preemptions, sched_times()
        self.llm.runner.steps.clear()
        res = replay(trace, "inproc", llm=self.llm, seed=seed)
        avail = cpu_available(s0, sched_times())
        self.steps = {"colocated": list(self.llm.runner.steps)}
        for s in self.steps["colocated"]:
            if s.shape.num_reqs:
                self.log.add(s.t_start, s.duration_s, s.shape)
        self.log.flush()
        return res, self.llm.scheduler.num_preemptions - before, avail

    def close(self) -> None:
        self.llm = None


class ServedBackend:
    """Engine worker processes behind an `EngineClient`, as `kvpd serve` deploys them: one
    colocated engine (`pd=None`) or a PD deployment (`pd=(1, 1)`: prefill and decode
    workers). The workers log their steps under `step_log_dir` (kept beside the results).

    Real runs of `kvpd validate` use this for both modes: an engine inside the validating
    process (`ColocatedBackend`) shares it with everything the validation keeps, and on the
    2-core VM its steps slowed by 5-12% over the colocated phase of runs 10-12 while the PD
    workers' did not (run 13, with this backend, could not tell that from the VM's own
    phase; docs/validation-runs.md)."""

    def __init__(self, model_config: dict[str, Any], llm_kwargs: dict[str, Any],
                 threads: int | None, step_log_dir: Path,
                 pd: tuple[int, int] | None = (1, 1)) -> None:
        from realexec.serving.client import EngineClient
        from realexec.serving.config import ServeConfig

        cfg = ServeConfig(model=model_config, llm_kwargs=llm_kwargs, pd=pd,
                          kv_mode="full", num_threads=threads, step_log_dir=str(step_log_dir))
        self.target = "engine" if pd is None else f"pd:{pd[0]}:{pd[1]}"
        self.client = EngineClient(cfg).start()
        self.logs = {w.role: (step_log_dir / f"{w.name}.steps.jsonl") for w in
                     self.client.workers.values()}
        self.offsets = {role: 0 for role in self.logs}
        self.steps: dict[str, list] = {}  # role -> LoggedSteps of the last replay

    def _read_steps(self) -> dict[str, list]:
        from realexec.serving.step_log import read_step_log

        out = {}
        for role, path in self.logs.items():
            out[role], self.offsets[role] = read_step_log(path, self.offsets[role])
        return out

    def _preemptions(self) -> int:
        return sum(int(w["stats"].get("num_preemptions", 0))
                   for w in self.client.workers_status().values())

    def _sched(self) -> dict[str, tuple[float, float] | None]:
        from realexec.fidelity.profile.facts import sched_times

        return {n: sched_times(w["pid"]) for n, w in self.client.workers_status().items()
                if w.get("pid")}

    def replay(self, trace: workloads.Trace, seed: int):
        """(ReplayResult, preemptions, CPU availability of the workers' engine threads)."""
        from realexec.serving.replay.runner import replay

        before, s0 = self._preemptions(), self._sched()
        self._read_steps()  # skip steps of earlier runs not read yet (warm-up)
        res = replay(trace, self.target, client=self.client, seed=seed)
        time.sleep(0.3)  # let the last stats (outputs/heartbeats) and step logs arrive
        if not self.client.is_healthy():
            down = [n for n, w in self.client.workers_status().items() if not w.get("alive", True)]
            raise RuntimeError(f"engine worker(s) down after the run: {down or 'unknown'}")
        s1 = self._sched()
        run = sum(s1[n][0] - s0[n][0] for n in s1 if s1[n] and s0.get(n))
        wait = sum(s1[n][1] - s0[n][1] for n in s1 if s1[n] and s0.get(n))
        avail = run / (run + wait) if run + wait > 0 else None
        self.steps = self._read_steps()
        return res, self._preemptions() - before, avail

    def close(self) -> None:
        self.client.close()


def run_failure(res) -> str | None:
    """Why a replay's results cannot be used (requests that failed), or None."""
    s = res.summary["requests"]
    if s["finished"] == s["total"]:
        return None
    errors = [r.stop_reason for r in res.requests if r.stop_reason]
    return (f"{s['total'] - s['finished']} of {s['total']} requests did not finish"
            + (f" (first error: {errors[0]})" if errors else ""))

