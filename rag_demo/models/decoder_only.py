"""A chat LM (SmolLM2-135M-Instruct, the offline stack) as a `Generator` (models/generators.py):
one chat prompt per passage holding the passage and the question (their format: chat_format.py),
left-padded; the prompts' shared opening run once, passages' keys and values and answers' hidden
states kept for later questions (models/passage_kv.py).
"""
from __future__ import annotations

import itertools
import threading
from typing import Sequence

import torch

from rag_demo.models import Doc
from rag_demo.models.chat_format import ChatFormat
from rag_demo.models.passage_kv import DEFAULT_MAX_BYTES as DEFAULT_PASSAGE_CACHE_BYTES
from rag_demo.models.passage_kv import DEFAULT_HIDDEN_BYTES, HiddenStateCache, PassageKVCache, chain, digest
from rag_demo.models.generators import (
    DECODER_ONLY, GenState, Generator, LazyPrefill, last_tokens, log_softmax_f32, pad_rows, stacked_layers,
)
from rag_demo.models.kv_cache import (
    MIN_SHARED_PREFIX, GrowingCache, GrowingLayer, SharedPrefixLayer, select_cache, shared_prefix,
    use_shared_prefix_attention,
)
from rag_demo.models.prompts import Span


_MODEL_KEYS = itertools.count()  # each generator's own number in its passage cache's keys


