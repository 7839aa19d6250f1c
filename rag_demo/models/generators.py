"""Generator adapters: what the RAG engine needs from a language model, for both kinds.

Owns turning (question, doc) into generator input ids, and running the model row-wise with a
KV cache: `prefill` the K doc-conditioned inputs at once, `advance` every row by one or more
tokens (one token while decoding, a whole answer when teacher-forcing), and `select` rows
(beam reordering, or copying a prefilled state to score candidates). Two kinds:

* `EncoderDecoderGenerator`: BART inside the paper's RAG checkpoints. Input
  `title / text // question` as in transformers' RagRetriever, but the passage is cut
  to its token budget first so truncation can never cut the question.
* `DecoderOnlyGenerator`: SmolLM2-135M-Instruct (offline stack). One chat prompt per doc
  holding that passage and the question; prompts are left-padded.

Every method returns float32 log-probabilities (log_softmax of the logits).
"""
from __future__ import annotations

import itertools
import re
import threading
from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer, EncoderDecoderCache
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import create_bidirectional_mask

from rag_demo.models import Doc
from rag_demo.models.passage_kv import DEFAULT_MAX_BYTES as DEFAULT_PASSAGE_CACHE_BYTES
from rag_demo.models.passage_kv import DEFAULT_HIDDEN_BYTES, HiddenStateCache, PassageKVCache, chain, digest
from rag_demo.models.stopping import StopRule

# Most float32 logits alive at once when teacher-forcing (advance_gather): 32M x 4 bytes = 128 MB,
# whatever the number of candidates x docs x tokens being scored.
LOGITS_CHUNK = 32 * 2**20

ENCODER_DECODER = "encoder-decoder"
DECODER_ONLY = "decoder-only"

SYSTEM_PROMPT = "Answer the question in a few words, using the passage."
CLOSED_BOOK_SYSTEM_PROMPT = "Answer the question with a short phrase."
# answer_style="short" (RagSettings): ask for a span, as the paper's NQ answers are; the
# assistant turn is opened with SHORT_ANSWER_CUE (prompt tokens, neither generated nor scored,
# like BART's decoder start token), so the model's habit "The answer is: X. ..." becomes the
# span " X"; the answer ends at the first line end or sentence-final period (`stop_token_ids`).
# SmolLM2-135M ignored the instruction alone ("The answer is: San Diego, California."), and
# without the cue one worked example did not shorten its answers either; with the cue, the two
# WORKED_EXAMPLES below do (docs/reader_results.md).
# The closed-book prompt asks the same.
SHORT_ANSWER_CUE = "The answer is:"
# Titles and place-name abbreviations whose period does not end a short answer ("St. Louis")
ABBREVIATIONS = frozenset({"St", "Mt", "Ft", "Dr", "Mr", "Mrs", "Ms", "Gen", "Lt", "Sgt", "Capt", "Rev"})
SHORT_SYSTEM_PROMPT = (
    "Answer with the shortest phrase from the passage that answers the question: "
    "a name, a place, a date or a number, not a sentence."
)
SHORT_CLOSED_BOOK_SYSTEM_PROMPT = (
    "Answer with the shortest phrase that answers the question: a name, a place, a date or a number, not a sentence."
)


@dataclass
class GenState:
    """Rows of generator state: one row per (beam, doc) pair, or per candidate x doc."""

    cache: Cache
    mask: torch.Tensor  # (R, S) encoder mask (enc-dec) or prompt+generated mask (dec-only)
    encoder_hidden: torch.Tensor | None = None  # (R, S, H) enc-dec only
    next_pos: torch.Tensor | None = None  # (R,) dec-only: position id of the next token
    # enc-dec: the cross-attention mask, built from `mask` once per state (None: no padding)
    cross_mask: torch.Tensor | None = None  # (R, 1, 1, S)
    # dec-only prefill(score_last=n): log p(prompt token | the prompt before it) of each row's
    # last n prompt tokens (R, n), read from the prefill's own logits (the question's likelihood
    # under each passage, RagSettings.question_weight); None when not asked for
    prompt_lp: torch.Tensor | None = None
    # dec-only with kept hidden states (DecoderOnlyGenerator.hidden_cache): each row's digest of its
    # tokens so far; the tokens fed since the model last ran (R, p), while every position they
    # asked for was kept; and, when not even the prefill has run (cache None), the prompts' prefill
    # to run once a row needs the model, with each row's prompt in it
    digests: list[bytes] | None = None
    pending: torch.Tensor | None = None  # (R, p)
    lazy: "tuple[LazyPrefill, list[int]] | None" = None

    @property
    def rows(self) -> int:
        return self.mask.shape[0]


class LazyPrefill:
    """A prefill whose log-probs were read from kept hidden states and not run: the states made
    from it (`select` copies, one per search) share it, so the first one that needs the model
    runs the prompts once for all of them and each copies its rows."""

    def __init__(self, prompts: Sequence[Sequence[int]]):
        self.prompts = prompts
        self._state: GenState | None = None
        self._lock = threading.Lock()

    def rows(self, gen: "DecoderOnlyGenerator", rows: list[int]) -> GenState:
        """A new state holding these rows of the prompts' prefill (run now if not yet)."""
        with self._lock:
            if self._state is None:
                _, self._state = gen._prefill(self.prompts, hidden=False)
        return gen.select(self._state, torch.tensor(rows, dtype=torch.long))


