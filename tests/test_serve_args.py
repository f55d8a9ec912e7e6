"""`kvpd serve` / `kvpd replay` scheduler flags: each reaches `realexec.LLM` as the keyword the
scenario's scheduler key names, and a bad value is refused, naming the flag, before any worker
process starts."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from kvpd.commands.serve_args import SCHEDULER_FLAGS, add_engine_args, serve_config
from simulator.core.config import SchedulerConfig


def parse(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_engine_args(p)
    return p.parse_args(list(argv))


def test_defaults_add_no_scheduler_keyword_beyond_the_limits():
    kw = serve_config(parse()).llm_kwargs
    assert {k for k in SCHEDULER_FLAGS if k in kw} == {"max_num_seqs", "max_num_batched_tokens"}


def test_each_flag_reaches_the_engine_keyword_of_its_scheduler_key():
    kw = serve_config(parse(
        "--no-chunked-prefill", "--long-prefill-token-threshold", "64", "--no-mixed-batches",
        "--recv-interval", "4", "--capacity-policy", "reserve_ratio")).llm_kwargs
    assert kw["enable_chunked_prefill"] is False
    assert kw["long_prefill_token_threshold"] == 64
    assert kw["mixed_batches"] is False
    assert kw["recv_interval"] == 4
    assert kw["capacity_policy"] == "reserve_ratio"
    kw = serve_config(parse("--batch-wait-timeout-iters", "3",
                            "--batch-wait-max-tokens-ratio", "0.5")).llm_kwargs
    assert (kw["batch_wait_timeout_iters"], kw["batch_wait_max_tokens_ratio"]) == (3, 0.5)
    # every key the flags set is a SchedulerConfig field (so the scenario key of that name)
    assert set(SCHEDULER_FLAGS) <= set(SchedulerConfig.__dataclass_fields__)


def test_the_flags_build_a_real_engine_with_those_knobs():
    from realexec.engine.llm import LLM

    cfg = serve_config(parse("--recv-interval", "3", "--no-mixed-batches",
                             "--num-gpu-blocks", "32", "--max-num-batched-tokens", "64"))
    llm = LLM(cfg.model, **cfg.llm_kwargs)
    sc = llm.scheduler.config
    assert (sc.recv_interval, sc.mixed_batches, sc.max_num_batched_tokens) == (3, False, 64)


def test_hybrid_kv_cache_reaches_the_engine():
    from realexec.engine.llm import LLM

    cfg = serve_config(parse("--model", "tiny-gpt-oss", "--hybrid-kv-cache", "--no-prefix-caching",
                             "--num-gpu-blocks", "32", "--block-size", "4"))
    assert cfg.llm_kwargs["hybrid_kv_cache"] is True
    llm = LLM(cfg.model, **cfg.llm_kwargs)
    assert llm.scheduler.cache_config.sliding_groups == 1


@pytest.mark.parametrize("argv, says", [
    (["--max-num-seqs", "0"], "--max-num-seqs must be an integer >= 1, got 0"),
    (["--recv-interval", "0"], "--recv-interval must be an integer >= 1, got 0"),
    (["--batch-wait-max-tokens-ratio", "1.5"], "--batch-wait-max-tokens-ratio must be in [0, 1]"),
    (["--batch-wait-timeout-iters", "2", "--batch-wait-max-tokens-ratio", "0.5",
      "--no-mixed-batches"], "--batch-wait-timeout-iters / --batch-wait-max-tokens-ratio"),
    (["--recv-interval", "3", "--pd", "1:1"], "the prefill workers of --pd"),
    (["--hybrid-kv-cache", "--pd", "1:1"], "--hybrid-kv-cache with --pd"),
])
def test_a_bad_value_is_refused_naming_the_flag(argv, says):
    with pytest.raises(ValueError) as err:
        serve_config(parse(*argv))
    assert says in str(err.value)


def test_kvpd_serve_refuses_before_starting_any_worker():
    out = subprocess.run([sys.executable, "-m", "kvpd.cli", "serve", "--recv-interval", "3",
                          "--pd", "1:1"], capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert "--recv-interval (3) applies to colocated replicas" in out.stderr
    assert "starting" not in out.stdout  # no worker was started
