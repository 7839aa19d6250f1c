"""The decoder-only generator's key/value cache: layers that grow in place, the attention that
reads a prefix shared by every prompt once (`SharedPrefixLayer`, `shared_prefix_attention`), and
row selection for beam reordering.

transformers' DynamicCache concatenates at every step and copies the whole cache on every
reorder; these layers keep one buffer per layer (docs/DESIGN.md, the generator section).
"""
from __future__ import annotations

from typing import Sequence

import torch
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer, EncoderDecoderCache
from transformers.integrations.sdpa_attention import sdpa_attention_forward



# A prefix shorter than this runs with the rest of the prompt: one more model call costs more
# than recomputing a few tokens per row.
MIN_SHARED_PREFIX = 16


def shared_prefix(prompts: Sequence[Sequence[int]], keep: int = 1) -> int:
    """The length of the token prefix every prompt shares, leaving at least `keep` tokens of
    each prompt after it (0 for one prompt, or when shorter than MIN_SHARED_PREFIX)."""
    if len(prompts) < 2:
        return 0
    n = min(len(p) for p in prompts) - keep
    first = prompts[0]
    for i in range(max(0, n)):
        if any(p[i] != first[i] for p in prompts[1:]):
            n = i
            break
    return n if n >= MIN_SHARED_PREFIX else 0


class GrowingLayer(DynamicLayer):
    """A KV cache layer whose keys and values live in a buffer grown GROW tokens at a time.

    transformers' DynamicLayer concatenates at every step: a new (R, heads, n+1, d) tensor per
    layer per token, the whole cache copied each time (13% of CPU time in a RAG-Token profile)
    and the allocator churned. Here a step writes its token into spare room; `keys`/`values`
    are views of the first n positions, so the model reads exactly what it read before."""

    GROW = 64

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self._k = self._v = None  # (R, heads, capacity, d) buffers
        self._n = 0

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n, L = self._n, key_states.shape[-2]
        if self._k is None or n + L > self._k.shape[-2]:  # grow: one copy per GROW tokens
            shape = (*key_states.shape[:-2], n + L + self.GROW, key_states.shape[-1])
            k, v = key_states.new_empty(shape), value_states.new_empty(shape)
            if n:
                k[..., :n, :], v[..., :n, :] = self.keys, self.values
            self._k, self._v = k, v
        self._k[..., n: n + L, :] = key_states
        self._v[..., n: n + L, :] = value_states
        self._n = n + L
        self.keys, self.values = self._k[..., : self._n, :], self._v[..., : self._n, :]
        return self.keys, self.values

    def _blank(self) -> "GrowingLayer":
        """An empty layer of the same kind (SharedPrefixLayer: over the same shared prefix)."""
        return GrowingLayer()

    def holding(self, k: torch.Tensor, v: torch.Tensor, n: int) -> "GrowingLayer":
        """This (empty) layer made to hold the first n positions of the buffers k, v (R, heads,
        capacity, d), which become its own: the rest is spare room the next tokens are written into."""
        self.lazy_initialization(k, v)
        self._k, self._v, self._n = k, v, n
        self.keys, self.values = k[..., :n, :], v[..., :n, :]  # (R, heads, n, d) views
        return self

    def selected(self, rows: torch.Tensor) -> "GrowingLayer":
        """A new layer holding `rows` (the source is unchanged). One copy: the rows of the whole
        buffer, spare room included, become the new layer's buffer (index_select then `update`
        copied every position twice: a fifth of a RAG-Token answer's CPU time went to copies)."""
        out = self._blank()
        if not (self.is_initialized and self._n):
            return out
        if self._k is None:  # transformers edited the cache in place (_forget_buffer): no spare room
            out.update(self.keys.index_select(0, rows), self.values.index_select(0, rows))
            return out
        out.lazy_initialization(self.keys, self.values)
        out._k, out._v, out._n = self._k.index_select(0, rows), self._v.index_select(0, rows), self._n  # (R', h, cap, d)
        out.keys, out.values = out._k[..., : out._n, :], out._v[..., : out._n, :]
        return out

    def can_reselect(self, rows: int) -> bool:
        """Whether `reselect` can keep `rows` rows in place: an empty layer, or one whose own
        buffer holds at least that many rows."""
        return not (self.is_initialized and self._n) or (self._k is not None and rows <= self._k.shape[0])

    def reselect(self, rows: torch.Tensor) -> None:
        """`selected` made in place, for a layer only its caller holds (a search's own rows): row i
        becomes row rows[i] (R',), R' at most the rows held (`can_reselect`). Only the rows whose
        source differs are copied, and only their held positions: a beam search that keeps most of
        its beams where they were copies a few rows, not every row's whole buffer."""
        if not (self.is_initialized and self._n):
            return
        n = self._n
        moved = (rows != torch.arange(rows.numel())).nonzero().squeeze(1)  # (M,) rows given another's
        if moved.numel():
            src = rows.index_select(0, moved)  # (M,) read whole before any is written
            self._k[moved, :, :n] = self._k[src, :, :n]  # (M, heads, n, d)
            self._v[moved, :, :n] = self._v[src, :, :n]
        self._k, self._v = self._k[: rows.numel()], self._v[: rows.numel()]  # (R', heads, capacity, d) views
        self.keys, self.values = self._k[..., :n, :], self._v[..., :n, :]

    def cropped(self, n: int) -> "GrowingLayer":
        """A new layer holding the first n positions (a copy; the source is unchanged)."""
        out = GrowingLayer()
        if self.is_initialized and self._n and n:
            out.update(self.keys[..., :n, :], self.values[..., :n, :])  # update copies into its own buffer
        return out

    def _forget_buffer(self) -> None:  # after transformers' own in-place edits (crop, reorder, ...)
        self._k = self._v = None
        self._n = 0 if self.keys is None or not self.keys.numel() else self.keys.shape[-2]

    def crop(self, tokens_to_remove: int) -> None:
        super().crop(tokens_to_remove)
        self._forget_buffer()

    def batch_repeat_interleave(self, repeats: int) -> None:
        super().batch_repeat_interleave(repeats)
        self._forget_buffer()

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        super().batch_select_indices(indices)
        self._forget_buffer()

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        super().reorder_cache(beam_idx)
        self._forget_buffer()