def pad_rows(rows: Sequence[Sequence[int]], pad: int, left: bool = False, min_width: int = 0
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """Id lists -> (R, W) ids and (R, W) mask (1 on real tokens), the one place padding is built.

    Right-padded by default (encoder inputs, teacher-forced targets); `left=True` for decoder-only
    prompts, so every row's last real token sits in the last column. W = max(longest row, min_width).
    """
    width = max([len(r) for r in rows] + [min_width])
    ids = torch.full((len(rows), width), pad, dtype=torch.long)  # (R, W)
    mask = torch.zeros((len(rows), width), dtype=torch.long)  # (R, W)
    for r, row in enumerate(rows):
        cols = slice(width - len(row), width) if left else slice(0, len(row))
        ids[r, cols] = torch.tensor(list(row), dtype=torch.long)
        mask[r, cols] = 1
    return ids, mask


class Prompt(list):
    """A decoder-only prompt's token ids (a list, usable wherever one is) with where its passage
    lies: `passage` = (start, end), the whole tokens [start, end) holding the passage's "title:
    text" (None: no passage, or its tokens could not be told apart). `DecoderOnlyGenerator.prefill`
    keeps those tokens' keys and values for later questions (PassageKVCache); any split is exact,
    this one makes a passage's tokens the same in every prompt that reads it."""

    def __init__(self, ids: Sequence[int], passage: tuple[int, int] | None = None):
        super().__init__(ids)
        self.passage = passage


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
    (`DecoderOnlyGenerator._prefill_passages`) read them as a prefill of the whole prompt does
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
    pk, pv = layer.prefix_k[0], layer.prefix_v[0]  # (Hkv, P, d)
    Hkv, P, n = pk.shape[0], pk.shape[1], key.shape[2]
    g = H // Hkv
    scaling = d ** -0.5 if scaling is None else scaling
    q = (query * scaling).reshape(R, Hkv, g * L, d)  # (R, Hkv, gL, d): query head h reads kv head h // g
    qp = q.transpose(0, 1).reshape(Hkv, R * g * L, d)  # (Hkv, R·gL, d)
    s_pre = torch.bmm(qp, pk.transpose(1, 2)).view(Hkv, R, g * L, P).transpose(0, 1)  # (R, Hkv, gL, P)
    s_own = torch.matmul(q, key.transpose(2, 3)).view(R, Hkv, g, L, n)  # (R, Hkv, g, L, n)
    if attention_mask is not None:
        m = attention_mask[..., -n:].unsqueeze(2)  # (R|1, 1, 1, L, n)
        s_own = s_own.masked_fill(~m, float("-inf")) if m.dtype == torch.bool else s_own + m
    elif L > 1:  # no mask given: causal within the rows' own positions (query i sits at n - L + i)
        s_own = s_own.masked_fill(~torch.ones(L, n, dtype=torch.bool).tril(n - L), float("-inf"))  # (L, n)
    scores = torch.cat([s_pre, s_own.view(R, Hkv, g * L, n)], dim=-1)  # (R, Hkv, gL, P+n)
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)  # (R, Hkv, gL, P+n)
    pp = probs[..., :P].transpose(0, 1).reshape(Hkv, R * g * L, P)  # (Hkv, R·gL, P)
    out = torch.bmm(pp, pv).view(Hkv, R, g * L, d).transpose(0, 1)  # (R, Hkv, gL, d)
    out = out + torch.matmul(probs[..., P:], value)  # (R, Hkv, gL, d)
    return out.reshape(R, H, L, d).transpose(1, 2).contiguous(), None  # (R, L, H, d)


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


class _GrowingCache(DynamicCache):
    """A DynamicCache made of GrowingLayers (an empty one grows a layer per model layer on first use)."""

    def __init__(self, layers: list[GrowingLayer] | None = None):
        if layers:
            Cache.__init__(self, layers=layers)
        else:
            Cache.__init__(self, layer_class_to_replicate=GrowingLayer)


def _select_cache(cache: Cache, rows: torch.Tensor) -> Cache:
    """A new cache holding `rows` of `cache` (copies: the source is never mutated)."""
    if isinstance(cache, EncoderDecoderCache):
        return EncoderDecoderCache(
            _select_cache(cache.self_attention_cache, rows), _select_cache(cache.cross_attention_cache, rows)
        )
    if all(isinstance(layer, GrowingLayer) for layer in cache.layers):
        return _GrowingCache([layer.selected(rows) for layer in cache.layers])
    data = [(layer.keys.index_select(0, rows), layer.values.index_select(0, rows)) for layer in cache.layers]
    return DynamicCache(data)


_JOINERS = ".,'-"  # inside a word or number when between two letters or digits: "68.5", "632,702", "U.S."
# A number's magnitude belongs to it: "242" is not "242 million".
_MAGNITUDE = re.compile(r"\s+(?:thousand|million|billion|trillion)\b", re.IGNORECASE)


