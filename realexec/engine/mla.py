"""DeepSeek multi-head latent attention (MLA) over the paged cache, with the model's own modules.

Per token the cache holds only the normalised KV latent (`kv_lora_rank`) and the rotary key
shared by all heads (`qk_rope_head_dim`): one plane of `kv_lora_rank + qk_rope_head_dim`
elements per layer instead of `2 x heads x head_dim`. Keys and values are rebuilt from the
cached latents with `kv_b_proj` every step, as HF's `DeepseekV3Attention` does (its cache also
stores the compressed latents), so logits match HF's forward. DeepSeek-V3.2 and GLM-5 add their
sparse attention's indexer key to the same row and attend to the keys the indexer selects
(`sparse_index.py`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import torch
from torch import nn

from realexec.engine.attention import AttentionBackend
from realexec.engine.sparse_index import SparseIndexState, index_key_dim

MLA_MODEL_TYPES = frozenset({"deepseek_v3", "deepseek_v32", "glm_moe_dsa", "glm4_moe_lite"})


def mla_cache_dim(config) -> int:
    """Elements one token's cache row takes per layer: `kv_lora_rank + qk_rope_head_dim`, plus
    `index_head_dim` for a sparse-attention indexer key (DeepSeek-V3.2, GLM-5)."""
    return int(config.kv_lora_rank) + int(config.qk_rope_head_dim) + index_key_dim(config)


def mla_rotate(sa: nn.Module) -> Callable:
    """The rotary function HF's MLA attention calls (interleaved or not), looked up once;
    V3.2's config has no `rope_interleave`: its attention always interleaves."""
    hf = sys.modules[type(sa).__module__]
    return hf.apply_rotary_pos_emb_interleave if getattr(sa.config, "rope_interleave", True) \
        else hf.apply_rotary_pos_emb


def indexer_rotate(sa: nn.Module) -> Callable:
    """The rotary HF's sparse-attention indexer calls: DeepSeek-V3.2's half-split
    (`apply_rotary_pos_emb`), GLM-5's interleaved, as its MLA."""
    hf = sys.modules[type(sa).__module__]
    return hf.apply_rotary_pos_emb_interleave if sa.config.model_type == "glm_moe_dsa" \
        else hf.apply_rotary_pos_emb


def mla_attention(
    sa: nn.Module, layer: int, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
    attn: AttentionBackend, rotate: Callable, sparse: SparseIndexState | None = None,
) -> torch.Tensor:
    """`sa.o_proj` of MLA for the flat batch `x` `[T, hidden]`; `cos`/`sin` `[T, rope_dim]`;
    `rotate`: `mla_rotate(sa)`; `sparse` (DeepSeek-V3.2, GLM-5: the forward's state): attend
    only to the keys the layer's indexer (or the one it reuses) selects."""
    t = x.shape[0]
    heads, nope, rope = sa.num_heads, sa.qk_nope_head_dim, sa.qk_rope_head_dim
    rank, dv = sa.kv_lora_rank, sa.v_head_dim
    q_latent = None
    if sa.q_lora_rank is None:
        q = sa.q_proj(x)
    else:
        q_latent = sa.q_a_layernorm(sa.q_a_proj(x))
        q = sa.q_b_proj(q_latent)
    q_pass, q_rot = q.view(t, heads, nope + rope).split([nope, rope], dim=-1)
    kv_nope, k_rot = sa.kv_a_proj_with_mqa(x).split([rank, rope], dim=-1)
    kv_nope = sa.kv_a_layernorm(kv_nope)
    q_rot, k_rot = rotate(q_rot, k_rot.view(t, 1, rope), cos, sin)  # unsqueeze_dim=1: [T, 1, r]
    q = torch.cat((q_pass, q_rot), dim=-1)
    latent = torch.cat((kv_nope.view(t, 1, rank), k_rot), dim=-1)
    select = None
    if sparse is not None:  # the indexer key rides in the latent's row
        index_key, select = sparse.select(sa, x, q_latent, cos, sin,
                                          attn.cached_rows_tail(layer, rank + rope))
        latent = torch.cat((latent, index_key.view(t, 1, -1)), dim=-1)

    def expand(lat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        n = lat.shape[0]
        k_nope, v = sa.kv_b_proj(lat[:, 0, :rank]).view(n, heads, nope + dv).split([nope, dv], -1)
        k_pe = lat[:, :, rank:rank + rope].expand(n, heads, rope)
        return torch.cat((k_nope, k_pe), dim=-1), v

    o = attn.attend_latent(layer, q, latent, expand, sa.scaling, select)
    return sa.o_proj(o.reshape(t, heads * dv))