class SharedPrefixLayer(GrowingLayer):
    """A GrowingLayer for rows that all open with the same prefix: the prefix's keys and values
    are held once, (1, heads, P, d), and only each row's own positions after it live in the
    growing buffer, (R, heads, n, d).

    The K doc prompts of a question share ~400 of their ~550 tokens (system prompt, worked
    examples), so holding them once makes every `selected` copy (beam reorders, teacher-forced
    chunks) about a third as large, and `shared_prefix_attention` reads them once for all rows.
    The model sees a cache of P + n positions (get_seq_length, and so its masks); `update`
    returns only the rows' own keys and values, which is what `shared_prefix_attention` expects:
    a model using this cache must run with that attention (DecoderOnlyGenerator sets it)."""

    def __init__(self, prefix_k: torch.Tensor, prefix_v: torch.Tensor):
        super().__init__()
        self.prefix_k, self.prefix_v = prefix_k, prefix_v  # (1, heads, P, d), never written

    def _blank(self) -> "SharedPrefixLayer":
        return SharedPrefixLayer(self.prefix_k, self.prefix_v)

    def get_seq_length(self) -> int:
        return self.prefix_k.shape[-2] + super().get_seq_length()

    def cropped(self, n: int) -> "GrowingLayer":
        raise ValueError("cropped() of a SharedPrefixLayer: crop the one-row cache the prefix came from instead.")


def shared_prefix_attention(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                            attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                            prefix_cache: Cache | None = None, prefill: bool = False, **kwargs
                            ) -> tuple[torch.Tensor, None]:
    """Attention over a shared prefix plus each row's own positions (SharedPrefixLayer), exact.

    Up to EAGER_MAX_QUERIES queries a row (a decoding step, a teacher-forced answer):
    softmax_j(q·k_j · scaling) over j in [prefix (P), row's own (n)], the prefix's scores for all R
    rows from one matmul per key/value head (R·g·L queries against P keys, g = query heads per kv
    head: grouped-query attention without repeating the keys), the rows' own from a batched
    matmul; one softmax over both. The prefix holds real tokens every row shares and precedes
    every query, so it is visible to all of them; the mask (R or 1, 1, L, P + n) applies to the
    rows' own positions, its last n columns. More queries (a prefill: compute-bound, where SDPA's
    fused kernel is faster than these matmuls): the prefix joins each row's keys and SDPA runs
    as usual (it repeats the keys per query head: with many rows and few queries, as when
    teacher-forcing a dozen candidates, those copies cost more than the attention). `prefill`:
    SDPA whatever the number of queries, so a prompt's last tokens run after its kept passages
    (`passage_prefill.PassagePrefill.run`) read them as a prefill of the whole prompt does
    (in bfloat16 the matmuls here round the scores to bfloat16, SDPA does not).

    Any other cache (no `prefix_cache` passed, or its layer holds no prefix): transformers' SDPA
    attention unchanged. query (R, H, L, d), key/value (R, Hkv, n, d) -> (R, L, H, d)."""
    layer = None if prefix_cache is None else prefix_cache.layers[module.layer_idx]
    if not isinstance(layer, SharedPrefixLayer):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    R, H, L, d = query.shape
    if L > EAGER_MAX_QUERIES or prefill:  # a prefill: compute-bound, where SDPA's fused kernel is faster
        full_k = torch.cat([layer.prefix_k.expand(R, -1, -1, -1), key], dim=2)  # (R, Hkv, P+n, d)
        full_v = torch.cat([layer.prefix_v.expand(R, -1, -1, -1), value], dim=2)  # (R, Hkv, P+n, d)
        return sdpa_attention_forward(module, query, full_k, full_v, attention_mask, dropout=dropout,
                                      scaling=scaling, **kwargs)
    return prefix_group_attention(layer, [query], [key], [value], [attention_mask], scaling)[0], None


