"""`kvpd profile`: time real engine steps of one model on the local device over a designed grid.

Each step is timed as the engine runs it (`LLM.step()`: schedule, copies, forward, sampling,
update), so the fitted cost model covers everything the simulator's step stands for. The
grid (`ProfileGrid`) covers prompt steps of many lengths, prompt chunks after a cached
context, decode steps over batch sizes x context lengths, mixed steps (decodes + one prompt
chunk), the executor's linears alone at every small size (realexec/fidelity/profile/linears.py), KV
swap copies and PD KV transfers. Decode contexts are set up without computing
them (`_NoCompute` runs the scheduler's prompt steps for free; the cache content does not
change the timing). Step points are visited in `warmup` untimed and `repeats` timed
rounds (interleaved, see `Profiler`); copies get `warmup` + `repeats` back-to-back runs. The
profile keeps the median, mean and spread of each point (see `simulator.calibrate.profile_io`).
"""

from __future__ import annotations

import dataclasses
import functools
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from realexec.fidelity.profile.facts import (
    model_identity,
)
from realexec.fidelity.profile.linears import time_linears
from simulator.calibrate.profile_io import STEP_KINDS, ProfileRow
from simulator.core.batch_shape import BatchShape
from simulator.core.block_pool import BlockPool
from simulator.core.scheduler_output import SchedulerOutput, StepResult

Progress = Callable[[str], None] | None
Sample = tuple[tuple, str, float, float, BatchShape]  # key, kind, wall s, on-CPU s, shape
PROFILE_KINDS = ("steps", "linears", "swap", "transfer")
# Token budget of the profiling engine: larger than any grid point, so each point is one step.
FULL_BUDGET = 8192


@dataclass
class ProfileGrid:
    """The grid points (tokens) of a profile; defaults suit the ~50M ladder model on a CPU."""

    prefill_lens: tuple[int, ...] = (8, 16, 32, 64, 96, 128, 192, 256, 384, 512, 768, 1024)
    chunks: tuple[tuple[int, int], ...] = ((128, 64), (256, 256), (512, 128), (512, 512),
                                           (1024, 256), (1024, 512), (1536, 384))
    decode_batches: tuple[int, ...] = (1, 2, 4, 8, 16, 24, 32, 48)
    decode_contexts: tuple[int, ...] = (32, 128, 384, 768, 1536)
    mixed_batches: tuple[int, ...] = (2, 8, 24)
    mixed_contexts: tuple[int, ...] = (128, 768)
    mixed_prompts: tuple[int, ...] = (32, 128, 384)
    # decode batches of unequal contexts (as real traffic has): (batch, mean context), the
    # contexts spread evenly over [1/4, 7/4] x the mean (`ragged_contexts`)
    ragged: tuple[tuple[int, int], ...] = ((4, 256), (8, 512), (16, 256), (16, 768), (32, 384))
    # the executor's linears timed alone at these token counts, and its LM head at these
    # request counts (realexec/fidelity/profile/linears.py; every size up to the largest batch)
    linear_tokens: tuple[int, ...] = tuple(range(1, 65))
    lm_head_rows: tuple[int, ...] = tuple(range(1, 65))
    swap_blocks: tuple[int, ...] = (1, 4, 16, 64, 256)
    transfer_tokens: tuple[int, ...] = (16, 64, 256, 1024, 2048)
    warmup: int = 1  # untimed rounds
    repeats: int = 5  # timed rounds (samples per point)
    # Hand KV blocks out in a seeded random order, as a pool has them after real traffic has
    # come and gone, instead of in id order (a fresh pool): on a CPU, decode steps over
    # scattered blocks ran 0-5% slower than over contiguous ones (`bench/diagnostics/block_order.py`).
    scatter_blocks: bool = True

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def validate(self, max_model_len: int) -> None:
        if self.repeats < 1 or self.warmup < 0:
            raise ValueError(f"profile grid: repeats must be >= 1 and warmup >= 0, "
                             f"got {self.repeats}, {self.warmup}")
        short = [c for c in self.decode_contexts if c < 3]
        if short:  # a prompt of context - 2 tokens, then an untimed decode step
            raise ValueError(f"profile grid: decode_contexts {short} must be >= 3 tokens")
        needs = [("prefill_lens", n, n) for n in self.prefill_lens]
        needs += [("chunks", (c, q), c + q) for c, q in self.chunks]
        needs += [("decode_contexts", c, c + len(self.mixed_prompts) + 3)
                  for c in self.decode_contexts]
        needs += [("ragged", (b, c), max(ragged_contexts(b, c)) + 1) for b, c in self.ragged]
        for name, point, tokens in needs:
            if tokens > max_model_len:
                raise ValueError(f"profile grid: {name} point {point} needs {tokens} tokens of "
                                 f"context but the model holds {max_model_len}; shrink the grid")

    def max_tokens_in_flight(self) -> int:
        """Tokens of KV the largest decode group holds (sizes the profiling KV pool)."""
        extra = len(self.mixed_prompts) + 3
        b = max(self.decode_batches + self.mixed_batches)
        c = max(self.decode_contexts + self.mixed_contexts)
        ragged = max((sum(ragged_contexts(b, c)) + b for b, c in self.ragged), default=0)
        return max(b * (c + extra), ragged) + max(self.mixed_prompts + self.prefill_lens)


