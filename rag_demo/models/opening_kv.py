"""The keys and values of prompts' shared opening (system prompt, chat header, worked examples),
computed once and kept for the next questions, for a decoder-only generator (decoder_only.py).

Every question's prompts open the same way (~400 of a RAG-Token question's ~550 tokens per row
with worked examples), so the part an opening shares with a recently seen one is copied from
that one's cache, not recomputed: causal attention makes the keys and values of tokens 0..L-1
depend on those tokens alone, so this is exact (the rest runs as a second chunk: float sums in
another order, ~1e-6).
"""
from __future__ import annotations

import threading

import torch

from rag_demo.models.kv_cache import MIN_SHARED_PREFIX, GrowingCache, SharedPrefixLayer


class OpeningKV:
    """Openings' keys and values for one model: `one(prefix)` a fresh one-row copy the caller may
    extend, `shared(opening)` the same held once for every row of a prefill. The `KEPT` most recent
    openings are kept (`kept`, the latest last); `tokens_run` counts the opening tokens the model
    actually ran (tests read it)."""

    # How many recent openings are kept (0: none). One question's opening is ~400 tokens with 4
    # worked examples (~19 MB of float32 keys and values for SmolLM2-135M); four cover the RAG and
    # closed-book prompts of two settings without thrashing.
    KEPT = 4

    def __init__(self, model) -> None:
        self.model = model
        self.kept: list[tuple[tuple[int, ...], GrowingCache]] = []
        self._lock = threading.Lock()
        self.tokens_run = 0

    @torch.inference_mode()
    def one(self, prefix: tuple[int, ...]) -> GrowingCache:
        """The keys and values of `prefix` as one row (1, heads, P, d) per layer, a fresh copy: the
        longest opening it shares with a kept one is copied, the rest run; then `prefix` is kept."""
        with self._lock:
            kept = list(self.kept)
        best, L = None, 0
        for key, kv in kept:  # the kept prefix sharing the longest opening with this one
            n = next((i for i, (a, b) in enumerate(zip(key, prefix)) if a != b), min(len(key), len(prefix)))
            if n > L:
                best, L = kv, n
        if L < MIN_SHARED_PREFIX:
            best, L = None, 0
        cache = GrowingCache() if best is None else GrowingCache(
            [layer.cropped(L) for layer in best.layers])  # (1, heads, L, d) copies
        if L < len(prefix):
            rest = torch.tensor([list(prefix[L:])])  # (1, P-L)
            self.model.model(input_ids=rest, position_ids=torch.arange(L, len(prefix)).unsqueeze(0),
                             past_key_values=cache, use_cache=True)
            self.tokens_run += len(prefix) - L
        if self.KEPT:
            keep = GrowingCache([layer.cropped(len(prefix)) for layer in cache.layers])  # never handed out
            with self._lock:  # the most recent last; the oldest dropped
                others = [(k, v) for k, v in self.kept if k != prefix]
                self.kept = (others + [(prefix, keep)])[-self.KEPT:]
        return cache

    def shared(self, opening: tuple[int, ...]) -> GrowingCache:
        """An empty R-row cache over `opening`'s keys and values, held once for all rows
        (SharedPrefixLayer: not a copy in each row; each row's cache holds its own positions only).
        An opening kept whole is handed out as it is kept (a SharedPrefixLayer never writes its
        prefix), so every question with that opening reads the same tensors: one copy in memory,
        and a batched step reads them once for all of those questions (batched_step.py)."""
        with self._lock:
            kept = next((kv for key, kv in self.kept if key == opening), None)
            if kept is not None:  # the most recent last, as `one` keeps them
                self.kept = [(k, v) for k, v in self.kept if k != opening] + [(opening, kept)]
        if kept is None:  # computed (and kept) now: the kept copy is the one every later question reads
            one = self.one(opening)  # (1, heads, P, d) per layer
            with self._lock:
                kept = next((kv for key, kv in self.kept if key == opening), None)
        one = kept if kept is not None else one
        return GrowingCache([SharedPrefixLayer(layer.keys, layer.values) for layer in one.layers])
