"""One forward of a Llama-shaped decoder over the rows of several states at once, each row
attending only to its own state's keys and values (docs/DESIGN.md §5a).

A decoding step of SmolLM2-135M reads every weight whatever the number of rows, so the rows of
every visitor waiting for a step go through the linear layers (projections, MLP) as one matrix;
attention, the only part that reads a state's cache, runs per state over its own positions, and
over the shared opening once for every state that opens with the same one
(`kv_cache.prefix_group_attention`). With one state it
is the model's own forward, layer for layer; the generator runs every step through it, so a row's
numbers do not depend on which other rows share its step beyond the summation order of the
matrix products.

    h_0 = embed(tokens)                                    (N, L, H)   N = Σ_i R_i rows
    per layer: a = attn_i(norm(h)) for each state i's rows; h = h + o(a); h = h + mlp(norm(h))
    out = norm(h), split back into (R_i, L, H)
"""
from __future__ import annotations

from typing import Sequence

import torch
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from rag_demo.models.kv_cache import (
    EAGER_MAX_QUERIES, SharedPrefixLayer, prefix_group_attention, shared_prefix_attention,
)


def step_mask(mask: torch.Tensor, length: int) -> torch.Tensor:
    """A state's 2-D mask (R, S) (1 on real positions; its last `length` the new tokens) -> the
    attention mask (R, 1, L, S) (True: may attend): the padding hidden, each new token seeing
    the positions up to its own."""
    R, S = mask.shape
    seen = torch.ones((length, S), dtype=torch.bool).tril(S - length)  # (L, S) causal over the new tokens
    return mask.bool()[:, None, None, :] & seen  # (R, 1, L, S)


@torch.inference_mode()
def forward_many(model, caches: Sequence, tokens: Sequence[torch.Tensor], positions: Sequence[torch.Tensor],
                 masks: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Run each state's tokens (R_i, L) at positions (R_i, L), its 2-D mask (R_i, S_i + L) covering
    the new tokens, through `model` (a *ForCausalLM of the Llama family) in one pass; every cache
    (R_i rows) gets its new keys and values in place. -> each state's last hidden states (R_i, L, H)."""
    core = model.model
    # each state's call as the model's own forward would make it, for hooks on the body that count
    # or time model calls (measure/bound.WorkCounter): the layers below are called one by one
    calls = [{"input_ids": t, "attention_mask": m, "position_ids": p} for t, m, p in zip(tokens, masks, positions)]
    for kw in calls:
        _body_hooks(core, kw)
    sizes = [t.shape[0] for t in tokens]
    ids = torch.cat(list(tokens))  # (N, L)
    N, L = ids.shape
    hidden = core.embed_tokens(ids)  # (N, L, H)
    cos, sin = core.rotary_emb(hidden, position_ids=torch.cat(list(positions)))  # (N, L, d) each
    attn_masks = [step_mask(m, L) for m in masks]  # (R_i, 1, L, S_i)
    bounds = [0]
    for r in sizes:
        bounds.append(bounds[-1] + r)
    for layer in core.layers[: core.config.num_hidden_layers]:
        attn = layer.self_attn
        x = layer.input_layernorm(hidden)  # (N, L, H)
        shape = (N, L, -1, attn.head_dim)
        q = attn.q_proj(x).view(shape).transpose(1, 2)  # (N, heads, L, d)
        k = attn.k_proj(x).view(shape).transpose(1, 2)  # (N, kv heads, L, d)
        v = attn.v_proj(x).view(shape).transpose(1, 2)  # (N, kv heads, L, d)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        outs: list = [None] * len(caches)
        groups: dict[int, list[tuple[int, torch.Tensor, torch.Tensor]]] = {}  # prefix tensor -> its states
        for i, cache in enumerate(caches):
            a, b = bounds[i], bounds[i + 1]
            keys, values = cache.update(k[a:b], v[a:b], attn.layer_idx)  # (R_i, kv heads, n, d)
            layer_i = cache.layers[attn.layer_idx]
            if isinstance(layer_i, SharedPrefixLayer) and L <= EAGER_MAX_QUERIES:
                groups.setdefault(id(layer_i.prefix_k), []).append((i, keys, values))
            else:
                outs[i], _ = shared_prefix_attention(attn, q[a:b], keys, values, attn_masks[i], scaling=attn.scaling,
                                                     prefix_cache=cache)  # (R_i, L, heads, d)
        for members in groups.values():  # the states that open with the same prefix: its scores at once
            first = caches[members[0][0]].layers[attn.layer_idx]
            got = prefix_group_attention(first, [q[bounds[i]: bounds[i + 1]] for i, _, _ in members],
                                         [kk for _, kk, _ in members], [vv for _, _, vv in members],
                                         [attn_masks[i] for i, _, _ in members], attn.scaling)
            for (i, _, _), out in zip(members, got):
                outs[i] = out  # (R_i, L, heads, d)
        a_out = (outs[0] if len(outs) == 1 else torch.cat(outs)).reshape(N, L, -1)  # (N, L, heads·d)
        hidden = hidden + attn.o_proj(a_out)  # (N, L, H)
        hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))  # (N, L, H)
    hidden = core.norm(hidden)  # (N, L, H)
    out = list(hidden.split(sizes))  # [(R_i, L, H)]
    for kw, h in zip(calls, out):
        _body_hooks(core, kw, h)
    return out


def _body_hooks(core, kwargs: dict, out=None) -> None:
    """Run the forward pre-hooks (out None) or forward hooks registered on the model's body, with
    the keyword arguments its own forward would have had."""
    if out is None:
        for hid, hook in list(core._forward_pre_hooks.items()):
            hook(core, (), kwargs) if hid in core._forward_pre_hooks_with_kwargs else hook(core, ())
    else:
        for hid, hook in list(core._forward_hooks.items()):
            hook(core, (), kwargs, out) if hid in core._forward_hooks_with_kwargs else hook(core, (), out)