def ragged_contexts(batch: int, mean: int) -> list[int]:
    """Contexts (tokens) of a ragged decode batch: evenly spread over [1/4, 7/4] x `mean`."""
    if batch == 1:
        return [mean]
    return [max(3, round(mean * (0.25 + 1.5 * i / (batch - 1)))) for i in range(batch)]


def scatter_free_blocks(pool: BlockPool, rng: random.Random) -> None:
    """Put every free block of `pool` in its free queue in `rng`'s order, so requests get
    blocks scattered over the whole pool (the layout after churn) rather than in id order."""
    blocks = pool.get_new_blocks(pool.num_free_blocks)
    rng.shuffle(blocks)
    pool.free_blocks(blocks)


# Named grids: `default` for the ~50M ladder model on a CPU; `quick` for tests and smoke runs;
# `gpu` for a Llama-3-8B-shaped model on one large GPU (larger batches and contexts).
GRID_PRESETS: dict[str, ProfileGrid] = {
    "default": ProfileGrid(),
    "quick": ProfileGrid(prefill_lens=(8, 16, 32, 64, 96, 192), chunks=((64, 32), (128, 64)),
                         decode_batches=(1, 4, 8), decode_contexts=(16, 96), mixed_batches=(4,),
                         mixed_contexts=(16,), mixed_prompts=(16, 48), ragged=((4, 48),),
                         linear_tokens=tuple(range(1, 9)), lm_head_rows=tuple(range(1, 9)),
                         swap_blocks=(1, 4),
                         transfer_tokens=(16, 64), warmup=1, repeats=3),
    "gpu": ProfileGrid(prefill_lens=(16, 64, 128, 256, 512, 1024, 2048, 4096),
                       chunks=((512, 512), (1024, 1024), (2048, 512), (3072, 1024)),
                       decode_batches=(1, 4, 16, 32, 64, 128, 192),
                       decode_contexts=(128, 512, 1024, 2048),
                       mixed_batches=(16, 64), mixed_contexts=(512,), mixed_prompts=(256, 1024),
                       ragged=((32, 1024), (128, 512)),
                       linear_tokens=tuple(range(1, 257)), lm_head_rows=tuple(range(1, 257)),
                       swap_blocks=(16, 256), transfer_tokens=(256, 2048), warmup=1, repeats=5),
}


