"""The prefill of prompts cut as [opening][passage][rest], for a decoder-only generator
(decoder_only.py): each passage's keys and values depend only on the opening and its own tokens,
so they are kept (passage_kv.PassageKVCache) and a later question that retrieves the same passage
runs only its question part against them.
"""
from __future__ import annotations

import torch

from rag_demo.models.batched_step import forward_many
from rag_demo.models.generators import GenState, pad_rows, stacked_layers
from rag_demo.models.kv_cache import MIN_SHARED_PREFIX, GrowingCache, GrowingLayer, SharedPrefixLayer
from rag_demo.models.opening_kv import OpeningKV
from rag_demo.models.passage_kv import HiddenStateCache, PassageKVCache


class PassagePrefill:
    """Prefills through `cache` (kept passages' keys and values; its keys start with `model_key`, so
    one cache may serve several generators) over the openings of `openings`. `passage_tokens_run`
    and `positions_run` count what the model actually ran (tests read them)."""

    def __init__(self, model, pad_token_id: int, openings: OpeningKV, cache: PassageKVCache,
                 hidden_cache: HiddenStateCache, model_key: tuple) -> None:
        self.model, self.pad_token_id, self.openings = model, pad_token_id, openings
        self.cache, self.hidden_cache, self._model_key = cache, hidden_cache, model_key
        self.passage_tokens_run = 0
        self.positions_run = 0

    def split(self, prompts, keep_prompt_logprobs: int) -> tuple[int, list[int]] | None:
        """(s, ends): where each prompt's passage lies, cut as [opening: ..s][passage: s..end][rest]
        with the opening the same tokens in every prompt and the rest holding at least the last
        keep_prompt_logprobs + 1 tokens (the positions whose logits the prefill keeps); None when the prompts
        cannot be split so (no `Prompt.passage`, an opening too short to keep) or no cache is kept."""
        if not self.cache.max_bytes or not all(getattr(p, "passage", None) for p in prompts):
            return None
        s = min(p.passage[0] for p in prompts)
        first = prompts[0]
        s = next((i for i in range(s) if any(p[i] != first[i] for p in prompts[1:])), s)  # shared by every prompt
        ends = [p.passage[1] for p in prompts]
        if s < MIN_SHARED_PREFIX or any(e <= s or len(p) - e <= keep_prompt_logprobs for p, e in zip(prompts, ends)):
            return None
        return s, ends

    def keys(self, prompts, s: int, ends: list[int]) -> list[tuple]:
        """Each prompt's passage's key in `cache`: everything its keys and values depend
        on (this model, its dtype, the opening's tokens, the passage's tokens)."""
        opening, dtype = tuple(prompts[0][:s]), next(self.model.parameters()).dtype
        return [(self._model_key, dtype, opening, tuple(p[s:e])) for p, e in zip(prompts, ends)]

    def cached_tokens(self, prompts, keep_prompt_logprobs: int = 0) -> int:
        split = self.split(prompts, keep_prompt_logprobs)
        if split is None:
            return 0
        s, ends = split
        keys = self.keys(prompts, s, ends)
        return sum(e - s for k, e in zip(keys, ends) if k in self.cache)

    @torch.inference_mode()
    def run(self, prompts, keep_prompt_logprobs: int, s: int, ends: list[int], hidden: bool = True):
        """The prefill of prompts cut as [opening][passage][rest] (`split`). Each row's own
        positions are [padding][its passage][padding][its rest]: the passages end aligned, the
        rests end aligned (the rests are the question's part, the same tokens in every row unless
        a passage's last token merged into it). A passage's keys and values depend only on the
        opening and its own tokens (causal attention; positions count from the opening, padding
        skipped), so they are taken from `cache` when an earlier prefill kept them, keyed
        by model, dtype, opening and passage tokens. With none kept, every row's passage and rest
        run in one call, packed: each row its own sequence after the opening, no padding run
        (`_packed`), and the passages are kept from it; else the passages not kept run first, packed
        (and are kept), then the rests, every row at once, against [opening][its passage].
        Exact up to float summation order; every part runs through SDPA (`prefill=True`) as in a
        whole prefill. Each row's rest (its question part) is kept too, under its passage's
        key and its own tokens: a prefill that wants only the state (hidden=False: a re-ask's
        `LazyPrefill` catching up) and finds every passage and rest kept runs nothing."""
        R = len(prompts)
        opening = tuple(prompts[0][:s])
        cache = self.openings.shared(opening)
        segs = [p[s:e] for p, e in zip(prompts, ends)]
        _, seg_mask = pad_rows(segs, self.pad_token_id, left=True)  # (R, Ws) passages end aligned
        rest_ids, rest_mask = pad_rows([p[e:] for p, e in zip(prompts, ends)], self.pad_token_id, left=True)  # (R, Wr)
        lens = seg_mask.sum(-1)  # (R,) passage tokens per row
        rest_pos = s + lens.unsqueeze(1) + (rest_mask.cumsum(-1) - 1).clamp(min=0)  # (R, Wr)
        mask = torch.cat([torch.ones((R, s), dtype=torch.long), seg_mask, rest_mask], dim=1)  # (R, s+Ws+Wr)
        Ws = seg_mask.shape[1]
        keys = self.keys(prompts, s, ends)
        rest_keys = [(*k, tuple(p[e:])) for k, p, e in zip(keys, prompts, ends)]  # a rest after its passage
        n_rest = rest_mask.sum(-1)  # (R,) rest tokens per row
        Wr = rest_ids.shape[1]
        kept_rests = None if hidden else [self.cache.get(k, count=False) for k in rest_keys]
        kept = [self.cache.get(k) for k in keys]  # (layers, 2, heads, L, d) each, or None
        missing = [r for r in range(R) if kept[r] is None]

        def keep_rests(layers) -> None:  # row r's rest: the last n_rest[r] of its Ws + Wr own positions
            if not self.hidden_cache.max_bytes:  # only a lazy prefill (hidden states kept) reads them
                return
            for r in range(R):
                cols = slice(Ws + Wr - int(n_rest[r]), Ws + Wr)
                self.cache.put(rest_keys[r], stacked_layers([(lay.keys[r, :, cols], lay.values[r, :, cols])
                                                               for lay in layers]))

        if len(missing) == R:  # nothing kept: passages and rests in one call, each row packed
            ran = self._packed(opening, [list(p[s:]) for p in prompts], s)  # [(L_r, H), the row's cache]
            for r, (_, row) in enumerate(ran):  # the row's own positions: its passage, then its rest
                L = int(lens[r])
                kept[r] = stacked_layers([(lay.keys[0, :, :L], lay.values[0, :, :L]) for lay in row.layers])
                self.cache.put(keys[r], kept[r])
            self.passage_tokens_run += int(lens.sum())
            self.positions_run += int(lens.sum()) + int(rest_mask.sum())
            rests = [[(lay.keys[0, :, int(lens[r]):], lay.values[0, :, int(lens[r]):]) for lay in row.layers]
                     for r, (_, row) in enumerate(ran)]  # [layers of (heads, n_rest, d)] per row
            cache = self._rows_cache(cache, kept, Ws, Wr, lens, rests)
            keep_rests(cache.layers)
            state = GenState(cache=cache, mask=mask, next_pos=rest_pos[:, -1] + 1)  # next_pos (R,)
            return torch.stack([h[-(keep_prompt_logprobs + 1):] for h, _ in ran]), state  # (R, n+1, H)
        if missing:  # some kept: the others' passages run on their own, packed
            for r, (_, row) in zip(missing, self._packed(opening, [list(segs[r]) for r in missing], s)):
                kept[r] = stacked_layers([(lay.keys[0], lay.values[0]) for lay in row.layers])  # (layers, 2, heads, L, d)
                self.cache.put(keys[r], kept[r])  # read below, never written
            self.passage_tokens_run += int(lens[missing].sum())
            self.positions_run += int(lens[missing].sum())
        # every row's own cache: its passage's kept keys and values, ending aligned, then room for the
        # rests (or the rests too, ending aligned, when every one is kept and no state is wanted)
        whole = kept_rests is not None and all(x is not None for x in kept_rests)
        rests = [[(x[li, 0], x[li, 1]) for li in range(x.shape[0])] for x in kept_rests] if whole else None
        cache = self._rows_cache(cache, kept, Ws, Wr, lens, rests)
        if whole:  # nothing to run: the state of the whole prompts, from what was kept
            return None, GenState(cache=cache, mask=mask, next_pos=rest_pos[:, -1] + 1)  # next_pos (R,)
        out = self.model.model(
            input_ids=rest_ids, attention_mask=mask, position_ids=rest_pos, past_key_values=cache, use_cache=True,
            prefix_cache=cache, prefill=True,  # SDPA, as the one-call prefill
        )
        self.positions_run += int(rest_mask.sum())
        keep_rests(out.past_key_values.layers)
        state = GenState(cache=out.past_key_values, mask=mask, next_pos=rest_pos[:, -1] + 1)  # next_pos (R,)
        return out.last_hidden_state[:, -(keep_prompt_logprobs + 1):], state  # (R, n+1, H)

    def _packed(self, opening: tuple, rows: list[list[int]], s: int) -> list[tuple[torch.Tensor, GrowingCache]]:
        """Each row's tokens run after `opening` (s tokens) as a sequence of its own, every row in one
        forward (batched_step.forward_many): the linear layers over the Σ_r L_r real tokens, none of
        the padding a (R, max L_r) batch would run, and each row's attention through SDPA as a
        prefill's. -> [(hidden (L_r, H), the row's one-row cache over the opening holding its L_r
        own positions)]."""
        caches = [self.openings.shared(opening) for _ in rows]
        tokens = [torch.tensor([row], dtype=torch.long) for row in rows]  # (1, L_r) each
        positions = [s + torch.arange(len(row)).unsqueeze(0) for row in rows]  # (1, L_r) after the opening
        masks = [torch.ones((1, s + len(row)), dtype=torch.long) for row in rows]  # (1, s + L_r): nothing hidden
        hidden = forward_many(self.model, caches, tokens, positions, masks, prefill=True)  # [(1, L_r, H)]
        return [(h[0], c) for h, c in zip(hidden, caches)]

    @staticmethod
    def _rows_cache(opening_cache: GrowingCache, kept: list[torch.Tensor], Ws: int, Wr: int, lens: torch.Tensor,
                    rests: list | None) -> GrowingCache:
        """The R rows' cache over the opening, laid out as a one-call prefill leaves it: row r's own
        positions [padding][its passage][padding][its rest], passages ending at Ws, rests at Ws + Wr,
        padding zero (masked, but never NaN). kept[r] (layers, 2, heads, L_r, d): row r's passage;
        rests[r]: its rest's (keys, values) per layer, each (heads, n_r, d), or `rests` None to leave
        room for the rests to run into (the cache then holds Ws positions). Copies: what is read
        stays unwritten."""
        R, rows_cache = len(kept), []
        for li, layer in enumerate(opening_cache.layers):
            h, d = layer.prefix_k.shape[1], layer.prefix_k.shape[-1]
            k = layer.prefix_k.new_empty((R, h, Ws + Wr + GrowingLayer.GROW, d))  # (R, heads, capacity, d)
            v = torch.empty_like(k)  # (R, heads, capacity, d): the room after what is held is written before it is read
            for r in range(R):
                a = Ws - int(lens[r])
                k[r, :, :a], v[r, :, :a] = 0, 0
                k[r, :, a: Ws], v[r, :, a: Ws] = kept[r][li, 0], kept[r][li, 1]  # (heads, L_r, d)
                if rests is not None:
                    rk, rv = rests[r][li]  # (heads, n_r, d)
                    b = Ws + Wr - rk.shape[1]
                    k[r, :, Ws: b], v[r, :, Ws: b] = 0, 0
                    k[r, :, b: Ws + Wr], v[r, :, b: Ws + Wr] = rk, rv
            rows_cache.append(SharedPrefixLayer(layer.prefix_k, layer.prefix_v).holding(
                k, v, Ws + Wr if rests is not None else Ws))
        return GrowingCache(rows_cache)
