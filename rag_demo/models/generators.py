"""Generator adapters: what the RAG engine needs from a language model, for both kinds.

Owns turning (question, doc) into generator input ids, and running the model row-wise with a
KV cache: `prefill` the K doc-conditioned inputs at once, `advance` every row by one or more
tokens (one token while decoding, a whole answer when teacher-forcing), and `select` rows
(beam reordering, or copying a prefilled state to score candidates). Two kinds:

* `EncoderDecoderGenerator` (models/encoder_decoder.py): BART inside the paper's RAG checkpoints. Input
  `title / text // question` as in transformers' RagRetriever, but the passage is cut
  to its token budget first so truncation can never cut the question.
* `DecoderOnlyGenerator` (models/decoder_only.py): SmolLM2-135M-Instruct (offline stack). One chat prompt per doc
  holding that passage and the question; prompts are left-padded.

Every method returns float32 log-probabilities (log_softmax of the logits).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F
from transformers.cache_utils import Cache

from rag_demo.models import Doc
from rag_demo.models.passage_kv import PassageKVCache


# Most float32 logits alive at once when teacher-forcing (advance_gather): 32M x 4 bytes = 128 MB,
# whatever the number of candidates x docs x tokens being scored.
LOGITS_CHUNK = 32 * 2**20

ENCODER_DECODER = "encoder-decoder"
DECODER_ONLY = "decoder-only"

@dataclass
class GenState:
    """Rows of generator state: one row per (beam, doc) pair, or per candidate x doc."""

    cache: Cache
    mask: torch.Tensor  # (R, S) encoder mask (enc-dec) or prompt+generated mask (dec-only)
    encoder_hidden: torch.Tensor | None = None  # (R, S, H) enc-dec only
    next_pos: torch.Tensor | None = None  # (R,) dec-only: position id of the next token
    # enc-dec: the cross-attention mask, built from `mask` once per state (None: no padding)
    cross_mask: torch.Tensor | None = None  # (R, 1, 1, S)
    # dec-only prefill(keep_prompt_logprobs=n): log p(prompt token | the prompt before it) of each row's
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

    def rows(self, gen: "Generator", rows: list[int]) -> GenState:
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

    def prefill(self, prompts: Sequence[Sequence[int]], keep_prompt_logprobs: int = 0) -> tuple[torch.Tensor, GenState]:
        """Run R prompts; -> next-token log-probs (R, V) and the state after them. keep_prompt_logprobs=n
        (decoder-only) also keeps, in state.prompt_lp (R, n), the log-prob of each row's last n
        prompt tokens given the tokens before them, from the same forward pass."""
        raise NotImplementedError

    def cached_tokens(self, prompts: Sequence[Sequence[int]], keep_prompt_logprobs: int = 0) -> int:
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
        return log_softmax_f32(self._logits(self._hidden(state, tokens)))  # (R, L, V)

    def advance_many(self, items: Sequence[tuple]) -> list:
        """`advance` of several states, [(state, tokens (R_i, L_i))] -> [log-probs (R_i, L_i, V)], and
        `advance_gather` of those given targets, [(state, tokens, targets (R_i, L_i))] -> [log p(targets)
        (R_i, L_i)]: each what it gets alone; an item that cannot run gets its ValueError in its place
        and the others run. Here one after another; a generator that batches (decoder_only.py) runs
        them as one forward."""
        out = []
        for item in items:
            try:
                out.append(self.advance(*item) if len(item) < 3 else self.advance_gather(*item))
            except ValueError as e:
                out.append(e)
        return out

    @property
    def batch_key(self) -> int:
        """Steps with the same key may run in one `advance_many` call: the same model."""
        return id(self)

    def check_step(self, state: GenState, tokens: torch.Tensor, targets: torch.Tensor | None = None) -> ValueError | None:
        """Why tokens (R, L) cannot be fed to the state (None: they can): one row of token ids
        per state row, each id in the vocabulary; and targets, when given, the same for each token's next."""
        if tokens.dim() != 2 or tokens.dtype != torch.long:
            return ValueError(f"tokens of shape {tuple(tokens.shape)} and dtype {tokens.dtype}: feed (rows, length) "
                              "token ids (torch.long).")
        if tokens.shape[0] != state.rows:
            return ValueError(f"{tokens.shape[0]} rows of tokens for a state of {state.rows} rows: feed one row "
                              "of tokens per state row.")
        if tokens.numel() and not (0 <= int(tokens.min()) and int(tokens.max()) < self.vocab_size):
            return ValueError(f"token ids from {int(tokens.min())} to {int(tokens.max())}: use ids from 0 to "
                              f"{self.vocab_size - 1}, the generator's vocabulary.")
        if targets is not None:
            if targets.shape != tokens.shape or targets.dtype != torch.long:
                return ValueError(f"targets of shape {tuple(targets.shape)} and dtype {targets.dtype} for tokens of shape "
                                  f"{tuple(tokens.shape)}: give one target id (torch.long) per token fed.")
            return self.check_step(state, targets)
        return None

    @torch.inference_mode()
    def advance_gather(self, state: GenState, tokens: torch.Tensor, targets: torch.Tensor,
                       max_logits: int = LOGITS_CHUNK) -> torch.Tensor:
        """Feed tokens (R, L) to every row, in place; -> log p(targets) (R, L): the log-prob of
        targets[:, j] as the token after tokens[:, :j+1]. The vocabulary projection runs over
        slices of positions so at most `max_logits` logits exist at once: teacher-forcing many
        candidates never builds an (R, L, V) tensor."""
        return self._gathered(self._hidden(state, tokens), targets, max_logits)  # (R, L)

    def _gathered(self, hidden: torch.Tensor, targets: torch.Tensor, max_logits: int = LOGITS_CHUNK) -> torch.Tensor:
        """log p(targets) (R, L) from hidden states (R, L, H): log_softmax(W h)[target], a slice of
        positions at a time so that at most `max_logits` logits exist at once."""
        R, L = targets.shape
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

    def reorder(self, state: GenState, rows: torch.Tensor) -> GenState:
        """`select` for a state only the caller holds (a search's own copy), which may be changed
        in place and is then returned; the state must not be read afterwards (use the return)."""
        return self.select(state, rows)

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


def stacked_layers(layers: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """Per-layer (keys, values), each (heads, L, d), as one tensor (layers, 2, heads, L, d) (a copy)."""
    k0 = layers[0][0]
    out = k0.new_empty((len(layers), 2, *k0.shape))  # (layers, 2, heads, L, d)
    for i, (k, v) in enumerate(layers):
        out[i, 0], out[i, 1] = k, v
    return out


def last_tokens(prompts, n: int) -> torch.Tensor:
    """Each prompt's last n tokens (R, n)."""
    return torch.tensor([list(p[len(p) - n:]) for p in prompts], dtype=torch.long).view(len(prompts), n)


def log_softmax_f32(logits: torch.Tensor) -> torch.Tensor:
    return F.log_softmax(logits.float(), dim=-1)


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

    def prefill(self, prompts, keep_prompt_logprobs: int = 0):
        key = (keep_prompt_logprobs, tuple(tuple(p) for p in prompts))
        if key not in self._outs:
            self._outs[key] = self._gen.prefill(prompts, keep_prompt_logprobs=keep_prompt_logprobs)
            self.prefills += 1
        first_lp, state = self._outs[key]  # (R, V), R rows
        copy = self._gen.select(state, torch.arange(state.rows))
        copy.prompt_lp = None if state.prompt_lp is None else state.prompt_lp.clone()  # (R, n)
        return first_lp.clone(), copy
