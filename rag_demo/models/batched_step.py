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

    h_0 = embed(tokens)                                    (T, H)   T = Σ_i R_i L_i tokens
    per layer: a = attn_i(norm(h)) for each state i's rows; h = h + o(a); h = h + mlp(norm(h))
    out = norm(h), split back into (R_i, L_i, H)
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


def padded_tokens(n: int) -> int:
    """The rows the linear layers run for n tokens: n itself up to 16 (a visitor's own step), above
    that n rounded up to a multiple of 16. Every distinct row count compiles and keeps its own
    oneDNN kernels and leaves differently sized blocks in the heap; a class's steps, with
    teacher-forced answers of every length among them, would otherwise bring a new count nearly
    every step (docs/results.md §3.6)."""
    return n if n <= 16 else -(-n // 16) * 16


@torch.inference_mode()
def forward_many(model, caches: Sequence, tokens: Sequence[torch.Tensor], positions: Sequence[torch.Tensor],
                 masks: Sequence[torch.Tensor], prefill: bool = False) -> list[torch.Tensor]:
    """Run each state's tokens (R_i, L_i) at positions (R_i, L_i), its 2-D mask (R_i, S_i + L_i)
    covering the new tokens, through `model` (a *ForCausalLM of the Llama family) in one pass;
    every cache (R_i rows) gets its new keys and values in place. States may feed different
    lengths (a decoding step's one token beside a teacher-forced answer's L): the linear layers
    run over all of their T = Σ_i R_i L_i tokens as one matrix. `prefill`: every state's attention
    through SDPA, as a prompt's prefill runs it (kv_cache.shared_prefix_attention), whatever its
    length. -> each state's last hidden states (R_i, L_i, H)."""
    core = model.model
    # each state's call as the model's own forward would make it, for hooks on the body that count
    # or time model calls (measure/bound.WorkCounter): the layers below are called one by one
    calls = [{"input_ids": t, "attention_mask": m, "position_ids": p} for t, m, p in zip(tokens, masks, positions)]
    for kw in calls:
        _body_hooks(core, kw)
    shapes = [tuple(t.shape) for t in tokens]  # [(R_i, L_i)]
    sizes = [r * n for r, n in shapes]  # tokens per state
    ids = torch.cat([t.reshape(-1) for t in tokens])  # (T,)
    T = ids.shape[0]
    spare = padded_tokens(T) - T  # rows that only fill the linear layers' matrix to a common size
    ids = torch.cat([ids, ids.new_zeros(spare)])  # (T + spare,)
    hidden = core.embed_tokens(ids).unsqueeze(0)  # (1, T + spare, H)
    pos = torch.cat([p.reshape(-1) for p in positions] + [torch.zeros(spare, dtype=torch.long)])  # (T + spare,)
    cos, sin = core.rotary_emb(hidden, position_ids=pos.unsqueeze(0))
    cos, sin = cos[0], sin[0]  # (T + spare, d) each
    attn_masks = [step_mask(m, n) for m, (_, n) in zip(masks, shapes)]  # (R_i, 1, L_i, S_i)
    bounds = [0]
    for n in sizes:
        bounds.append(bounds[-1] + n)
    for layer in core.layers[: core.config.num_hidden_layers]:
        attn = layer.self_attn
        x = layer.input_layernorm(hidden)  # (1, T, H)
        q = attn.q_proj(x).view(T + spare, -1, attn.head_dim)  # (T + spare, heads, d)
        k = attn.k_proj(x).view(T + spare, -1, attn.head_dim)  # (T + spare, kv heads, d)
        v = attn.v_proj(x).view(T + spare, -1, attn.head_dim)  # (T + spare, kv heads, d)
        q, k = apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)  # each token at its own position

        def rows(t: torch.Tensor, i: int) -> torch.Tensor:  # state i's part of (T, h, d) -> (R_i, h, L_i, d)
            R, n = shapes[i]
            return t[bounds[i]: bounds[i + 1]].view(R, n, t.shape[1], t.shape[2]).transpose(1, 2)

        outs: list = [None] * len(caches)
        groups: dict[tuple[int, int], list[tuple[int, torch.Tensor, torch.Tensor]]] = {}  # (prefix, L) -> states
        for i, cache in enumerate(caches):
            keys, values = cache.update(rows(k, i), rows(v, i), attn.layer_idx)  # (R_i, kv heads, n, d)
            layer_i = cache.layers[attn.layer_idx]
            n = shapes[i][1]
            if isinstance(layer_i, SharedPrefixLayer) and n <= EAGER_MAX_QUERIES and not prefill:
                groups.setdefault((id(layer_i.prefix_k), n), []).append((i, keys, values))
            else:
                outs[i], _ = shared_prefix_attention(attn, rows(q, i), keys, values, attn_masks[i], scaling=attn.scaling,
                                                     prefix_cache=cache, prefill=prefill)  # (R_i, L_i, heads, d)
        for members in groups.values():  # the states that open with the same prefix: its scores at once
            first = caches[members[0][0]].layers[attn.layer_idx]
            got = prefix_group_attention(first, [rows(q, i) for i, _, _ in members],
                                         [kk for _, kk, _ in members], [vv for _, _, vv in members],
                                         [attn_masks[i] for i, _, _ in members], attn.scaling)
            for (i, _, _), out in zip(members, got):
                outs[i] = out  # (R_i, L_i, heads, d)
        parts = [o.reshape(-1, *o.shape[2:]) for o in outs] + ([q.new_zeros((spare, *q.shape[1:]))] if spare else [])
        a_out = parts[0] if len(parts) == 1 else torch.cat(parts)  # (T + spare, heads, d): a lone state's, uncopied
        hidden = hidden + attn.o_proj(a_out.reshape(1, T + spare, -1))  # (1, T + spare, H)
        hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))  # (1, T + spare, H)
    hidden = core.norm(hidden)[0, :T]  # (T, H)
    out = [h.view(R, n, -1) for h, (R, n) in zip(hidden.split(sizes), shapes)]  # [(R_i, L_i, H)]
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