def prefix_group_attention(layer: "SharedPrefixLayer", queries: list[torch.Tensor], keys: list[torch.Tensor],
                           values: list[torch.Tensor], masks: list, scaling: float | None = None) -> list[torch.Tensor]:
    """`shared_prefix_attention`'s eager path for several states whose caches open with the same
    prefix tensors (`layer`'s, held once: OpeningKV hands every question with that opening the same
    ones): the prefix's scores and its share of the output for every state's rows from one matmul
    per kv head, the rows' own positions per state, one softmax per row over both, exact.

        out_i = softmax_j(q·k_j · scaling) v_j,   j in [prefix (P), state i's own (n_i)]

    queries[i] (R_i, H, L, d), keys[i] / values[i] (R_i, Hkv, n_i, d), masks[i] (R_i|1, 1, L, P+n_i)
    or None -> [(R_i, L, H, d)]."""
    pk, pv = layer.prefix_k[0], layer.prefix_v[0]  # (Hkv, P, d)
    Hkv, P = pk.shape[0], pk.shape[1]
    _, H, L, d = queries[0].shape
    g = H // Hkv
    scaling = d ** -0.5 if scaling is None else scaling
    qs = [(q * scaling).reshape(q.shape[0], Hkv, g * L, d) for q in queries]  # (R_i, Hkv, gL, d): head h reads h // g
    sizes = [q.shape[0] for q in qs]
    N = sum(sizes)
    q_all = qs[0] if len(qs) == 1 else torch.cat(qs)  # (N, Hkv, gL, d)
    qp = q_all.transpose(0, 1).reshape(Hkv, N * g * L, d)  # (Hkv, N·gL, d)
    s_pre = torch.bmm(qp, pk.transpose(1, 2)).view(Hkv, N, g * L, P).transpose(0, 1)  # (N, Hkv, gL, P)
    if len(qs) > 1 and L == 1:  # decoding steps: every state's own positions padded into one batch
        return _padded_own(qs, keys, values, masks, s_pre, pv, sizes, H, d)
    own_out, pre_probs, at = [], [], 0
    for q, key, value, mask, R in zip(qs, keys, values, masks, sizes):
        n = key.shape[2]
        s_own = torch.matmul(q, key.transpose(2, 3)).view(R, Hkv, g, L, n)  # (R, Hkv, g, L, n)
        if mask is not None:
            m = mask[..., -n:].unsqueeze(2)  # (R|1, 1, 1, L, n)
            s_own = s_own.masked_fill(~m, float("-inf")) if m.dtype == torch.bool else s_own + m
        elif L > 1:  # no mask given: causal within the rows' own positions (query i sits at n - L + i)
            s_own = s_own.masked_fill(~torch.ones(L, n, dtype=torch.bool).tril(n - L), float("-inf"))  # (L, n)
        scores = torch.cat([s_pre[at: at + R], s_own.view(R, Hkv, g * L, n)], dim=-1)  # (R, Hkv, gL, P+n)
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)  # (R, Hkv, gL, P+n)
        pre_probs.append(probs[..., :P])  # (R, Hkv, gL, P)
        own_out.append(torch.matmul(probs[..., P:], value))  # (R, Hkv, gL, d)
        at += R
    pp = (pre_probs[0] if len(pre_probs) == 1 else torch.cat(pre_probs)).transpose(0, 1).reshape(Hkv, N * g * L, P)
    out_pre = torch.bmm(pp, pv).view(Hkv, N, g * L, d).transpose(0, 1)  # (N, Hkv, gL, d)
    out, at = [], 0
    for o, R in zip(own_out, sizes):
        both = out_pre[at: at + R] + o  # (R, Hkv, gL, d)
        out.append(both.reshape(R, H, L, d).transpose(1, 2).contiguous())  # (R, L, H, d)
        at += R
    return out


