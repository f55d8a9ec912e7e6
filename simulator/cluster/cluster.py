"""`SimCluster`: replicas built from a scenario, routers, and for PD the KV links.

Colocated: `cluster.replicas` replicas behind one router. Disaggregated (`cluster.pd`):
a prefill pool and a decode pool. After its prompt a request's KV crosses the link
of its prefill replica: the decode replica must first allocate the blocks (the
request waits in WAITING_FOR_REMOTE_KV there, and its blocks stay held on the prefill
side, so a full decode pool back-pressures the prefill pool). Only the blocks the
decode side lacks are sent. By default the first token reaches the user when the
decode replica holds the KV (as with vLLM's disaggregated proxy), so the transfer
counts in TTFT, not TPOT; `pd.first_token: prefill` streams it from the prefill
replica instead (as DistServe and kvpd's real PD front end do).

API servers (`api_server.preprocess_s` > 0, `simulator.cluster.api_server`): one in front of
each replica requests are routed to, under PD each prefill replica's; with
`api_server.pd_route: prefill_then_decode` (vLLM's disaggregated proxy sends the request to
the decode instance once the prefill answered) each decode replica's too, whose handler runs
before the decode engine takes the request and pulls its KV.

Link model: each prefill replica has one egress link of the scenario's link type,
with min(tp_prefill, tp_decode) NICs in parallel (one per GPU, as in 8-GPU nodes with
one NIC per GPU); transfers in flight on it share its bandwidth. Layer-wise transfer
overlaps the prompt's computation: the exposed share is max(1/L, 1 - compute/transfer)
of the bytes, where L is the number of layers.

Host sharing (`cluster.host_memory_share` = s, `cluster.host_compute_share` = c): all
replicas on one host (kvpd's CPU validation runs 1P1D as two processes on one machine).
While another replica is in a step whose memory share of time is f, a step streams at
1 - (1 - s) f of the bandwidth and computes at c of its speed (`simulator.cost.host_share`); a
neighbour starting or ending a step re-prices the rest of a step in progress.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import partial

import simpy

from simulator.calibrate.calibrated import at_speed, serving_speed
from simulator.cluster.api_server import APIServer
from simulator.cluster.dp_group import SimDPGroup
from simulator.cluster.links import SimLink
from simulator.cluster.replica import SimReplica
from simulator.cluster.router import Router
from simulator.cluster.timeline import Timeline
from simulator.core.config import CacheConfig, SchedulerConfig
from simulator.core.request import Request
from simulator.core.scheduler import Scheduler
from simulator.cost.costmodel import CostModel
from simulator.cost.dp_attention import DPAttentionCost
from simulator.cost.eager_dispatch import EagerDispatch
from simulator.cost.hardware import Accelerator, Link, get_accelerator, get_link
from simulator.cost.host_share import HostSharing
from simulator.cost.kernels import AttentionBackendError, fallback_grouped_gemm, kernel_profile
from simulator.cost.memory_plan import MemoryPlan
from simulator.cost.models import ModelSpec
from simulator.cost.parallel import check_a2a, check_dp_ep, check_ep
from simulator.cost.params import CALIBRATION_USE_KEYS, LOOP_FIELDS, CostParams
from simulator.scenario import PoolSpec, Scenario, Spec


def resolve_hardware(spec: Spec, scenario: Scenario,
                     role: str = "colocated") -> tuple[Accelerator, CostParams | None]:
    """A catalog name or inline spec; `{calibration: FILE, ...}` also loads fitted params,
    with `serving_speed: true` runs the device at the speed an engine of `role`
    ("colocated", "prefill", "decode") served at in the calibration's serving probe, and with
    `serving_loop: false` leaves out the calibration's serving-loop terms (`LOOP_FIELDS`: an
    engine driven in-process, without a worker loop between its steps)."""
    params, speed = None, False
    if isinstance(spec, dict) and (set(CALIBRATION_USE_KEYS) & set(spec)):
        original, spec = spec, dict(spec)
        speed = spec.pop("serving_speed", False)
        loop = spec.pop("serving_loop", True)
        for key, v in (("serving_speed", speed), ("serving_loop", loop)):
            if not isinstance(v, bool):
                raise ValueError(f"hardware.{key} must be true or false, got {v!r}")
        if "calibration" not in spec:
            given = "serving_speed" if "serving_loop" not in original else "serving_loop"
            raise ValueError(f"hardware.{given} needs hardware.calibration (the file whose "
                             "serving probe measured it)")
        path = spec.pop("calibration")
        params = CostParams.load(scenario.resolve(path))
        if not loop:
            params = dataclasses.replace(params, **dict.fromkeys(LOOP_FIELDS, 0.0))
        if not spec:
            if not params.device:
                raise ValueError("hardware.calibration file names no device; add hardware.base")
            spec = params.device
    acc = get_accelerator(spec)
    if speed:
        acc, params = at_speed(acc, params, serving_speed(params, role, f"hardware.calibration {path}"))
    return acc, params


@dataclass
class PoolPlan:
    """What one pool's replicas are made of (with data-parallel attention, `cost_model` is
    one attention rank's GPU and `dp_cost` prices the replica's lockstep steps;
    `num_gpu_blocks` is one rank's)."""

    role: str
    spec: PoolSpec
    accelerator: Accelerator
    cost_model: CostModel
    memory: MemoryPlan
    num_gpu_blocks: int
    num_cpu_blocks: int
    dp_cost: DPAttentionCost | None = None