def _joined(text: str, p: int) -> bool:
    """Is character position p (the boundary between text[p-1] and text[p]) inside a word or a
    number? "Can|berra", "6|3", "68|.5", "68.|5", "632|,702", "68.5| million", "O|'Brien" are;
    "Paris|, France", "68.5 million| people", "U.S.| dollar", "Dante|'s" (a possessive) are not."""
    if p <= 0 or p >= len(text):
        return False
    a, b = text[p - 1], text[p]
    possessive = b == "'" and text[p + 1: p + 2] in ("s", "S") and not text[p + 2: p + 3].isalnum()
    return ((a.isalnum() and b.isalnum())
            or (a.isalnum() and b in _JOINERS and p + 1 < len(text) and text[p + 1].isalnum() and not possessive)
            or (a in _JOINERS and p >= 2 and text[p - 2].isalnum() and b.isalnum())
            or (a.isdigit() and _MAGNITUDE.match(text, p) is not None))


class Span(list):
    """A passage's token ids that an extractive answer may copy (a list, usable wherever one is),
    with where a copy may start and end: `starts` holds the positions j whose token opens a word,
    `stops` the positions j such that a copy ending with token j-1 ends a word (len(self)
    included). None: anywhere. Without them a copy could stop inside a number and splice two:
    the model starts its remembered "68", the passage offers "63" (of "632,702"), and "63." ends."""

    def __init__(self, ids, starts: frozenset[int] | None = None, stops: frozenset[int] | None = None):
        super().__init__(ids)
        self.starts, self.stops = starts, stops

    @classmethod
    def from_offsets(cls, ids: list[int], text: str, offsets: list[tuple[int, int]]) -> "Span":
        """ids with their character offsets in `text` (a fast tokenizer's offset_mapping)."""
        starts = frozenset(j for j, (a, _) in enumerate(offsets) if not _joined(text, a))
        stops = frozenset(j + 1 for j, (_, b) in enumerate(offsets) if not _joined(text, b))
        return cls(ids, starts, stops | {len(ids)})


