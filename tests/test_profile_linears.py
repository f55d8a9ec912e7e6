"""The profile's `linear` and `lm_head` points run on every family the real executor serves:
each layer's mixer projections (attention, MLA, Gated DeltaNet, Mamba-2; fused or split) and
its MLP or MoE block, as the forward calls them. Before this test the walk assumed Llama's
q/k/v/o projections and a 2-D `mlp`, and `kvpd profile` failed on OPT, Phi, MLA, MoE and
hybrid models."""

from __future__ import annotations

import random

import pytest
from torch import nn

from realexec.engine.llm import LLM
from realexec.fidelity.profile.linears import layer_linears, time_linears
from tests.realexec_reference import FAMILIES, LINEAR_FAMILIES

EVERY = list(dict.fromkeys([*FAMILIES, *LINEAR_FAMILIES, "tiny-gpt2", "tiny-opt",
                            "tiny-opt-350m"]))


@pytest.fixture(scope="module")
def models() -> dict:
    return {}


def load(models: dict, name: str):
    if name not in models:
        models[name] = LLM(name, device="cpu").model
    return models[name]


@pytest.mark.parametrize("name", EVERY)
def test_the_linear_profile_runs_on_every_family(models, name) -> None:
    rows = time_linears(load(models, name), (1, 3), (1, 2), 0, 2, random.Random(0))
    assert [(r.kind, r.shape.num_tokens) for r in rows] == [
        ("linear", 1), ("linear", 3), ("lm_head", 1), ("lm_head", 2)]
    assert all(len(r.times_s) == 2 and min(r.times_s) > 0 for r in rows)


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-phi3", "tiny-phi", "tiny-opt",
                                  "tiny-deepseek-v3", "tiny-mixtral", "tiny-qwen3-next",
                                  "tiny-nemotron-h", "tiny-granite4-h"])
def test_every_projection_of_every_layer_runs_once_per_point(models, name) -> None:
    """Each `nn.Linear` inside the decoder layers runs at least once per point and the MLP or
    MoE blocks run once per layer that has one, on rows of the point's size."""
    model = load(models, name)
    seen: dict[nn.Module, list[int]] = {}
    hooks = [m.register_forward_hook(lambda mod, inp, out: seen.setdefault(mod, []).append(
        inp[0].shape[0])) for layer in model.layers for m in layer.modules()
        if isinstance(m, nn.Linear)]
    try:
        layer_linears(model)(5)
    finally:
        for h in hooks:
            h.remove()
    linears = [m for layer in model.layers for m in layer.modules() if isinstance(m, nn.Linear)]
    # (a MoE router or gate runs as a Linear only in some HF blocks; an expert may see no row)
    missed = [m for m in linears if m not in seen and not _inside_moe(model, m)]
    assert not missed, f"{name}: {len(missed)} of {len(linears)} projections never ran"
    assert all(n <= 5 for calls in seen.values() for n in calls)
    assert any(n == 5 for calls in seen.values() for n in calls)


def _inside_moe(model, module: nn.Module) -> bool:
    """Whether `module` belongs to a layer's routed-expert block (which may route no row to
    it)."""
    for layer in model.layers:
        for name in ("mlp", "block_sparse_moe", "mixer", "feed_forward"):
            block = getattr(layer, name, None)
            if block is not None and hasattr(block, "experts") and any(
                    m is module for m in block.modules()):
                return True
    return False


def test_a_model_with_a_recurrent_state_profiles_and_calibrates(tmp_path, capsys) -> None:
    """Qwen3-Next's Gated DeltaNet layers keep a state per request: `kvpd profile` computes
    its prompts for real (a decode step reads the state they built), leaves out the swap
    points and the PD serving probe, which such a model cannot run, and says so; `kvpd
    calibrate` takes the profile."""
    from kvpd.cli import main as kvpd_main
    from simulator.calibrate.profile_io import read_profile

    out = tmp_path / "profile.csv"
    assert kvpd_main(["profile", "--model", "tiny-qwen3-next", "--grid", "quick", "--threads",
                      "1", "--repeats", "2", "--serving-requests", "6", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "swap: skipped (linear-attention layers" in printed
    assert "serving probe (pd): skipped" in printed and "failed" not in printed
    kinds = set(read_profile(out).columns["kind"])
    assert {"prefill", "decode", "mixed", "linear", "lm_head", "kv_transfer"} <= kinds
    assert not kinds & {"swap_out", "swap_in"}
    assert kvpd_main(["calibrate", str(out), "--out", str(tmp_path / "cal.yaml"), "--no-plot",
                      "--accept-noisy"]) == 0