def pool_cache_config(sc: Scenario, model: ModelSpec, plan: PoolPlan) -> CacheConfig:
    """The `CacheConfig` of a replica of the pool `plan` plans: its blocks, and the layout the
    model and the memory plan give them (sliding windows, KV cache groups, linear-attention
    state)."""
    return CacheConfig(
        num_gpu_blocks=plan.num_gpu_blocks, block_size=sc.cache.block_size,
        num_cpu_blocks=plan.num_cpu_blocks,
        # (a linear-attention state is not cached by prefix: linear_attention_note)
        enable_prefix_caching=sc.cache.enable_prefix_caching and not model.has_linear_attention,
        block_bytes=int(plan.memory.kv_bytes_per_block),
        # sliding layers' attention (sparse attention: its top-k) is capped at the window in
        # the shapes; blocks slide out of the pool only when every layer slides (one block
        # table serves all layers; sparse attention may pick any earlier key)
        sliding_window=model.attention_window,
        free_outside_window=model.num_sliding_layers == model.num_layers,
        state_blocks=plan.memory.state_blocks_per_request,
        # KV cache groups of the sliding layers (vLLM V1's hybrid KV cache manager)
        sliding_groups=plan.memory.sliding_groups,
    )


def plan_pool(scenario: Scenario, model: ModelSpec, spec: PoolSpec, role: str) -> PoolPlan:
    acc, params = resolve_hardware(spec.hardware or scenario.hardware, scenario, role)
    key = "cluster.ep" if role == "colocated" else f"cluster.pd.{role}.ep"
    try:
        check_ep(model, spec.tp, spec.ep)
    except ValueError as exc:
        raise ValueError(f"{key}: {exc}") from None
    a2a_key = ("cluster.moe_a2a_backend" if role == "colocated"
               else f"cluster.pd.{role}.moe_a2a_backend")
    check_a2a(spec.moe_a2a_backend, spec.ep, spec.tp, a2a=f"{a2a_key}:", ep_key=key,
              tp_key=key.removesuffix("ep") + "tp")
    if spec.ep_link != "scale_up" and spec.moe_a2a_backend == "none":
        raise ValueError(f"{key}_link: {spec.ep_link} is the link of the MoE all-to-all, which "
                         f"{a2a_key}: none does not run (the TP all-reduce uses the "
                         "replica's own link); set moe_a2a_backend: all_to_all or drop ep_link")
    ep_link = None
    if spec.ep > 1 and spec.ep_link == "scale_out":
        ep_link = acc.link("scale_out")
        if ep_link is None:
            raise ValueError(f"{key}_link: scale_out, but {acc.name} names no scale-out link")
    if scenario.cluster.fused_moe_config == "legacy_default":
        try:
            if not model.is_moe:
                raise ValueError(f"{model.name} is a dense model")
            fallback_grouped_gemm(kernel_profile(acc), acc.name)
        except ValueError as exc:
            raise ValueError(f"cluster.fused_moe_config: legacy_default, but {exc}; use tuned") from None
    cache = scenario.cache
    dp = scenario.cluster.dp_attention and role == "colocated"
    if dp and not model.is_moe:
        raise ValueError(f"cluster.dp_attention: {model.name} is a dense model; data-parallel "
                         "attention pays off where MoE layers are shared across the ranks "
                         "(use cluster.replicas for independent copies of a dense model)")
    if dp:
        check_dp_ep(spec.ep, spec.tp, dp="cluster.dp_attention", ep_key=key, tp_key="cluster.tp")
    if dp and scenario.scheduler.preemption_mode == "swap":
        raise ValueError("cluster.dp_attention: scheduler.preemption_mode swap is not modelled "
                         "with data-parallel attention; use recompute")

    graphs = scenario.cluster.prefill_graph_max_tokens  # steps outside CUDA graphs
    eager = (None if graphs is None
             else EagerDispatch(graphs, scenario.cluster.eager_layer_s))

    def cost_model(tp: int, ep: int) -> CostModel:
        return CostModel(model, acc, scenario.dtype, tp, spec.pp, params,
                         kv_cache_dtype=cache.kv_cache_dtype,
                         quantization=scenario.quantization_mapping(), ep=ep,
                         ep_link=ep_link, allreduce=scenario.cluster.allreduce,
                         moe_a2a_backend=spec.moe_a2a_backend,
                         fused_moe_config=scenario.cluster.fused_moe_config,
                         attention_backend=(spec.attention_backend
                                            or scenario.cluster.attention_backend),
                         eager=eager, host_request_s=scenario.cluster.host_request_s or 0.0,
                         async_scheduling=bool(scenario.cluster.async_scheduling))
    try:
        cost = cost_model(spec.tp, spec.ep)
        dp_cost = DPAttentionCost(cost_model(1, 1), cost) if dp else None
    except AttentionBackendError as exc:
        key = ("cluster.attention_backend" if spec.attention_backend is None
               else f"cluster.pd.{role}.attention_backend")
        raise ValueError(f"{role} pool: {key}: {exc}") from None
    except ValueError as exc:  # a precision the part cannot run: name the scenario keys
        raise ValueError(f"{role} pool: dtype/quantization/cache.kv_cache_dtype: {exc}") from None
    mem = scenario.memory_plan(model, acc, spec.tp, spec.pp, spec.ep)
    blocks = spec.num_gpu_blocks or cache.num_gpu_blocks or mem.num_gpu_blocks
    if blocks < 1:
        raise ValueError(f"{role} pool: the memory plan leaves no room for KV blocks ({mem.to_dict()})")
    if model.has_linear_attention and scenario.scheduler.preemption_mode == "swap":
        raise ValueError(f"scheduler.preemption_mode: swap does not move the recurrent state of "
                         f"{model.name}'s linear-attention layers; use recompute")
    cpu_blocks = (int(cache.swap_space_gb * 1e9 // mem.kv_bytes_per_block)
                  if cache.swap_space_gb and not model.has_linear_attention else 0)
    if scenario.scheduler.preemption_mode == "swap" and cpu_blocks == 0:
        raise ValueError(f"scheduler.preemption_mode: swap needs a host pool, but "
                         f"cache.swap_space_gb = {cache.swap_space_gb} holds no {role} KV block "
                         f"({mem.kv_bytes_per_block / 1e6:.3g} MB each); set it larger, or use "
                         "preemption_mode: recompute")
    if dp_cost is not None:
        return PoolPlan(role, spec, acc, dp_cost.attention, mem, blocks, cpu_blocks, dp_cost)
    return PoolPlan(role, spec, acc, cost, mem, blocks, cpu_blocks)


def _shares_host(scenario: Scenario) -> bool:
    """Whether the replicas share one host's memory bandwidth or compute
    (`cluster.host_memory_share` / `host_compute_share` below 1)."""
    c = scenario.cluster
    return (c.host_memory_share or 1.0) < 1 or (c.host_compute_share or 1.0) < 1


def _decoding_pool_router(scenario: Scenario) -> tuple[int, str]:
    """(replicas, router) of the pool whose replicas decode, the only ones that burst: the
    colocated pool, or PD's decode pool."""
    c = scenario.cluster
    return (c.replicas, c.router) if c.pd is None else (c.pd.decode.replicas, c.pd.decode.router)


def pool_specs(scenario: Scenario) -> list[tuple[str, PoolSpec]]:
    """(role, pool) of each pool the cluster builds: one colocated pool, or PD's prefill
    and decode pools."""
    c = scenario.cluster
    if c.pd is None:
        return [("colocated", PoolSpec(replicas=c.replicas, tp=c.tp, pp=c.pp, ep=c.ep,
                                       ep_link=c.ep_link, moe_a2a_backend=c.moe_a2a_backend,
                                       router=c.router))]
    return [("prefill", c.pd.prefill), ("decode", c.pd.decode)]


class SimCluster:
    def __init__(self, env: simpy.Environment, scenario: Scenario, model: ModelSpec,
                 timeline: Timeline, on_finished, replica_names: list[str] | None = None) -> None:
        """`replica_names`: build only these replicas of a colocated cluster (one process's
        share of a run split across processes, `simulator.multiproc`)."""
        self.env = env
        self.scenario = scenario
        self.model = model
        self.timeline = timeline
        self._on_finished = on_finished
        self.groups: list[SimDPGroup] = []  # data-parallel attention: one per replica
        # the API server in front of each replica requests arrive at (a DP group's ranks share
        # their group's), by the name routers pick; and each once, by its replica's (or
        # group's) name. Only when its handlers take time (`api_server.preprocess_s`)
        self.api_servers: dict[str, APIServer] = {}
        self.front_ends: dict[str, APIServer] = {}
        c = scenario.cluster
        self.pools = [plan_pool(scenario, model, pool, role)
                      for role, pool in pool_specs(scenario)]
        if c.pd is None:
            self.replicas = self._make_replicas(self.pools[0], "colocated", replica_names)
            self.router = Router(self.replicas, c.router, c.router_load_cap)
            self.decode_router = None
        else:
            pre, dec = self.pools
            self.prefill_replicas = self._make_replicas(pre, "prefill")
            self.decode_replicas = self._make_replicas(dec, "decode")
            self.replicas = self.prefill_replicas + self.decode_replicas
            self.router = Router(self.prefill_replicas, pre.spec.router, c.router_load_cap)
            self.decode_router = Router(self.decode_replicas, dec.spec.router, c.router_load_cap)
            link: Link = get_link(c.pd.link)
            nics = min(pre.spec.tp, dec.spec.tp)
            self.kv_links = {
                r.name: SimLink(env, f"kv-{r.name}", link.bandwidth_bytes_per_s * nics, link.latency_s)
                for r in self.prefill_replicas
            }
            self.layerwise = c.pd.transfer == "layerwise"
            self.first_token_at_decode = c.pd.first_token == "decode"
        if _shares_host(scenario):
            self._share_host(c.host_memory_share or 1.0, c.host_compute_share or 1.0)
        elif self._unobserved(scenario):
            for r in self.replicas:
                r.scheduler.burst_past_finishes = True

    def _unobserved(self, scenario: Scenario) -> bool:
        """Whether nothing reads a replica's state between its steps, so that a decode burst
        may run past finishing requests (`simulator.core.decode_burst`): no closed loop (it
        submits on each finish), no timeline rows, and a router per pool that reads no
        replica state (round robin) or has one replica to pick. Host sharing is excluded by
        the caller (a neighbour re-prices steps as they start and end)."""
        if scenario.workload.max_concurrency is not None or scenario.output.timeseries:
            return False
        n, router = _decoding_pool_router(scenario)
        return n == 1 or router == "round_robin"

    def _share_host(self, memory_share: float, compute_share: float) -> None:
        """Every replica is every other's neighbour on one host (`simulator.cost.host_share`,
        `SimReplica._durations`)."""
        pools = ([self.replicas] if self.scenario.cluster.pd is None
                 else [self.prefill_replicas, self.decode_replicas])
        for plan, replicas in zip(self.pools, pools):
            sharing = HostSharing(plan.cost_model, memory_share, compute_share)
            for r in replicas:
                r.host_sharing = sharing
                r.neighbours = [n for n in self.replicas if n is not r]

    def _make_replicas(self, plan: PoolPlan, role: str,
                       only: list[str] | None = None) -> list[SimReplica]:
        sc = self.scenario
        s = sc.scheduler
        max_model_len = s.max_model_len or self.model.max_position_embeddings
        sched_cfg = SchedulerConfig(
            max_num_seqs=s.max_num_seqs, max_num_batched_tokens=s.max_num_batched_tokens,
            max_model_len=max_model_len, enable_chunked_prefill=s.enable_chunked_prefill,
            long_prefill_token_threshold=s.long_prefill_token_threshold,
            preemption_mode=s.preemption_mode, policy=s.policy, batching=s.batching, role=role,
            capacity_policy=s.capacity_policy, mixed_batches=s.mixed_batches,
            first_token_from_decode=s.first_token_from_decode,
            schedule_conservativeness=s.schedule_conservativeness,
            prompt_allocation=s.prompt_allocation, admission_watermark=s.admission_watermark,
            append_needs_free_block=s.append_needs_free_block,
            recv_interval=s.recv_interval,
            batch_wait_timeout_iters=s.batch_wait_timeout_iters,
            batch_wait_max_tokens_ratio=s.batch_wait_max_tokens_ratio,
        )
        cache_cfg = pool_cache_config(sc, self.model, plan)
        pcie_link = plan.accelerator.link("pcie")
        # least_kv_usage reads each replica's KV usage, which changes inside a decode burst (a
        # decode's new block): a replica reports mid-burst what stepping one by one would show
        # (`SimReplica.kv_usage`), from the blocks each step takes; where steps also free
        # blocks (every layer sliding, or KV cache groups of sliding layers) or a neighbour
        # re-prices them (host sharing), it steps
        # one by one instead
        n, router = _decoding_pool_router(sc)  # (prefill replicas never burst)
        read_usage = router == "least_kv_usage" and n > 1
        max_burst = sc.sim.max_decode_burst
        if read_usage and (cache_cfg.free_outside_window or cache_cfg.sliding_groups
                           or _shares_host(sc)):
            max_burst = 1
        front = sc.api_server
        # decodes arrive by KV hand-off, through a server only on vLLM's proxy route
        served = front.preprocess_s > 0 and (role != "decode"
                                              or front.pd_route == "prefill_then_decode")
        out = []
        for i in range(plan.spec.replicas):
            name = f"{role[0]}{i}" if role != "colocated" else f"r{i}"
            if only is not None and name not in only:
                continue
            if plan.dp_cost is not None:  # tp attention ranks, stepped by one group
                made = [SimReplica(self.env, f"{name}.dp{j}", Scheduler(sched_cfg, cache_cfg),
                                   plan.cost_model, None, self.timeline,
                                   on_finished=self._on_finished, start=False)
                        for j in range(plan.spec.tp)]
                self.groups.append(SimDPGroup(self.env, name, made, plan.dp_cost, self.timeline))
            else:
                pcie = SimLink(self.env, f"pcie-{name}", pcie_link.bandwidth_bytes_per_s,
                               pcie_link.latency_s) if pcie_link else None
                made = [SimReplica(
                    self.env, name, Scheduler(sched_cfg, cache_cfg), plan.cost_model, pcie,
                    self.timeline, max_decode_burst=max_burst,
                    on_finished=self._on_finished,
                    on_kv_ready=self._on_kv_ready if role == "prefill" else None,
                    on_kv_to_receive=self._on_kv_to_receive if role == "decode" else None,
                )]
                made[0].track_burst_usage = read_usage
            if served:  # one server per replica name (a DP group's ranks share it)
                server = self.front_ends[name] = APIServer(self.env, front.preprocess_s,
                                                           front.processes)
                self.api_servers.update((r.name, server) for r in made)
            out += made
        return out

    # ---- arrivals ----
    def submit(self, req: Request) -> None:
        rep = self.router.route(req)
        rep.assign(req)  # routed (and counted) now; in the engine once its API server handled it
        server = self.api_servers.get(rep.name)
        if server is None:
            rep.admit(req)
        else:
            server.submit(req, rep.admit)

    # ---- PD hand-off ----
    def _on_kv_ready(self, prefill: SimReplica, reqs: list[Request]) -> None:
        now = self.env.now
        refused = False
        for req in reqs:
            prefill.outstanding_tokens -= req.num_prompt_tokens + req.max_tokens
            req.annotations["prefill_replica"] = prefill.name
            req.annotations["kv_ready_s"] = now
            decode = self.decode_router.route(req)
            decode.assign(req)
            server = self.api_servers.get(decode.name)
            if server is None:
                refused |= self._to_decode_engine(decode, prefill, req)
            else:  # the proxy's second request: its decode server first
                server.submit(req, partial(self._admit_decode, decode, prefill))
        if refused:
            prefill.wake()

    def _to_decode_engine(self, decode: SimReplica, prefill: SimReplica, req: Request) -> bool:
        """Hand a prefilled request to its decode engine; True if the engine refused it
        (nothing will take its KV: the prefill frees it, and must be woken)."""
        decode.admit(req)
        if not req.is_finished:
            return False
        prefill.scheduler.release_transferred(req.request_id)
        return True

    def _admit_decode(self, decode: SimReplica, prefill: SimReplica, req: Request) -> None:
        """`_to_decode_engine` once the decode-side API server has handled the request."""
        if self._to_decode_engine(decode, prefill, req):
            prefill.wake()

    def _on_kv_to_receive(self, decode: SimReplica, items: list[tuple[Request, int]]) -> None:
        for req, cached in items:
            self.env.process(self._transfer(decode, req, cached))

    def _transfer(self, decode: SimReplica, req: Request, cached_tokens: int):
        env = self.env
        prefill_name = req.annotations["prefill_replica"]
        prefill = next(r for r in self.prefill_replicas if r.name == prefill_name)
        link = self.kv_links[prefill_name]
        nbytes = self.pools[0].cost_model.kv_transfer_bytes(req.num_prompt_tokens - cached_tokens)
        if self.layerwise and nbytes:
            compute_s = req.annotations["kv_ready_s"] - (req.first_scheduled_time or 0.0)
            alone = link.transfer_time_alone(nbytes)
            exposed = max(1.0 / self.model.num_layers, 1.0 - compute_s / alone) if alone > 0 else 1.0
            nbytes = nbytes * min(exposed, 1.0)
        start = env.now
        self.timeline.record_link(link.name, start, link.num_active + 1)
        yield link.transfer(nbytes)
        req.annotations["kv_transfer_s"] = env.now - start
        req.annotations["kv_bytes"] = nbytes
        prefill.scheduler.release_transferred(req.request_id)
        prefill.wake()
        if req.is_finished:  # aborted meanwhile
            return
        decode.scheduler.on_kv_received(req.request_id)
        decode.kv_landed(req.num_prompt_tokens - cached_tokens)
        if self.first_token_at_decode:  # the user sees it once the decode replica holds the KV
            req.token_times[0] = env.now
            req.first_token_time = env.now
        decode.wake()

    # ---- statistics ----
    def num_steps(self) -> int:
        """Engine steps run: each replica's, a data-parallel-attention group's once for all
        its ranks."""
        grouped = {r.name for g in self.groups for r in g.ranks}
        return (sum(r.num_steps for r in self.replicas if r.name not in grouped)
                + sum(g.num_steps for g in self.groups))

    def kv_peak_usage(self) -> float:
        return max(r.scheduler.kv_cache_manager.peak_usage for r in self.replicas)

    def prefix_tokens(self) -> tuple[int, int]:
        """(prompt tokens looked up in the prefix cache, tokens found) over every replica."""
        kvms = [r.scheduler.kv_cache_manager for r in self.replicas]
        return (sum(k.prefix_queries_tokens for k in kvms), sum(k.prefix_hit_tokens for k in kvms))
