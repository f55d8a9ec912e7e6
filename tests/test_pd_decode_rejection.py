"""A request the decode pool refuses (longer than its whole KV pool) after the prefill pool
computed its prompt: the prefill replica frees the blocks it held for the hand-off, and the
request is counted as rejected, not lost."""

from __future__ import annotations

import pytest

from tests.sim_helpers import BASE, merged, sim


# refused at once, or once the decode instance's API server handled it (vLLM's proxy route)
@pytest.mark.parametrize("api_server", [{}, {"preprocess_s": 0.01, "pd_route": "prefill_then_decode"}])
def test_decode_side_rejection_frees_the_prefill_blocks(api_server):
    # decode pool of 40 blocks x 16 = 640 tokens: prompts of 700+ tokens fit the prefill pool
    # but never the decode pool
    res = sim(merged(BASE, {
        "api_server": api_server,
        "cluster": {"pd": {"decode": {"num_gpu_blocks": 40}}},
        "workload": {"synthetic": {"num_requests": 40,
                                   "arrival": {"process": "poisson", "rate": 20.0},
                                   "prompt_len": {"dist": "uniform", "min": 100, "max": 1200},
                                   "output_len": {"dist": "fixed", "value": 8}}},
    }))
    r = res.summary["requests"]
    assert r["rejected"] > 0 and r["finished"] > 0
    assert r["finished"] + r["rejected"] == r["total"] == 40
    for rep in res.cluster.prefill_replicas:
        sched = rep.scheduler
        assert not sched.transferring, "prefill blocks still held for rejected hand-offs"
        assert sched.kv_cache_manager.usage == 0.0