def grid_preset(name: str, **overrides: Any) -> ProfileGrid:
    """A named grid (`GRID_PRESETS`), with overrides of its fields (`warmup`, `repeats`, `scatter_blocks`)."""
    if name not in GRID_PRESETS:
        raise ValueError(f"unknown profile grid {name!r}; choose from {', '.join(GRID_PRESETS)}")
    return dataclasses.replace(GRID_PRESETS[name],
                               **{k: v for k, v in overrides.items() if v is not None})


class _NoCompute:
    """An executor that skips the forward pass: samples token 3 for every request (s = 0)."""

    def execute(self, output: SchedulerOutput) -> StepResult:
        return StepResult(0.0, [3] * len(output.reqs))


def _has_recurrent_state(config: dict[str, Any]) -> bool:
    """Whether the model (an HF config dict) has linear-attention layers (Gated DeltaNet,
    Mamba-2), whose per-request state the engine keeps outside the paged KV blocks."""
    from realexec.engine.linear_attention import linear_layers
    from realexec.engine.model_loader import config_from_dict

    return any(linear_layers(config_from_dict(dict(config), "model").get_text_config()))


# ----------------------------------------------------------------------------- profiler
class Profiler:
    """Runs the grid on one `LLM` built for profiling (large token budget, no prefix cache).

    Step points are measured in interleaved rounds: each round visits every point once in a
    seeded random order, so slow phases of a shared machine spread over all points instead
    of biasing a few; the first `warmup` rounds are discarded."""

    def __init__(self, model: str | dict[str, Any] = "llama-50m", dtype: str = "fp32",
                 device: str | None = None, grid: ProfileGrid | None = None, seed: int = 0,
                 progress: Progress = None) -> None:
        from realexec.engine.llm import LLM

        self.grid = grid or ProfileGrid()
        self.config, self.name = model_identity(model)
        self.seed = seed
        self.rng = random.Random(seed)
        self.progress = progress or (lambda _msg: None)
        g = self.grid
        # a model with linear-attention layers keeps a recurrent state per request: it cannot
        # be swapped (realexec preempts it by recompute), so its profile has no swap points
        self.recurrent = _has_recurrent_state(self.config)
        block = 16
        blocks = -(-g.max_tokens_in_flight() // block) + 8
        blocks = max(blocks, -(-max(g.transfer_tokens, default=0) // block))
        self.llm = LLM(self.config, dtype=dtype, device=device, block_size=block,
                       num_gpu_blocks=blocks,
                       num_cpu_blocks=0 if self.recurrent else max(g.swap_blocks, default=0),
                       max_num_seqs=max(g.decode_batches + g.mixed_batches) + 2,
                       max_num_batched_tokens=FULL_BUDGET, enable_prefix_caching=False,
                       model_seed=seed, seed=seed)
        g.validate(self.llm.max_model_len)
        self.llm.kv_cache.kv.zero_()  # touch every page now, not inside a timed step
        self.llm.kv_cache.host.zero_()
        if g.scatter_blocks:
            scatter_free_blocks(self.llm.kv_cache_manager.block_pool, self.rng)
        self.dtype = dtype
        self.vocab = self.llm.vocab_size
        self._ids = 0
        self.cpu_available: float | None = None  # on-CPU / wall over the timed steps
        self.cpu_time_valid = self.llm.device.type == "cpu" and torch.get_num_threads() == 1

    # ---- helpers ----
    def _prompt(self, n: int) -> list[int]:
        return [self.rng.randrange(3, self.vocab) for _ in range(n)]

    def _add(self, prompt_len: int, max_tokens: int):
        self._ids += 1
        return self.llm.add_request(f"prof{self._ids}", self._prompt(prompt_len),
                                    {"max_tokens": max_tokens, "ignore_eos": True,
                                     "temperature": 0.0})

    def _timed_step(self) -> tuple[float, float, BatchShape]:
        """(wall s, on-CPU s of this thread, shape) of one engine step."""
        c0, t0 = time.thread_time(), time.perf_counter()
        out = self.llm.step()
        return time.perf_counter() - t0, time.thread_time() - c0, out.scheduler_output.shape

    def _budget(self, tokens: int) -> None:
        sched = self.llm.scheduler
        sched.config = dataclasses.replace(sched.config, max_num_batched_tokens=tokens)

    def _free_run(self, until: Callable[[], bool]) -> None:
        """Step without computing (zero time) until `until()` holds. A model with a recurrent
        state computes these steps for real: its decode steps read the state its prompt
        built (a state left empty would send them down the prompt path)."""
        engine = self.llm.engine
        runner = engine.executor
        engine.executor = runner if self.recurrent else _NoCompute()
        try:
            while not until():
                self.llm.step()
        finally:
            engine.executor = runner

    def _drain(self) -> None:
        for rid in list(self.llm.scheduler.requests):
            self.llm.abort_request(rid)
        self._free_run(lambda: not self.llm.has_unfinished_requests())

    # ---- one sample of each kind of point: [(key, kind, seconds, shape)] ----
    def _prefill(self, n: int) -> list[Sample]:
        self._add(n, 1)
        return [(("prefill", n), "prefill", *self._timed_step())]

    def _chunk(self, ctx: int, q: int) -> list[Sample]:
        req = self._add(ctx + q, 1)
        self._budget(ctx)
        self._free_run(lambda: req.num_computed_tokens >= ctx)
        self._budget(FULL_BUDGET)
        return [(("chunk", ctx, q), "chunk", *self._timed_step())]

    def _warm_decode(self, reqs: list) -> None:
        """Run the (free) prompts of `reqs`, then one untimed decode step: a serving engine's
        decode steps follow one another, and a batch's first one ran 4-5% slower than the
        next at one request on this CPU (1% at 2-4, none from 8; bench/diagnostics/decode_first_step.py)."""
        self._budget(sum(r.num_prompt_tokens for r in reqs))  # every prompt in one free step
        self._free_run(lambda: all(r.num_output_tokens >= 1 for r in reqs))
        self._budget(FULL_BUDGET)
        self.llm.step()

    def _group(self, batch: int, context: int, prompts: tuple[int, ...]) -> list[Sample]:
        """One decode step of `batch` requests at `context` tokens (their second), then one
        mixed step per prompt length in `prompts` (the same decodes + that prompt)."""
        reqs = [self._add(context - 2, len(prompts) + 3) for _ in range(batch)]
        self._warm_decode(reqs)
        out = [(("decode", batch, context), "decode", *self._timed_step())]
        for p in prompts:
            self._add(p, 1)
            out.append((("mixed", batch, context, p), "mixed", *self._timed_step()))
        self._drain()
        return out

    def _ragged(self, batch: int, mean: int) -> list[Sample]:
        """One decode step of `batch` requests whose contexts spread around `mean`."""
        ctxs = ragged_contexts(batch, mean)
        reqs = [self._add(c - 2, 3) for c in ctxs]
        self._warm_decode(reqs)
        out = [(("ragged", batch, mean), "decode", *self._timed_step())]
        self._drain()
        return out

    def step_points(self) -> list[Callable[[], list[Sample]]]:
        g = self.grid
        pts: list[Callable[[], list[Sample]]] = [
            functools.partial(self._prefill, n) for n in g.prefill_lens]
        pts += [functools.partial(self._chunk, c, q) for c, q in g.chunks]
        for c in g.decode_contexts:
            for b in g.decode_batches:
                mixed = g.mixed_prompts if (b in g.mixed_batches and c in g.mixed_contexts) else ()
                pts.append(functools.partial(self._group, b, c, mixed))
        pts += [functools.partial(self._ragged, b, c) for b, c in g.ragged]
        return pts

    def steps(self) -> list[ProfileRow]:
        g = self.grid
        points = self.step_points()
        rows: dict[tuple, ProfileRow] = {}
        shapes: dict[tuple, list[BatchShape]] = {}
        order = list(range(len(points)))
        for rnd in range(g.warmup + g.repeats):
            self.rng.shuffle(order)
            t0 = time.perf_counter()
            for i in order:
                for key, kind, dt, cpu, shape in points[i]():
                    if rnd < g.warmup:
                        continue
                    row = rows.setdefault(key, ProfileRow(kind))
                    row.times_s.append(dt)
                    row.cpu_times_s.append(cpu)
                    shapes.setdefault(key, []).append(shape)
            self.progress(f"round {rnd + 1}/{g.warmup + g.repeats}"
                          f"{' (warm-up)' if rnd < g.warmup else ''}: {len(points)} points, "
                          f"{time.perf_counter() - t0:.1f} s")
        if self.cpu_time_valid:
            wall = sum(sum(r.times_s) for r in rows.values())
            self.cpu_available = sum(sum(r.cpu_times_s) for r in rows.values()) / wall
        else:  # several threads or an accelerator: on-CPU time of this thread means nothing
            for r in rows.values():
                r.cpu_times_s = []
        for key, row in rows.items():
            row.shape = shapes[key][len(shapes[key]) // 2]
        return sorted(rows.values(), key=lambda r: (STEP_KINDS.index(r.kind), r.shape.num_reqs,
                                                    r.shape.num_tokens, r.shape.max_context))

    def linears(self) -> list[ProfileRow]:
        g = self.grid
        rows = time_linears(self.llm.model, g.linear_tokens, g.lm_head_rows, g.warmup,
                            g.repeats, self.rng)
        self.progress(f"linears: {len(g.linear_tokens)} token counts; LM head: "
                      f"{len(g.lm_head_rows)} request counts")
        return rows

    def swaps(self) -> list[ProfileRow]:
        from realexec.engine.device import synchronize

        cache = self.llm.kv_cache
        rows = []
        for n in self.grid.swap_blocks:
            pairs = [(i, i) for i in range(n)]
            out, inn = ProfileRow("swap_out", num_blocks=n), ProfileRow("swap_in", num_blocks=n)
            for r in range(self.grid.warmup + self.grid.repeats):
                for row, fn in ((out, cache.swap_out), (inn, cache.swap_in)):
                    t0 = time.perf_counter()
                    fn(pairs)
                    synchronize(cache.device)
                    if r >= self.grid.warmup:
                        row.times_s.append(time.perf_counter() - t0)
            out.num_bytes = inn.num_bytes = n * cache.spec.bytes_per_block
            rows += [out, inn]
        self.progress(f"swap: {len(self.grid.swap_blocks)} sizes")
        return rows

    def transfers(self) -> list[ProfileRow]:
        from realexec.fidelity.profile.kv_transfer import measure_transfer

        rows = []
        for n, nbytes, times in measure_transfer(
                self.llm.kv_cache, list(self.grid.transfer_tokens), self.grid.repeats,
                self.grid.warmup, torch.get_num_threads()):
            row = ProfileRow("kv_transfer", num_bytes=nbytes, times_s=times)
            row.shape.num_tokens = n
            rows.append(row)
        self.progress(f"kv transfer: {len(rows)} sizes")
        return rows

    def run(self, kinds: tuple[str, ...] = PROFILE_KINDS) -> list[ProfileRow]:
        unknown = set(kinds) - set(PROFILE_KINDS)
        if unknown:
            raise ValueError(f"profile kinds {sorted(unknown)} unknown; choose from {list(PROFILE_KINDS)}")
        rows: list[ProfileRow] = []
        if "steps" in kinds:
            rows += self.steps()
        if "linears" in kinds and (self.grid.linear_tokens or self.grid.lm_head_rows):
            rows += self.linears()
        if "swap" in kinds and self.grid.swap_blocks and self.recurrent:
            self.progress("swap: skipped (linear-attention layers: a request's recurrent state "
                          "does not move to host memory; the engine preempts by recompute)")
        elif "swap" in kinds and self.grid.swap_blocks:
            rows += self.swaps()
        if "transfer" in kinds and self.grid.transfer_tokens:
            rows += self.transfers()
        return rows