class DecoderOnlyGenerator(Generator):
    """A chat LM (SmolLM2-135M-Instruct): the doc goes into the prompt."""

    kind = DECODER_ONLY

    def __init__(self, model, tokenizer, name: str = "SmolLM2-135M-Instruct",
                 passage_cache_bytes: int = DEFAULT_PASSAGE_CACHE_BYTES, hidden_cache_bytes: int = DEFAULT_HIDDEN_BYTES):
        self.model = model.eval()
        use_shared_prefix_attention(self.model)  # prefill shares the prompts' opening: SharedPrefixLayer
        self.tokenizer = tokenizer
        self.name = name
        eos = model.generation_config.eos_token_id
        eos = eos if isinstance(eos, list) else [eos]
        self.eos_token_ids = sorted({i for i in [*eos, tokenizer.eos_token_id] if i is not None})
        self.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_token_ids[0]
        self.format = ChatFormat(tokenizer, self.eos_token_ids)  # the prompts, the stop rule, the spans
        self._kept: list[tuple[tuple[int, ...], GrowingCache]] = []  # recent prefixes' KV (`_prefix_kv`)
        self._kept_lock = threading.Lock()
        self.prefix_tokens_run = 0  # prefix tokens the model actually ran (tests read it)
        # passages' keys and values after the prompt's opening, kept for later questions (`prefill`);
        # its keys start with this generator's own key, so one cache may serve several generators
        self.passage_cache = PassageKVCache(passage_cache_bytes)
        self._model_key = (name, next(_MODEL_KEYS))
        self.passage_tokens_run = 0  # passage tokens the model actually ran (tests read it)
        # the last hidden state of every token sequence the model ran (prompts, answers so far),
        # kept for later questions: a re-ask runs the model only where it reads something new
        self.hidden_cache = HiddenStateCache(hidden_cache_bytes)
        self.positions_run = 0  # token positions the model ran after prompts' openings (tests read it)

    def kept_caches(self) -> dict[str, PassageKVCache]:
        return {"passages": self.passage_cache, "hidden_states": self.hidden_cache}

    # -- the prompt format (chat_format.ChatFormat) --------------------------------------
    def messages(self, question: str, doc: Doc | None, max_doc_tokens: int, style: str = "sentence",
                 question_position: str = "after", examples: Sequence[tuple] = ()) -> list[dict]:
        return self.format.messages(question, doc, max_doc_tokens, style, question_position, examples)

    def stop_token_ids(self, style: str = "sentence"):
        return self.format.stop_token_ids(style)

    def prompt(self, question, doc, max_doc_tokens, style="sentence", question_position="after", examples=()):
        return self.format.prompt(question, doc, max_doc_tokens, style, question_position, examples)

    def title_answer_ids(self, title: str) -> list[int]:
        return self.format.title_answer_ids(title)

    def span_ids(self, doc: Doc, max_doc_tokens: int) -> Span:
        return self.format.span_ids(doc, max_doc_tokens)

    def question_tail(self, prompt, question):
        return self.format.question_tail(prompt, question)

    # -- the KV runtime ----------------------------------------------------------------
    # How many recent prefixes' KV caches `_prefix_kv` keeps (0: none). One question's prefix is
    # ~400 tokens with 4 worked examples (~19 MB of float32 KV for SmolLM2-135M); four cover the
    # RAG and closed-book prompts of two settings without thrashing.
    KEPT_PREFIXES = 4

    @torch.inference_mode()
    def _prefix_kv(self, prefix: tuple[int, ...]) -> "GrowingCache":
        """The KV cache of `prefix` as one row (1, heads, P, d), a fresh copy the caller may extend.

        Every question's prompts open the same way (system prompt, worked examples: ~400 of a
        RAG-Token question's ~550 tokens per row), so the part `prefix` shares with a recently
        seen prefix is copied from that one's cache, not recomputed: causal attention makes the
        KV of tokens 0..L-1 depend on those tokens alone, so this is exact (the rest runs as a
        second chunk: float sums in another order, ~1e-6). Then `prefix` itself is kept."""
        with self._kept_lock:
            kept = list(self._kept)
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
            self.prefix_tokens_run += len(prefix) - L
        if self.KEPT_PREFIXES:
            keep = GrowingCache([layer.cropped(len(prefix)) for layer in cache.layers])  # never handed out
            with self._kept_lock:  # the most recent last; the oldest dropped
                others = [(k, v) for k, v in self._kept if k != prefix]
                self._kept = (others + [(prefix, keep)])[-self.KEPT_PREFIXES:]
        return cache

    @torch.inference_mode()
    def prefill(self, prompts, keep_prompt_logprobs: int = 0):
        """`_prefill` of the prompts, or, when the last hidden states of every prompt (and of the
        n = keep_prompt_logprobs prefixes before it) are kept in `hidden_cache`, no model call at all: the
        log-probs come from the kept states and the state is lazy (`GenState.lazy`): the prompts'
        prefill runs, once for every copy of the state, when a later step reads something not kept
        (`_hidden`), and the tokens fed meanwhile run after it. Every hidden state computed is kept."""
        if not 0 <= keep_prompt_logprobs < min(len(p) for p in prompts):
            raise ValueError(f"keep_prompt_logprobs={keep_prompt_logprobs!r} is out of range: use 0 to one less than "
                             "the shortest prompt.")
        if not self.hidden_cache.max_bytes:
            hidden, state = self._prefill(prompts, keep_prompt_logprobs)  # (R, n+1, H)
            return self._first_step(self._logits(hidden), last_tokens(prompts, keep_prompt_logprobs), keep_prompt_logprobs, state)
        R = len(prompts)
        digs = [[digest(p[: len(p) - j]) for j in range(keep_prompt_logprobs, -1, -1)] for p in prompts]  # (R, n+1)
        kept = [[self.hidden_cache.get(d) for d in row] for row in digs]  # (R, n+1) of (H,) or None
        if all(h is not None for row in kept for h in row):
            hidden = torch.stack([torch.stack(row) for row in kept])  # (R, n+1, H)
            state = GenState(cache=None, mask=torch.ones((R, 0), dtype=torch.long),
                             lazy=(LazyPrefill(prompts), list(range(R))))
        else:
            hidden, state = self._prefill(prompts, keep_prompt_logprobs)  # (R, n+1, H)
            self._keep(digs, kept, hidden)
        state.digests, state.pending = [row[-1] for row in digs], torch.zeros((R, 0), dtype=torch.long)  # pending (R, 0)
        return self._first_step(self._logits(hidden), last_tokens(prompts, keep_prompt_logprobs), keep_prompt_logprobs, state)

    def _keep(self, digs: list[list[bytes]], kept: list[list], hidden: torch.Tensor) -> None:
        """Keep hidden[r, j] (R, L, H) under digs[r][j] where kept[r][j] says it was not kept."""
        for r, row in enumerate(digs):
            for j, d in enumerate(row):
                if kept[r][j] is None:
                    self.hidden_cache.put(d, hidden[r, j])

    def _prefill(self, prompts, keep_prompt_logprobs: int = 0, hidden: bool = True) -> tuple[torch.Tensor | None, GenState]:
        """The K doc prompts share their opening (system prompt, chat header, worked examples):
        it runs once, as one row, its KV cache is held once for every row (SharedPrefixLayer), and
        only the rest of each prompt runs per row, left-padded after it (the padding is masked out
        and skipped by the position ids, so every row reads exactly its prompt). The opening's own
        KV comes from `_prefix_kv`, which reuses what earlier questions share; each passage's from
        `passage_cache` where an earlier question computed it (`_prefill_passages`).
        -> the hidden states of each row's last keep_prompt_logprobs + 1 prompt positions (R, n+1, H) and the state;
        hidden=False: only the state is wanted (None may come instead of the states, when every row's
        keys and values are kept and nothing had to run)."""
        split = self._passage_split(prompts, keep_prompt_logprobs)
        if split is not None:
            return self._prefill_passages(prompts, keep_prompt_logprobs, *split, hidden=hidden)
        P = shared_prefix(prompts, keep=keep_prompt_logprobs + 1)
        if len(prompts) == 1 and self.KEPT_PREFIXES:  # one row (closed-book): its opening can be kept too
            P = max(0, len(prompts[0]) - keep_prompt_logprobs - 1)
            P = P if P >= MIN_SHARED_PREFIX else 0
        cache, head = GrowingCache(), torch.zeros((len(prompts), 0), dtype=torch.long)  # (R, 0)
        if P:
            cache = self._opening_cache(tuple(prompts[0][:P]))
            head = torch.ones((len(prompts), P), dtype=torch.long)  # (R, P)
        ids, tail_mask = pad_rows([p[P:] for p in prompts], self.pad_token_id, left=True)  # (R, W) left-padded
        mask = torch.cat([head, tail_mask], dim=1)  # (R, P+W)
        pos = P + (tail_mask.cumsum(-1) - 1).clamp(min=0)  # (R, W) positions skip the padding
        out = self.model.model(
            input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=cache, use_cache=True, prefix_cache=cache,
        )
        self.positions_run += int(tail_mask.sum())
        state = GenState(cache=out.past_key_values, mask=mask, next_pos=P + tail_mask.sum(-1))
        # only the states needed: the last position's, and before it the n positions that predict
        # the last n prompt tokens (left padding: every row's tail is aligned)
        return out.last_hidden_state[:, -(keep_prompt_logprobs + 1):], state  # (R, n+1, H)

    def _opening_cache(self, opening: tuple[int, ...]) -> "GrowingCache":
        """An empty R-row cache over `opening`'s KV, held once for all rows (SharedPrefixLayer:
        not a copy in each row; each row's cache holds its own positions only)."""
        one = self._prefix_kv(opening)  # (1, heads, P, d) per layer
        return GrowingCache([SharedPrefixLayer(layer.keys, layer.values) for layer in one.layers])

    @staticmethod
    def _first_step(logits: torch.Tensor, ids: torch.Tensor, keep_prompt_logprobs: int, state: GenState):
        """-> the next-token log-probs (R, V) from the prefill's logits (R, n+1, V), and the state,
        with the log-probs of the last n prompt tokens (ids (R, n)) when asked for."""
        if keep_prompt_logprobs:
            lp = log_softmax_f32(logits[:, :-1])  # (R, n, V): position j predicts token j+1
            state.prompt_lp = lp.gather(2, ids[:, -keep_prompt_logprobs:].unsqueeze(-1)).squeeze(-1)  # (R, n)
        return log_softmax_f32(logits[:, -1]), state  # (R, V)

    def _passage_split(self, prompts, keep_prompt_logprobs: int) -> tuple[int, list[int]] | None:
        """(s, ends): where each prompt's passage lies, cut as [opening: ..s][passage: s..end][rest]
        with the opening the same tokens in every prompt and the rest holding at least the last
        keep_prompt_logprobs + 1 tokens (the positions whose logits the prefill keeps); None when the prompts
        cannot be split so (no `Prompt.passage`, an opening too short to keep) or no cache is kept."""
        if not self.passage_cache.max_bytes or not all(getattr(p, "passage", None) for p in prompts):
            return None
        s = min(p.passage[0] for p in prompts)
        first = prompts[0]
        s = next((i for i in range(s) if any(p[i] != first[i] for p in prompts[1:])), s)  # shared by every prompt
        ends = [p.passage[1] for p in prompts]
        if s < MIN_SHARED_PREFIX or any(e <= s or len(p) - e <= keep_prompt_logprobs for p, e in zip(prompts, ends)):
            return None
        return s, ends

    def _passage_keys(self, prompts, s: int, ends: list[int]) -> list[tuple]:
        """Each prompt's passage's key in `passage_cache`: everything its keys and values depend
        on (this model, its dtype, the opening's tokens, the passage's tokens)."""
        opening, dtype = tuple(prompts[0][:s]), next(self.model.parameters()).dtype
        return [(self._model_key, dtype, opening, tuple(p[s:e])) for p, e in zip(prompts, ends)]

    def prompts_kept(self, prompts) -> bool:
        return bool(self.hidden_cache.max_bytes) and all(digest(p) in self.hidden_cache for p in prompts)

    def cached_tokens(self, prompts, keep_prompt_logprobs: int = 0) -> int:
        split = self._passage_split(prompts, keep_prompt_logprobs)
        if split is None:
            return 0
        s, ends = split
        keys = self._passage_keys(prompts, s, ends)
        return sum(e - s for k, e in zip(keys, ends) if k in self.passage_cache)

    @torch.inference_mode()
    def _prefill_passages(self, prompts, keep_prompt_logprobs: int, s: int, ends: list[int], hidden: bool = True):
        """`prefill` of prompts cut as [opening][passage][rest] (`_passage_split`). Each row's own
        positions are [padding][its passage][padding][its rest]: the passages end aligned, the
        rests end aligned (the rests are the question's part, the same tokens in every row unless
        a passage's last token merged into it). A passage's keys and values depend only on the
        opening and its own tokens (causal attention; positions count from the opening, padding
        skipped), so they are taken from `passage_cache` when an earlier prefill kept them, keyed
        by model, dtype, opening and passage tokens. With none kept, passages and rests run in one
        call, as without a cache, and the passages are kept from it; else the passages not kept run
        first (and are kept), then the rests, every row at once, against [opening][its passage].
        Exact up to float summation order; the question part runs through SDPA (`prefill=True`)
        as in a whole prefill. Each row's rest (its question part) is kept too, under its passage's
        key and its own tokens: a prefill that wants only the state (hidden=False: a re-ask's
        `LazyPrefill` catching up) and finds every passage and rest kept runs nothing."""
        R = len(prompts)
        opening = tuple(prompts[0][:s])
        cache = self._opening_cache(opening)
        segs = [p[s:e] for p, e in zip(prompts, ends)]
        seg_ids, seg_mask = pad_rows(segs, self.pad_token_id, left=True)  # (R, Ws) passages end aligned
        rest_ids, rest_mask = pad_rows([p[e:] for p, e in zip(prompts, ends)], self.pad_token_id, left=True)  # (R, Wr)
        lens = seg_mask.sum(-1)  # (R,) passage tokens per row
        seg_pos = s + (seg_mask.cumsum(-1) - 1).clamp(min=0)  # (R, Ws) positions skip the padding
        rest_pos = s + lens.unsqueeze(1) + (rest_mask.cumsum(-1) - 1).clamp(min=0)  # (R, Wr)
        mask = torch.cat([torch.ones((R, s), dtype=torch.long), seg_mask, rest_mask], dim=1)  # (R, s+Ws+Wr)
        Ws = seg_ids.shape[1]
        prefix = cache.layers[0].prefix_k  # (1, heads, s, d)
        keys = self._passage_keys(prompts, s, ends)
        rest_keys = [(*k, tuple(p[e:])) for k, p, e in zip(keys, prompts, ends)]  # a rest after its passage
        n_rest = rest_mask.sum(-1)  # (R,) rest tokens per row
        Wr = rest_ids.shape[1]
        kept_rests = None if hidden else [self.passage_cache.get(k, count=False) for k in rest_keys]
        kept = [self.passage_cache.get(k) for k in keys]  # (layers, 2, heads, L, d) each, or None
        missing = [r for r in range(R) if kept[r] is None]

        def keep_rests(layers) -> None:  # row r's rest: the last n_rest[r] of its Ws + Wr own positions
            if not self.hidden_cache.max_bytes:  # only a lazy prefill (hidden states kept) reads them
                return
            for r in range(R):
                cols = slice(Ws + Wr - int(n_rest[r]), Ws + Wr)
                self.passage_cache.put(rest_keys[r], stacked_layers([(lay.keys[r, :, cols], lay.values[r, :, cols])
                                                               for lay in layers]))

        if len(missing) == R:  # nothing kept: one call over passages and rests, as without a cache
            out = self.model.model(
                input_ids=torch.cat([seg_ids, rest_ids], dim=1), attention_mask=mask,
                position_ids=torch.cat([seg_pos, rest_pos], dim=1), past_key_values=cache, use_cache=True,
                prefix_cache=cache, prefill=True,
            )
            self.passage_tokens_run += int(lens.sum())
            self.positions_run += int(lens.sum()) + int(rest_mask.sum())
            layers = out.past_key_values.layers
            for r in range(R):  # row r's passage: its last lens[r] of the first Ws own positions
                cols = slice(Ws - int(lens[r]), Ws)
                own = [(lay.keys[r, :, cols], lay.values[r, :, cols]) for lay in layers]  # (heads, L, d) per layer
                self.passage_cache.put(keys[r], stacked_layers(own))
            keep_rests(layers)
            state = GenState(cache=out.past_key_values, mask=mask, next_pos=rest_pos[:, -1] + 1)  # next_pos (R,)
            return out.last_hidden_state[:, -(keep_prompt_logprobs + 1):], state  # (R, n+1, H)
        if missing:  # some kept: the others' passages run on their own, as rows of their own width
            rows = torch.tensor(missing)  # (M,) the rows whose passages run
            Wm = int(lens[rows].max())
            # `cache` is used for these rows only: its own buffers get their passages, its prefix is the opening
            cols = slice(Ws - Wm, Ws)
            part_mask = torch.cat([torch.ones((len(missing), s), dtype=torch.long), seg_mask[rows, cols]], dim=1)  # (M, s+Wm)
            self.model.model(input_ids=seg_ids[rows, cols], position_ids=seg_pos[rows, cols], attention_mask=part_mask,
                             past_key_values=cache, use_cache=True, prefix_cache=cache, prefill=True)
            self.passage_tokens_run += int(lens[rows].sum())
            self.positions_run += int(lens[rows].sum())
            for i, r in enumerate(missing):
                cols = slice(Wm - int(lens[r]), Wm)
                own = [(lay.keys[i, :, cols], lay.values[i, :, cols]) for lay in cache.layers]  # (heads, L, d) per layer
                kept[r] = stacked_layers(own)  # (layers, 2, heads, L, d)
                self.passage_cache.put(keys[r], kept[r])  # read below, never written
        # every row's own cache: its passage's kept keys and values, ending aligned, then room for the
        # rests (or the rests too, ending aligned, when every one is kept and no state is wanted)
        whole = kept_rests is not None and all(x is not None for x in kept_rests)
        rows_cache = []
        for li, layer in enumerate(cache.layers):
            h, d = prefix.shape[1], prefix.shape[-1]
            k = prefix.new_empty((R, h, Ws + Wr + GrowingLayer.GROW, d))  # (R, heads, capacity, d)
            v = torch.empty_like(k)  # (R, heads, capacity, d): the room after what is held is written before it is read
            for r in range(R):
                a = Ws - int(lens[r])
                k[r, :, :a], v[r, :, :a] = 0, 0  # padding: masked, but never NaN
                k[r, :, a: Ws] = kept[r][li, 0]  # (heads, L, d) copied: the cache's own stays unwritten
                v[r, :, a: Ws] = kept[r][li, 1]
                if whole:
                    b = Ws + Wr - int(n_rest[r])
                    k[r, :, Ws: b], v[r, :, Ws: b] = 0, 0
                    k[r, :, b: Ws + Wr], v[r, :, b: Ws + Wr] = kept_rests[r][li, 0], kept_rests[r][li, 1]
            rows_cache.append(SharedPrefixLayer(layer.prefix_k, layer.prefix_v).holding(k, v, Ws + Wr if whole else Ws))
        cache = GrowingCache(rows_cache)
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

    @torch.inference_mode()
    def _hidden(self, state, tokens):
        """Run tokens (R, L) (see Generator._hidden), or not: where the hidden state of every row at
        every one of the L positions is kept (`hidden_cache`), they are read, and the tokens wait
        in `state.pending` until a later call needs the model; that call runs the waiting tokens
        and its own at once (after the prompts' prefill when that was read too: `LazyPrefill`).
        Every state the model computes is kept."""
        if state.digests is None:  # no hidden states kept for this state
            return self._run(state, tokens)
        R, L = tokens.shape
        digs = [chain(d, row) for d, row in zip(state.digests, tokens.tolist())]  # (R, L) after each new token
        kept = [[self.hidden_cache.get(d) for d in row] for row in digs]  # (R, L) of (H,) or None
        state.digests = [row[-1] for row in digs]
        if all(h is not None for row in kept for h in row):
            state.pending = torch.cat([state.pending, tokens], dim=1)  # (R, p+L)
            return torch.stack([torch.stack(row) for row in kept])  # (R, L, H)
        fed = torch.cat([state.pending, tokens], dim=1)  # (R, p+L): the model catches up with these
        state.pending = fed[:, :0]  # (R, 0)
        if state.cache is None:  # not even the prompts ran: their prefill runs (once for every copy)
            ran = state.lazy[0].rows(self, state.lazy[1])
            state.cache, state.mask, state.next_pos, state.lazy = ran.cache, ran.mask, ran.next_pos, None
        hidden = self._run(state, fed)[:, -L:]  # (R, L, H)
        self._keep(digs, kept, hidden)
        return hidden

    def _run(self, state: GenState, tokens: torch.Tensor) -> torch.Tensor:
        """The model over tokens (R, L) from the state's cache (updated in place) -> (R, L, H)."""
        rows, length = tokens.shape
        self.positions_run += rows * length
        state.mask = torch.cat([state.mask, torch.ones((rows, length), dtype=state.mask.dtype)], dim=1)  # (R, S+L)
        pos = state.next_pos.unsqueeze(1) + torch.arange(length)  # (R, L)
        out = self.model.model(
            input_ids=tokens, attention_mask=state.mask, position_ids=pos, past_key_values=state.cache, use_cache=True,
            prefix_cache=state.cache,  # shared_prefix_attention reads the shared prefix from it
        )
        state.cache = out.past_key_values
        state.next_pos = state.next_pos + length
        return out.last_hidden_state  # (R, L, H)

    def _logits(self, hidden):
        return self.model.lm_head(hidden)  # (..., V)

    def select(self, state, rows):
        picked = rows.tolist()
        return GenState(
            cache=None if state.cache is None else select_cache(state.cache, rows),
            mask=state.mask.index_select(0, rows),
            next_pos=None if state.next_pos is None else state.next_pos.index_select(0, rows),
            digests=None if state.digests is None else [state.digests[i] for i in picked],
            pending=None if state.pending is None else state.pending.index_select(0, rows),
            lazy=None if state.lazy is None else (state.lazy[0], [state.lazy[1][i] for i in picked]),
        )