class Generator:
    """Interface shared by both kinds (see module docstring)."""

    kind: str
    name: str
    model: torch.nn.Module
    tokenizer: object
    eos_token_ids: list[int]
    pad_token_id: int

    def prompt(self, question: str, doc: Doc | None, max_doc_tokens: int, style: str = "sentence",
               question_position: str = "after", examples: Sequence[tuple] = ()) -> list[int]:
        """Input ids for one (question, doc) pair, or the closed-book input (doc None), in
        answer style `style` (RagSettings.answer_style), after `examples` worked examples
        (RagSettings.worked_examples; decoder-only), the question placed by
        `question_position` (RagSettings.question_position)."""
        raise NotImplementedError

    def stop_token_ids(self, style: str = "sentence") -> list[int]:
        """The ids that end an answer in `style`: EOS, and for styles that stop early more. A stop
        token is a generated token: it is kept in the answer's ids and scored like any other."""
        return self.eos_token_ids

    def prefill(self, prompts: Sequence[Sequence[int]], score_last: int = 0) -> tuple[torch.Tensor, GenState]:
        """Run R prompts; -> next-token log-probs (R, V) and the state after them. score_last=n
        (decoder-only) also keeps, in state.prompt_lp (R, n), the log-prob of each row's last n
        prompt tokens given the tokens before them, from the same forward pass."""
        raise NotImplementedError

    def cached_tokens(self, prompts: Sequence[Sequence[int]], score_last: int = 0) -> int:
        """How many of the prompts' tokens a prefill would not run because their keys and values
        are kept from earlier questions (passages: DecoderOnlyGenerator.passage_cache); 0 here."""
        return 0

    def kept_caches(self) -> dict[str, PassageKVCache]:
        """What this generator keeps for later questions, by name ("passages", "hidden_states"):
        each bounded, with its stats; none here."""
        return {}

    def prompts_kept(self, prompts: Sequence[Sequence[int]]) -> bool:
        """Whether the last hidden state of every prompt is kept from an earlier question, so that
        their prefill runs no model call (DecoderOnlyGenerator.hidden_cache); False here."""
        return False

    def question_tail(self, prompt: Sequence[int], question: str) -> tuple[int, int] | None:
        """(n_question, n_after): where the question's tokens sit in `prompt`, counted from its
        end (prompt[-(n_question + n_after):-n_after]), when the generator predicts them (a
        decoder-only prompt holds the question after the passage); None when it does not (an
        encoder reads its input) or they cannot be found as one run of tokens."""
        return None

    def common_question_tail(self, prompts: Sequence[Sequence[int]], question: str) -> tuple[int, int] | None:
        """`question_tail` when it is the same in every prompt (the rows are left-padded, so the
        question's positions then align from the end in all of them), else None."""
        tails = {self.question_tail(p, question) for p in prompts}
        return tails.pop() if len(tails) == 1 else None

    @torch.inference_mode()
    def advance(self, state: GenState, tokens: torch.Tensor) -> torch.Tensor:
        """Feed tokens (R, L) to every row, in place; -> float32 log-probs (R, L, V) of the next tokens."""
        return _log_softmax(self._logits(self._hidden(state, tokens)))  # (R, L, V)

    @torch.inference_mode()
    def advance_gather(self, state: GenState, tokens: torch.Tensor, targets: torch.Tensor,
                       max_logits: int = LOGITS_CHUNK) -> torch.Tensor:
        """Feed tokens (R, L) to every row, in place; -> log p(targets) (R, L): the log-prob of
        targets[:, j] as the token after tokens[:, :j+1]. The vocabulary projection runs over
        slices of positions so at most `max_logits` logits exist at once: teacher-forcing many
        candidates never builds an (R, L, V) tensor."""
        hidden = self._hidden(state, tokens)  # (R, L, H)
        R, L = tokens.shape
        step = max(1, max_logits // max(1, R * self.vocab_size))  # positions per slice
        out = []
        for a in range(0, L, step):
            logits = self._logits(hidden[:, a: a + step]).float()  # (R, l, V)
            picked = logits.gather(2, targets[:, a: a + step].unsqueeze(-1)).squeeze(-1)  # (R, l)
            out.append(picked - torch.logsumexp(logits, dim=-1))  # (R, l) log_softmax, gathered first
        return torch.cat(out, dim=1)  # (R, L)

    def advance_slices(self, state: GenState, tokens: torch.Tensor, max_logits: int = LOGITS_CHUNK):
        """Feed tokens (R, L) to every row, in place; yield (a, log-probs (R, l, V)) for positions
        a..a+l-1, each the next-token distribution after tokens[:, :a+j+1]: the full
        distributions of a teacher-forced pass, a slice at a time (at most `max_logits` logits)."""
        hidden = self._hidden(state, tokens)  # (R, L, H)
        R, L = tokens.shape
        step = max(1, max_logits // max(1, R * self.vocab_size))  # positions per slice
        for a in range(0, L, step):
            yield a, torch.log_softmax(self._logits(hidden[:, a: a + step]).float(), dim=-1)  # (R, l, V)

    def _hidden(self, state: GenState, tokens: torch.Tensor) -> torch.Tensor:
        """Run tokens (R, L) through the model with the state's cache (updated in place) -> (R, L, H)."""
        raise NotImplementedError

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The vocabulary projection of hidden states (..., H) -> logits (..., V)."""
        raise NotImplementedError

    @property
    def vocab_size(self) -> int:
        return self.model.get_output_embeddings().weight.shape[0]

    def select(self, state: GenState, rows: torch.Tensor) -> GenState:
        """A new state made of `rows` of `state` (a row may repeat); `state` is left as it was."""
        raise NotImplementedError

    def start_tokens(self) -> list[int]:
        """Tokens every output begins with that the model did not choose (BART's decoder start)."""
        return []

    # -- text ---------------------------------------------------------------
    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True).strip()

    def token_pieces(self, ids: Sequence[int]) -> list[str]:
        """The text each token adds (incremental decoding keeps leading spaces right)."""
        pieces, prev = [], ""
        for i in range(len(ids)):
            text = self.tokenizer.decode(list(ids[: i + 1]), skip_special_tokens=True)
            pieces.append(text[len(prev):] if text.startswith(prev) else self.tokenizer.decode([ids[i]]))
            prev = text
        return pieces

    def is_special(self, token_id: int) -> bool:
        return token_id in self.tokenizer.all_special_ids

    def piece(self, token_id: int) -> str:
        """One token as text on its own (a special token by its name, e.g. the end of the answer)."""
        if self.is_special(token_id):
            return str(self.tokenizer.convert_ids_to_tokens(int(token_id)))
        return self.tokenizer.decode([int(token_id)])


def _stacked(layers: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """Per-layer (keys, values), each (heads, L, d), as one tensor (layers, 2, heads, L, d) (a copy)."""
    k0 = layers[0][0]
    out = k0.new_empty((len(layers), 2, *k0.shape))  # (layers, 2, heads, L, d)
    for i, (k, v) in enumerate(layers):
        out[i, 0], out[i, 1] = k, v
    return out


def _last_tokens(prompts, n: int) -> torch.Tensor:
    """Each prompt's last n tokens (R, n)."""
    return torch.tensor([list(p[len(p) - n:]) for p in prompts], dtype=torch.long).view(len(prompts), n)


def _log_softmax(logits: torch.Tensor) -> torch.Tensor:
    return F.log_softmax(logits.float(), dim=-1)


class EncoderDecoderGenerator(Generator):
    """BART (or any seq2seq LM) as in the paper's RAG checkpoints."""

    kind = ENCODER_DECODER

    def __init__(self, model, tokenizer, name: str = "bart", max_input_tokens: int = 300):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.name = name
        cfg = model.config
        self.decoder_start_token_id = cfg.decoder_start_token_id
        self.pad_token_id = cfg.pad_token_id
        self.eos_token_ids = [cfg.eos_token_id]
        self.max_input_tokens = max_input_tokens  # the reference's max_combined_length

    def start_tokens(self) -> list[int]:
        return [self.decoder_start_token_id]

    def prompt(self, question: str, doc: Doc | None, max_doc_tokens: int, style: str = "sentence",
               question_position: str = "after", examples: Sequence[tuple] = ()) -> list[int]:
        # `style`, `question_position` and `examples` are ignored: BART-NQ was fine-tuned to answer in spans,
        # with this input format, and its encoder reads the whole input at once.
        tok = self.tokenizer
        if doc is None:
            return tok(question, truncation=True, max_length=self.max_input_tokens)["input_ids"]
        q_ids = tok(" // " + question, add_special_tokens=False)["input_ids"]
        budget = max(8, min(max_doc_tokens, self.max_input_tokens - len(q_ids) - 2))
        doc_ids = tok(f"{doc.title} / {doc.text}", add_special_tokens=False)["input_ids"]
        if len(doc_ids) > budget:  # cut the passage, never the question
            doc_ids = doc_ids[:budget]
        text = (tok.decode(doc_ids) + " // " + question).replace("  ", " ")
        return tok(text)["input_ids"]

    @torch.inference_mode()
    def prefill(self, prompts, score_last: int = 0):
        if score_last:
            raise ValueError(
                f"score_last={score_last!r}: an encoder-decoder generator reads its input, it does not predict it; "
                "use score_last=0 (question_tail is None for this generator)."
            )
        ids, mask = pad_rows(prompts, self.pad_token_id)  # (R, S) right-padded
        return self.prefill_ids(ids, mask)

    @torch.inference_mode()
    def prefill_ids(self, ids: torch.Tensor, mask: torch.Tensor):
        """Prefill from already-built input ids (R, S) and mask (R, S)."""
        hidden = self.model.get_encoder()(input_ids=ids, attention_mask=mask).last_hidden_state  # (R, S, H)
        state = GenState(
            cache=EncoderDecoderCache(_GrowingCache(), DynamicCache()), mask=mask, encoder_hidden=hidden,
            cross_mask=self._cross_mask(mask, hidden),
        )
        start = torch.full((ids.shape[0], 1), self.decoder_start_token_id, dtype=torch.long)  # (R, 1)
        return self.advance(state, start)[:, -1], state  # (R, V)

    def _cross_mask(self, mask: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor | None:
        """The encoder padding mask (R, S) as the 4D mask the decoder's cross-attention takes, in
        the form the model's attention implementation wants (None when nothing is padded).
        Built once per prefill: given the 2D mask, transformers rebuilds it at every decoding
        step, a noticeable share of a step of the tiny test models (docs/DESIGN.md §5)."""
        return create_bidirectional_mask(
            config=self.model.config, inputs_embeds=hidden[:, :1], attention_mask=mask, encoder_hidden_states=hidden
        )  # (R, 1, 1, S) or None

    @torch.inference_mode()
    def _hidden(self, state, tokens):
        out = self.model.model(
            encoder_outputs=(state.encoder_hidden,),
            attention_mask=state.cross_mask,  # 4D, or None: the decoder uses it as given
            decoder_input_ids=tokens,
            past_key_values=state.cache,
            use_cache=True,
        )
        state.cache = out.past_key_values
        return out.last_hidden_state  # (R, L, H)

    def _logits(self, hidden):
        return self.model.lm_head(hidden) + self.model.final_logits_bias  # (..., V) as BartForConditionalGeneration

    def select(self, state, rows):
        return GenState(
            cache=_select_cache(state.cache, rows),
            mask=state.mask.index_select(0, rows),
            encoder_hidden=state.encoder_hidden.index_select(0, rows),
            cross_mask=None if state.cross_mask is None else state.cross_mask.index_select(0, rows),
        )


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
        self._kept: list[tuple[tuple[int, ...], _GrowingCache]] = []  # recent prefixes' KV (`_prefix_kv`)
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

    def messages(self, question: str, doc: Doc | None, max_doc_tokens: int, style: str = "sentence",
                 question_position: str = "after", examples: Sequence[tuple] = ()) -> list[dict]:
        """The chat turns for one doc (None: closed-book). question_position "both" puts the
        question before the passage as well as after it (RagSettings.question_position);
        `examples` (title, passage, question, short answer, sentence answer): worked examples that come
        first as earlier turns (rag_demo.reader.examples), each asked
        and answered the way the real question is (closed-book: without their passages)."""
        short = style == "short"
        if doc is None:
            system = SHORT_CLOSED_BOOK_SYSTEM_PROMPT if short else CLOSED_BOOK_SYSTEM_PROMPT
            user = lambda q, title, text: f"Question: {q}"  # noqa: E731
        else:
            system = SHORT_SYSTEM_PROMPT if short else SYSTEM_PROMPT
            ask = "" if short else "\nAnswer in a few words."

            def user(q, title, text):
                before = f"Question: {q}\n\n" if question_position == "both" else ""
                return f"{before}{title}: {text}\n\nQuestion: {q}{ask}"

        turns = [{"role": "system", "content": system}]
        for title, text, q, span, sentence in examples:
            answer = f"{SHORT_ANSWER_CUE} {span}." if short else sentence
            turns += [{"role": "user", "content": user(q, title, text)}, {"role": "assistant", "content": answer}]
        text = None if doc is None else self._doc_text(doc, max_doc_tokens)
        turns.append({"role": "user", "content": user(question, None if doc is None else doc.title, text)})
        return turns

    def stop_token_ids(self, style: str = "sentence") -> list[int]:
        """short: EOS, every token that ends a line (its text holds a newline with only
        whitespace after it) and every sentence-final period token ("." alone, or followed by
        whitespace only), so an answer is one phrase; except a period right after an initial or
        a title's abbreviation ("U.S. dollar", "J. K. Rowling", "St. Louis": decoding.StopRule),
        which looks one token back, or after a digit ("68.5 million": a decimal point; a year's
        final period then leaves the end to the model's end of turn or newline). A period after
        any other abbreviation ("Inc.") still ends it."""
        if style != "short":
            return self.eos_token_ids
        if not hasattr(self, "_short_rule"):
            vocab = self.tokenizer.get_vocab()
            ids = sorted(vocab.values())
            texts = self.tokenizer.batch_decode([[i] for i in ids])
            periods = [i for i, t in zip(ids, texts) if t.strip() == "."]
            line_ends = [i for i, t in zip(ids, texts) if "\n" in t and not t.split("\n", 1)[1].strip()]
            initials = [i for i, t in zip(ids, texts)
                        if (len(t.strip()) == 1 and t.strip().isupper()) or t.strip() in ABBREVIATIONS
                        or (t.strip().isdigit() and t.strip().isascii())]
            self._short_rule = StopRule([*self.eos_token_ids, *line_ends, *periods], soft=periods, after=initials)
        return self._short_rule

    def prompt(self, question, doc, max_doc_tokens, style="sentence", question_position="after", examples=()):
        """A `Prompt`: the chat template's token ids, with where the passage's tokens lie."""
        turns = self.messages(question, doc, max_doc_tokens, style, question_position, examples)
        ids = self.tokenizer.apply_chat_template(turns, add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        ids = list(ids)
        passage = None
        if doc is not None:
            before = f"Question: {question}\n\n" if question_position == "both" else ""
            passage = self._passage_tokens(turns, ids, before, f"{doc.title}: {self._doc_text(doc, max_doc_tokens)}")
        if style == "short":  # open the answer with the cue; the model writes the span after it
            ids += self.tokenizer(SHORT_ANSWER_CUE, add_special_tokens=False)["input_ids"]
        return Prompt(ids, passage)

    def _passage_tokens(self, turns: list[dict], ids: list[int], before: str, passage: str) -> tuple[int, int] | None:
        """[start, end): the tokens of `ids` (the chat template's tokens of `turns`) lying wholly
        inside `passage`, which the last turn holds right after `before`. A token that straddles
        either edge (a passage ending in a space merges it with the newline after it) is left
        out, so the same passage gives the same tokens in any prompt. None where the template's
        text cannot be matched to its tokens (a tokenizer without character offsets)."""
        if not getattr(self.tokenizer, "is_fast", False):
            return None
        content = turns[-1]["content"]
        if not content.startswith(before + passage):
            return None
        text = self.tokenizer.apply_chat_template(turns, add_generation_prompt=True, tokenize=False)
        at = text.rfind(content)
        enc = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        if at < 0 or list(enc["input_ids"]) != ids:  # the template tokenised its text otherwise
            return None
        a = at + len(before)
        b = a + len(passage)
        offsets = enc["offset_mapping"]
        start = next((j for j, (x, _) in enumerate(offsets) if x >= a), len(ids))
        end = next((j for j in range(start, len(ids)) if offsets[j][1] > b), len(ids))
        return (start, end) if start < end else None

    def title_answer_ids(self, title: str) -> list[int]:
        """A passage's title as a short answer, " Title.", tokenized the way an answer after the cue
        starts (a space, then words) and ends (the sentence-final period: the short style's stop)."""
        return self.tokenizer.encode(f" {title.strip().rstrip('.')}.", add_special_tokens=False)

    def span_ids(self, doc: Doc, max_doc_tokens: int) -> Span:
        """The token ids an extractive answer may copy from `doc`: " title: text" (the text cut as
        in the prompt), tokenized as words after a space, the way an answer after the cue starts;
        with where words start and end (from the tokenizer's character offsets) so a copy takes
        whole words and whole numbers (a slow tokenizer has no offsets: any token then)."""
        text = f" {doc.title}: {self._doc_text(doc, max_doc_tokens)}"
        if not getattr(self.tokenizer, "is_fast", False):
            return Span(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        enc = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        return Span.from_offsets(enc["input_ids"], text, enc["offset_mapping"])

    def _doc_text(self, doc: Doc, max_doc_tokens: int) -> str:
        """The passage text the prompt holds: whole, or cut to its first max_doc_tokens tokens."""
        text_ids = self.tokenizer(doc.text, add_special_tokens=False)["input_ids"]
        return doc.text if len(text_ids) <= max_doc_tokens else self.tokenizer.decode(text_ids[:max_doc_tokens])

    def question_tail(self, prompt, question):
        """The last run of the question's tokens (tokenized as " question", as it follows
        "Question:" in `messages`) in the prompt, counted from the end."""
        q = self.tokenizer(f" {question}", add_special_tokens=False)["input_ids"]
        ids, n = list(prompt), len(q)
        for start in range(len(ids) - n - 1, -1, -1):  # at least one token after it (the turn's end)
            if ids[start:start + n] == q:
                return n, len(ids) - start - n
        return None

    # How many recent prefixes' KV caches `_prefix_kv` keeps (0: none). One question's prefix is
    # ~400 tokens with 4 worked examples (~19 MB of float32 KV for SmolLM2-135M); four cover the
    # RAG and closed-book prompts of two settings without thrashing.
    KEPT_PREFIXES = 4

    @torch.inference_mode()
    def _prefix_kv(self, prefix: tuple[int, ...]) -> "_GrowingCache":
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
        cache = _GrowingCache() if best is None else _GrowingCache(
            [layer.cropped(L) for layer in best.layers])  # (1, heads, L, d) copies
        if L < len(prefix):
            rest = torch.tensor([list(prefix[L:])])  # (1, P-L)
            self.model.model(input_ids=rest, position_ids=torch.arange(L, len(prefix)).unsqueeze(0),
                             past_key_values=cache, use_cache=True)
            self.prefix_tokens_run += len(prefix) - L
        if self.KEPT_PREFIXES:
            keep = _GrowingCache([layer.cropped(len(prefix)) for layer in cache.layers])  # never handed out
            with self._kept_lock:  # the most recent last; the oldest dropped
                others = [(k, v) for k, v in self._kept if k != prefix]
                self._kept = (others + [(prefix, keep)])[-self.KEPT_PREFIXES:]
        return cache

    @torch.inference_mode()
    def prefill(self, prompts, score_last: int = 0):
        """`_prefill` of the prompts, or, when the last hidden states of every prompt (and of the
        n = score_last prefixes before it) are kept in `hidden_cache`, no model call at all: the
        log-probs come from the kept states and the state is lazy (`GenState.lazy`): the prompts'
        prefill runs, once for every copy of the state, when a later step reads something not kept
        (`_hidden`), and the tokens fed meanwhile run after it. Every hidden state computed is kept."""
        if not 0 <= score_last < min(len(p) for p in prompts):
            raise ValueError(f"score_last={score_last!r} is out of range: use 0 to one less than the shortest prompt.")
        if not self.hidden_cache.max_bytes:
            hidden, state = self._prefill(prompts, score_last)  # (R, n+1, H)
            return self._first_step(self._logits(hidden), _last_tokens(prompts, score_last), score_last, state)
        R = len(prompts)
        digs = [[digest(p[: len(p) - j]) for j in range(score_last, -1, -1)] for p in prompts]  # (R, n+1)
        kept = [[self.hidden_cache.get(d) for d in row] for row in digs]  # (R, n+1) of (H,) or None
        if all(h is not None for row in kept for h in row):
            hidden = torch.stack([torch.stack(row) for row in kept])  # (R, n+1, H)
            state = GenState(cache=None, mask=torch.ones((R, 0), dtype=torch.long),
                             lazy=(LazyPrefill(prompts), list(range(R))))
        else:
            hidden, state = self._prefill(prompts, score_last)  # (R, n+1, H)
            self._keep(digs, kept, hidden)
        state.digests, state.pending = [row[-1] for row in digs], torch.zeros((R, 0), dtype=torch.long)  # pending (R, 0)
        return self._first_step(self._logits(hidden), _last_tokens(prompts, score_last), score_last, state)

    def _keep(self, digs: list[list[bytes]], kept: list[list], hidden: torch.Tensor) -> None:
        """Keep hidden[r, j] (R, L, H) under digs[r][j] where kept[r][j] says it was not kept."""
        for r, row in enumerate(digs):
            for j, d in enumerate(row):
                if kept[r][j] is None:
                    self.hidden_cache.put(d, hidden[r, j])

    def _prefill(self, prompts, score_last: int = 0, hidden: bool = True) -> tuple[torch.Tensor | None, GenState]:
        """The K doc prompts share their opening (system prompt, chat header, worked examples):
        it runs once, as one row, its KV cache is held once for every row (SharedPrefixLayer), and
        only the rest of each prompt runs per row, left-padded after it (the padding is masked out
        and skipped by the position ids, so every row reads exactly its prompt). The opening's own
        KV comes from `_prefix_kv`, which reuses what earlier questions share; each passage's from
        `passage_cache` where an earlier question computed it (`_prefill_passages`).
        -> the hidden states of each row's last score_last + 1 prompt positions (R, n+1, H) and the state;
        hidden=False: only the state is wanted (None may come instead of the states, when every row's
        keys and values are kept and nothing had to run)."""
        split = self._passage_split(prompts, score_last)
        if split is not None:
            return self._prefill_passages(prompts, score_last, *split, hidden=hidden)
        P = shared_prefix(prompts, keep=score_last + 1)
        if len(prompts) == 1 and self.KEPT_PREFIXES:  # one row (closed-book): its opening can be kept too
            P = max(0, len(prompts[0]) - score_last - 1)
            P = P if P >= MIN_SHARED_PREFIX else 0
        cache, head = _GrowingCache(), torch.zeros((len(prompts), 0), dtype=torch.long)  # (R, 0)
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
        return out.last_hidden_state[:, -(score_last + 1):], state  # (R, n+1, H)

    def _opening_cache(self, opening: tuple[int, ...]) -> "_GrowingCache":
        """An empty R-row cache over `opening`'s KV, held once for all rows (SharedPrefixLayer:
        not a copy in each row; each row's cache holds its own positions only)."""
        one = self._prefix_kv(opening)  # (1, heads, P, d) per layer
        return _GrowingCache([SharedPrefixLayer(layer.keys, layer.values) for layer in one.layers])

    @staticmethod
    def _first_step(logits: torch.Tensor, ids: torch.Tensor, score_last: int, state: GenState):
        """-> the next-token log-probs (R, V) from the prefill's logits (R, n+1, V), and the state,
        with the log-probs of the last n prompt tokens (ids (R, n)) when asked for."""
        if score_last:
            lp = _log_softmax(logits[:, :-1])  # (R, n, V): position j predicts token j+1
            state.prompt_lp = lp.gather(2, ids[:, -score_last:].unsqueeze(-1)).squeeze(-1)  # (R, n)
        return _log_softmax(logits[:, -1]), state  # (R, V)

    def _passage_split(self, prompts, score_last: int) -> tuple[int, list[int]] | None:
        """(s, ends): where each prompt's passage lies, cut as [opening: ..s][passage: s..end][rest]
        with the opening the same tokens in every prompt and the rest holding at least the last
        score_last + 1 tokens (the positions whose logits the prefill keeps); None when the prompts
        cannot be split so (no `Prompt.passage`, an opening too short to keep) or no cache is kept."""
        if not self.passage_cache.max_bytes or not all(getattr(p, "passage", None) for p in prompts):
            return None
        s = min(p.passage[0] for p in prompts)
        first = prompts[0]
        s = next((i for i in range(s) if any(p[i] != first[i] for p in prompts[1:])), s)  # shared by every prompt
        ends = [p.passage[1] for p in prompts]
        if s < MIN_SHARED_PREFIX or any(e <= s or len(p) - e <= score_last for p, e in zip(prompts, ends)):
            return None
        return s, ends

    def _passage_keys(self, prompts, s: int, ends: list[int]) -> list[tuple]:
        """Each prompt's passage's key in `passage_cache`: everything its keys and values depend
        on (this model, its dtype, the opening's tokens, the passage's tokens)."""
        opening, dtype = tuple(prompts[0][:s]), next(self.model.parameters()).dtype
        return [(self._model_key, dtype, opening, tuple(p[s:e])) for p, e in zip(prompts, ends)]

    def prompts_kept(self, prompts) -> bool:
        return bool(self.hidden_cache.max_bytes) and all(digest(p) in self.hidden_cache for p in prompts)

    def cached_tokens(self, prompts, score_last: int = 0) -> int:
        split = self._passage_split(prompts, score_last)
        if split is None:
            return 0
        s, ends = split
        keys = self._passage_keys(prompts, s, ends)
        return sum(e - s for k, e in zip(keys, ends) if k in self.passage_cache)

    @torch.inference_mode()
    def _prefill_passages(self, prompts, score_last: int, s: int, ends: list[int], hidden: bool = True):
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
                self.passage_cache.put(rest_keys[r], _stacked([(lay.keys[r, :, cols], lay.values[r, :, cols])
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
                self.passage_cache.put(keys[r], _stacked(own))
            keep_rests(layers)
            state = GenState(cache=out.past_key_values, mask=mask, next_pos=rest_pos[:, -1] + 1)  # next_pos (R,)
            return out.last_hidden_state[:, -(score_last + 1):], state  # (R, n+1, H)
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
                kept[r] = _stacked(own)  # (layers, 2, heads, L, d)
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
        cache = _GrowingCache(rows_cache)
        if whole:  # nothing to run: the state of the whole prompts, from what was kept
            return None, GenState(cache=cache, mask=mask, next_pos=rest_pos[:, -1] + 1)  # next_pos (R,)
        out = self.model.model(
            input_ids=rest_ids, attention_mask=mask, position_ids=rest_pos, past_key_values=cache, use_cache=True,
            prefix_cache=cache, prefill=True,  # SDPA, as the one-call prefill
        )
        self.positions_run += int(rest_mask.sum())
        keep_rests(out.past_key_values.layers)
        state = GenState(cache=out.past_key_values, mask=mask, next_pos=rest_pos[:, -1] + 1)  # next_pos (R,)
        return out.last_hidden_state[:, -(score_last + 1):], state  # (R, n+1, H)

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
            cache=None if state.cache is None else _select_cache(state.cache, rows),
            mask=state.mask.index_select(0, rows),
            next_pos=None if state.next_pos is None else state.next_pos.index_select(0, rows),
            digests=None if state.digests is None else [state.digests[i] for i in picked],
            pending=None if state.pending is None else state.pending.index_select(0, rows),
            lazy=None if state.lazy is None else (state.lazy[0], [state.lazy[1][i] for i in picked]),
        )


class SharedPrefill:
    """A generator whose prefill of the same prompts runs once.

    RAG-Token and RAG-Sequence read the same K prompts with the same generator (offline stack),
    so a question answered in both modes pays for one prefill, the larger part of its time on a
    CPU. Every caller gets its own copy of the state (`select` copies), so neither sees the
    other's decoding, and the log-probs are a copy too: what each mode computes is exactly what
    it computes alone. Everything else is the wrapped generator's. Use one per question: it keeps
    every prompt set it was asked for (the K doc prompts, and with RagSettings.context_contrast the
    closed-book prompt too, which would otherwise push the K prompts out between the two modes).
    """

    def __init__(self, gen: Generator) -> None:
        self._gen = gen
        self._outs: dict[tuple, tuple[torch.Tensor, GenState]] = {}
        self._made: dict[tuple, object] = {}
        self.prefills = 0  # how many prefills actually ran (tests read it)

    def shared(self, key: tuple, make):
        """make() once per key for this question: work both RAG modes would repeat with the same
        result (each doc's own drafts: engine._doc_drafts, whose key names everything they depend on)."""
        if key not in self._made:
            self._made[key] = make()
        return self._made[key]

    def __getattr__(self, name):
        return getattr(self._gen, name)

    def prefill(self, prompts, score_last: int = 0):
        key = (score_last, tuple(tuple(p) for p in prompts))
        if key not in self._outs:
            self._outs[key] = self._gen.prefill(prompts, score_last=score_last)
            self.prefills += 1
        first_lp, state = self._outs[key]  # (R, V), R rows
        copy = self._gen.select(state, torch.arange(state.rows))
        copy.prompt_lp = None if state.prompt_lp is None else state.prompt_lp.clone()  # (R, n)
        return first_lp.clone(), copy
