"""A chat LM (SmolLM2-135M-Instruct, the offline stack) as a `Generator` (models/generators.py):
one chat prompt per passage holding the passage and the question (their format: chat_format.py),
left-padded; the prompts' shared opening run once and kept (opening_kv.py), passages' keys and
values kept (passage_prefill.py) and answers' hidden states kept (passage_kv.py) for later questions.
"""
from __future__ import annotations

import dataclasses

import itertools
from typing import Sequence

import torch

from rag_demo.models import Doc
from rag_demo.models.batched_step import forward_many
from rag_demo.models.chat_format import ChatFormat
from rag_demo.models.passage_kv import DEFAULT_MAX_BYTES as DEFAULT_PASSAGE_CACHE_BYTES
from rag_demo.models.passage_kv import DEFAULT_HIDDEN_BYTES, HiddenStateCache, PassageKVCache, chain, digest
from rag_demo.models.generators import (
    DECODER_ONLY, GenState, Generator, LazyPrefill, last_tokens, log_softmax_f32, pad_rows,
)
from rag_demo.models.kv_cache import (
    MIN_SHARED_PREFIX, GrowingCache, reselect_cache, select_cache, shared_prefix, use_shared_prefix_attention,
)
from rag_demo.models.opening_kv import OpeningKV
from rag_demo.models.passage_prefill import PassagePrefill
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
        self.openings = OpeningKV(self.model)  # the prompts' shared opening, run once and kept
        # passages' keys and values after the prompt's opening, kept for later questions (`prefill`);
        # its keys start with this generator's own key, so one cache may serve several generators
        self.passage_cache = PassageKVCache(passage_cache_bytes)
        # the last hidden state of every token sequence the model ran (prompts, answers so far),
        # kept for later questions: a re-ask runs the model only where it reads something new
        self.hidden_cache = HiddenStateCache(hidden_cache_bytes)
        self.passages = PassagePrefill(self.model, self.pad_token_id, self.openings, self.passage_cache,
                                       self.hidden_cache, (name, next(_MODEL_KEYS)))
        self._positions_run = 0  # positions run outside `passages`' prefills

    # what the model actually ran (tests read these)
    @property
    def prefix_tokens_run(self) -> int:
        return self.openings.tokens_run

    @property
    def passage_tokens_run(self) -> int:
        return self.passages.passage_tokens_run

    @property
    def positions_run(self) -> int:
        """Token positions the model ran after prompts' openings."""
        return self._positions_run + self.passages.positions_run

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

    # -- the runtime: prefill and decoding ---------------------------------------------
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
        keys and values come from `openings` (opening_kv.py), which reuses what earlier questions share;
        each passage's from `passage_cache` where an earlier question computed it (passage_prefill.py).
        -> the hidden states of each row's last keep_prompt_logprobs + 1 prompt positions (R, n+1, H) and the state;
        hidden=False: only the state is wanted (None may come instead of the states, when every row's
        keys and values are kept and nothing had to run)."""
        split = self.passages.split(prompts, keep_prompt_logprobs)
        if split is not None:
            return self.passages.run(prompts, keep_prompt_logprobs, *split, hidden=hidden)
        P = shared_prefix(prompts, keep=keep_prompt_logprobs + 1)
        if len(prompts) == 1 and self.openings.KEPT:  # one row (closed-book): its opening can be kept too
            # the opening every question shares (Prompt.opening), so that a class's closed-book states
            # read one prefix and their steps batch as one group (batched_step.py); else all but the end
            end = max(0, len(prompts[0]) - keep_prompt_logprobs - 1)
            opening = getattr(prompts[0], "opening", None)
            P = opening if opening is not None and MIN_SHARED_PREFIX <= opening <= end else end
            P = P if P >= MIN_SHARED_PREFIX else 0
        cache, head = GrowingCache(), torch.zeros((len(prompts), 0), dtype=torch.long)  # (R, 0)
        if P:
            cache = self.openings.shared(tuple(prompts[0][:P]))
            head = torch.ones((len(prompts), P), dtype=torch.long)  # (R, P)
        ids, tail_mask = pad_rows([p[P:] for p in prompts], self.pad_token_id, left=True)  # (R, W) left-padded
        mask = torch.cat([head, tail_mask], dim=1)  # (R, P+W)
        pos = P + (tail_mask.cumsum(-1) - 1).clamp(min=0)  # (R, W) positions skip the padding
        out = self.model.model(
            input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=cache, use_cache=True, prefix_cache=cache,
        )
        self._positions_run += int(tail_mask.sum())
        state = GenState(cache=out.past_key_values, mask=mask, next_pos=P + tail_mask.sum(-1))
        # only the states needed: the last position's, and before it the n positions that predict
        # the last n prompt tokens (left padding: every row's tail is aligned)
        return out.last_hidden_state[:, -(keep_prompt_logprobs + 1):], state  # (R, n+1, H)

    @staticmethod
    def _first_step(logits: torch.Tensor, ids: torch.Tensor, keep_prompt_logprobs: int, state: GenState):
        """-> the next-token log-probs (R, V) from the prefill's logits (R, n+1, V), and the state,
        with the log-probs of the last n prompt tokens (ids (R, n)) when asked for."""
        if keep_prompt_logprobs:
            lp = log_softmax_f32(logits[:, :-1])  # (R, n, V): position j predicts token j+1
            state.prompt_lp = lp.gather(2, ids[:, -keep_prompt_logprobs:].unsqueeze(-1)).squeeze(-1)  # (R, n)
        return log_softmax_f32(logits[:, -1]), state  # (R, V)

    def prompts_kept(self, prompts) -> bool:
        return bool(self.hidden_cache.max_bytes) and all(digest(p) in self.hidden_cache for p in prompts)

    def cached_tokens(self, prompts, keep_prompt_logprobs: int = 0) -> int:
        return self.passages.cached_tokens(prompts, keep_prompt_logprobs)

    @torch.inference_mode()
    def _hidden(self, state, tokens):
        """Run tokens (R, L) (see Generator._hidden), or not: where the hidden state of every row at
        every one of the L positions is kept (`hidden_cache`), they are read, and the tokens wait
        in `state.pending` until a later call needs the model; that call runs the waiting tokens
        and its own at once (after the prompts' prefill when that was read too: `LazyPrefill`).
        Every state the model computes is kept."""
        return self._hidden_many([(state, tokens)])[0]

    @torch.inference_mode()
    def advance_many(self, items):
        """`advance` of several states at once, [(state, tokens (R_i, L_i))] -> [log-probs (R_i, L_i, V)],
        and `advance_gather` of those given targets, [(state, tokens, targets (R_i, L_i))] ->
        [log p(targets) (R_i, L_i)]: every state whose tokens need the model runs in one forward,
        whatever its length (batched_step.py), and the vocabulary projection runs once over the
        steps' rows. Each state's numbers are those it gets alone, up to the summation order of
        the matrix products. An item that cannot run (`check_step`) gets its ValueError in its
        place; the others run."""
        bad = [self.check_step(*item) for item in items]
        if any(bad):  # the items that cannot run get their error; the others run as one
            good = [i for i, b in enumerate(bad) if b is None]
            ran = iter(self.advance_many([items[i] for i in good]) if good else [])
            return [b if b is not None else next(ran) for b in bad]
        hidden = self._hidden_many([item[:2] for item in items])  # [(R_i, L_i, H)]
        out: list = [None] * len(items)
        steps = [i for i, item in enumerate(items) if len(item) < 3]  # full distributions wanted
        if steps:
            flat = torch.cat([hidden[i].reshape(-1, hidden[i].shape[-1]) for i in steps])  # (Σ R_i L_i, H)
            lp = log_softmax_f32(self._logits(flat))  # (Σ R_i L_i, V)
            for i, part in zip(steps, lp.split([hidden[i].shape[0] * hidden[i].shape[1] for i in steps])):
                out[i] = part.view(*hidden[i].shape[:2], -1)  # (R_i, L_i, V)
        for i, item in enumerate(items):
            if len(item) == 3:
                out[i] = self._gathered(hidden[i], item[2])  # (R_i, L_i)
        return out

    def _hidden_many(self, items) -> list[torch.Tensor]:
        """`_hidden` of several (state, tokens (R_i, L_i)): what is kept is read, the rest runs in
        one forward. -> [(R_i, L_i, H)]."""
        out: list[torch.Tensor | None] = [None] * len(items)
        runs: list[tuple[int, GenState, torch.Tensor]] = []  # (item, state, fed)
        after: list[tuple[int, list, list, int]] = []  # (item, digests, kept, L): what to keep once run
        for i, (state, tokens) in enumerate(items):
            if state.digests is None:  # no hidden states kept for this state
                runs.append((i, state, tokens))
                continue
            L = tokens.shape[1]
            digs = [chain(d, row) for d, row in zip(state.digests, tokens.tolist())]  # (R, L) after each new token
            kept = [[self.hidden_cache.get(d) for d in row] for row in digs]  # (R, L) of (H,) or None
            state.digests = [row[-1] for row in digs]
            if all(h is not None for row in kept for h in row):
                state.pending = torch.cat([state.pending, tokens], dim=1)  # (R, p+L)
                out[i] = torch.stack([torch.stack(row) for row in kept])  # (R, L, H)
                continue
            fed = torch.cat([state.pending, tokens], dim=1)  # (R, p+L): the model catches up with these
            state.pending = fed[:, :0]  # (R, 0)
            if state.cache is None:  # not even the prompts ran: their prefill runs (once for every copy)
                ran = state.lazy[0].rows(self, state.lazy[1])
                state.cache, state.mask, state.next_pos, state.lazy = ran.cache, ran.mask, ran.next_pos, None
            runs.append((i, state, fed))
            after.append((i, digs, kept, L))
        if runs:
            for (i, _, _), h in zip(runs, self._run_many([(st, fed) for _, st, fed in runs])):
                out[i] = h  # (R_i, L_fed, H)
        for i, digs, kept, L in after:
            out[i] = out[i][:, -L:]  # (R, L, H)
            self._keep(digs, kept, out[i])
        return out

    def _run(self, state: GenState, tokens: torch.Tensor) -> torch.Tensor:
        """The model over tokens (R, L) from the state's cache (updated in place) -> (R, L, H)."""
        return self._run_many([(state, tokens)])[0]

    def _run_many(self, items: list[tuple[GenState, torch.Tensor]]) -> list[torch.Tensor]:
        """The model over each state's tokens (R_i, L_i) from its cache (updated in place), in one
        forward (batched_step.forward_many) -> [(R_i, L_i, H)]."""
        for state, tokens in items:
            rows, length = tokens.shape
            self._positions_run += rows * length
            state.mask = torch.cat([state.mask, torch.ones((rows, length), dtype=state.mask.dtype)], dim=1)  # (R, S+L)
        hidden = forward_many(self.model, [st.cache for st, _ in items], [t for _, t in items],
                              [st.next_pos.unsqueeze(1) + torch.arange(t.shape[1]) for st, t in items],  # (R_i, L_i)
                              [st.mask for st, _ in items])
        for state, tokens in items:
            state.next_pos = state.next_pos + tokens.shape[1]
        return hidden

    def _logits(self, hidden):
        return self.model.lm_head(hidden)  # (..., V)

    @torch.inference_mode()  # the buffers a step grew were made in inference mode: written only inside it
    def reorder(self, state, rows):
        """`select` in place where the cache allows (kv_cache.reselect_cache: only the rows whose
        source differs are copied, no new buffers); else `select`. The values are those `select`
        gives: copies either way."""
        if state.cache is None or not reselect_cache(state.cache, rows):
            return self.select(state, rows)
        out = self.select(dataclasses.replace(state, cache=None), rows)  # every other field, as always
        out.cache = state.cache  # its rows kept in place
        return out

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