def _padded_own(qs, keys, values, masks, s_pre, pv, sizes, H, d) -> list[torch.Tensor]:
    """`prefix_group_attention` at one query a row (a decoding step) for several states: their own
    keys and values copied into one padded batch (N, Hkv, n_max, d), the padding masked out,
    so the rows' own scores, the softmax and the values' product are one call each, not one per
    state. Padding adds exact zeros to every sum: the same numbers up to summation order."""
    Hkv, P = pv.shape[0], pv.shape[1]
    gL = qs[0].shape[2]
    N, n_max = sum(sizes), max(k.shape[2] for k in keys)
    # not zero-filled whole: a padded key's score is masked to -inf whatever it holds; a padded
    # value is read with probability 0, so it is zeroed (0 x garbage could be NaN)
    k_all = keys[0].new_empty((N, Hkv, n_max, d))  # (N, Hkv, n_max, d)
    v_all = values[0].new_empty((N, Hkv, n_max, d))  # (N, Hkv, n_max, d)
    seen = torch.zeros((N, 1, 1, n_max), dtype=torch.bool)  # (N, 1, 1, n_max) real, unmasked positions
    at = 0
    for key, value, mask, R in zip(keys, values, masks, sizes):
        n = key.shape[2]
        k_all[at: at + R, :, :n] = key
        v_all[at: at + R, :, :n] = value
        v_all[at: at + R, :, n:] = 0
        seen[at: at + R, ..., :n] = True if mask is None else mask[..., -n:]  # (R|1, 1, 1, n)
        at += R
    q_all = torch.cat(qs)  # (N, Hkv, gL, d)
    s_own = torch.matmul(q_all, k_all.transpose(2, 3)).masked_fill(~seen, float("-inf"))  # (N, Hkv, gL, n_max)
    scores = torch.cat([s_pre, s_own], dim=-1)  # (N, Hkv, gL, P+n_max)
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q_all.dtype)  # (N, Hkv, gL, P+n_max)
    pp = probs[..., :P].transpose(0, 1).reshape(Hkv, N * gL, P)  # (Hkv, N·gL, P)
    out = torch.bmm(pp, pv).view(Hkv, N, gL, d).transpose(0, 1)  # (N, Hkv, gL, d)
    out = out + torch.matmul(probs[..., P:], v_all)  # (N, Hkv, gL, d)
    both = out.reshape(N, H, 1, d).transpose(1, 2).contiguous()  # (N, 1, H, d)
    return list(both.split(sizes))


SHARED_PREFIX_ATTENTION = "rag_shared_prefix"
# Queries a row up to which shared_prefix_attention computes attention itself (decoding steps,
# teacher-forced answers of up to 32 tokens); longer runs (prefills) go to SDPA.
EAGER_MAX_QUERIES = 32


def use_shared_prefix_attention(model) -> None:
    """Register `shared_prefix_attention` (and SDPA's masks under its name) with transformers and
    switch `model` to it: SDPA for every cache without a SharedPrefixLayer, so the same numbers."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(SHARED_PREFIX_ATTENTION, shared_prefix_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(SHARED_PREFIX_ATTENTION, sdpa_mask)
    model.set_attn_implementation(SHARED_PREFIX_ATTENTION)


class GrowingCache(DynamicCache):
    """A DynamicCache made of GrowingLayers (an empty one grows a layer per model layer on first use)."""

    def __init__(self, layers: list[GrowingLayer] | None = None):
        if layers:
            Cache.__init__(self, layers=layers)
        else:
            Cache.__init__(self, layer_class_to_replicate=GrowingLayer)


def reselect_cache(cache: Cache, rows: torch.Tensor) -> bool:
    """Keep `rows` of `cache` in place (GrowingLayer.reselect, every layer), for a cache only the
    caller holds; False, and the cache untouched, where a layer cannot (then `select_cache`)."""
    layers = getattr(cache, "layers", None)
    if not layers or not all(isinstance(layer, GrowingLayer) and layer.can_reselect(rows.numel()) for layer in layers):
        return False
    for layer in layers:
        layer.reselect(rows)
    return True


def select_cache(cache: Cache, rows: torch.Tensor) -> Cache:
    """A new cache holding `rows` of `cache` (copies: the source is never mutated)."""
    if isinstance(cache, EncoderDecoderCache):
        return EncoderDecoderCache(
            select_cache(cache.self_attention_cache, rows), select_cache(cache.cross_attention_cache, rows)
        )
    if all(isinstance(layer, GrowingLayer) for layer in cache.layers):
        return GrowingCache([layer.selected(rows) for layer in cache.layers])
    data = [(layer.keys.index_select(0, rows), layer.values.index_select(0, rows)) for layer in cache.layers]
    return DynamicCache(data)
