"""Kept keys and values of retrieved passages, reused by every later prompt that reads them.

A decoder-only prompt reads [shared opening][passage][question]. Causal attention makes the keys
and values of the passage's tokens a function of the opening's tokens and its own, at fixed
positions, whatever question follows: so they are kept here once computed, and a later question
that retrieves the same passage after the same opening (a re-ask with another setting, a passage
taken away, the other RAG mode) runs only its question part (`DecoderOnlyGenerator.prefill`,
docs/DESIGN.md §5).

With kept hidden states on (below), the question part after a passage is kept too, under the
passage's key and its own tokens: a re-ask then rebuilds its prompts' state without running them.

`PassageKVCache` is bounded in bytes, evicts the least recently used entry first and is safe to
share between threads. An entry's key names everything its values depend on (the generator's
model, its dtype, the opening's token ids, the passage's token ids); an entry is a copy made
when stored and is only ever read afterwards.
"""
from __future__ import annotations

import hashlib
import threading
from array import array
from collections import OrderedDict
from dataclasses import dataclass

import torch

# The app's memory promise (serving.budget.Budget: 1.8 GB after a class's wave) leaves this much: ~3.5k
# passage tokens of SmolLM2-135M's float32 keys and values (46 KB a token), twice that in bfloat16.
DEFAULT_MAX_BYTES = 160 * 2**20


@dataclass(frozen=True)
class PassageCacheStats:
    """What a PassageKVCache holds and how it has served: bytes and entries now, hits and misses
    (one per passage looked up), entries evicted to stay within `max_bytes`."""

    bytes: int
    entries: int
    hits: int
    misses: int
    evictions: int
    max_bytes: int


class PassageKVCache:
    """Passage segments' keys and values, least recently used evicted first, at most `max_bytes`.

    An entry is one tensor (layers, 2, kv heads, L, d): keys then values of the L passage tokens
    in every layer, one row. `put` takes a tensor that becomes the cache's own (a fresh one that
    nothing else writes: the generator stacks a copy); `get` hands it out for reading only (the
    generator copies it into each question's own cache). max_bytes 0 keeps nothing (the generator
    then prefills as if there were no cache)."""

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.max_bytes = _checked_bytes(max_bytes)
        self._entries: OrderedDict[tuple, torch.Tensor] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self._hits = self._misses = self._evictions = 0

    def get(self, key: tuple, count: bool = True) -> torch.Tensor | None:
        """The entry under `key` (now the most recently used), or None; counted as a hit or a miss
        (count=False: not counted, for entries that are not passages: the question parts kept after
        them). Read it, never write it: it is the cache's own."""
        with self._lock:
            kv = self._entries.get(key)
            if kv is None:
                self._misses += count
                return None
            self._entries.move_to_end(key)
            self._hits += count
            return kv

    def __contains__(self, key: tuple) -> bool:
        """Is an entry kept under `key`? (A look only: neither a use nor a hit or a miss.)"""
        with self._lock:
            return key in self._entries

    def put(self, key: tuple, kv: torch.Tensor) -> bool:
        """Keep kv (layers, 2, heads, L, d) under `key`, evicting the least recently used entries
        until it fits; -> False when it alone exceeds max_bytes (nothing is kept). kv becomes the
        cache's own: the caller must not write it afterwards (a view is copied first, so a caller's
        buffer never becomes an entry)."""
        size = kv.numel() * kv.element_size()
        if size > self.max_bytes:
            return False
        own = kv.detach()  # (layers, 2, heads, L, d)
        if own.untyped_storage().nbytes() != size or not own.is_contiguous():  # part of a larger buffer: copy it
            own = own.clone(memory_format=torch.contiguous_format)  # (layers, 2, heads, L, d)
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:  # two requests computed the same passage at once: keep one copy
                self._bytes -= old.numel() * old.element_size()
            while self._entries and self._bytes + size > self.max_bytes:
                _, dropped = self._entries.popitem(last=False)
                self._bytes -= dropped.numel() * dropped.element_size()
                self._evictions += 1
            self._entries[key] = own
            self._bytes += size
        return True

    def resize(self, max_bytes: int) -> None:
        """A new bound; entries are evicted, oldest use first, until they fit it."""
        max_bytes = _checked_bytes(max_bytes)
        with self._lock:
            self.max_bytes = max_bytes
            while self._entries and self._bytes > max_bytes:
                _, dropped = self._entries.popitem(last=False)
                self._bytes -= dropped.numel() * dropped.element_size()
                self._evictions += 1

    def clear(self) -> None:
        """Drop every entry (the counters stay)."""
        with self._lock:
            self._entries.clear()
            self._bytes = 0

    def stats(self) -> PassageCacheStats:
        with self._lock:
            return PassageCacheStats(self._bytes, len(self._entries), self._hits, self._misses, self._evictions,
                                     self.max_bytes)

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)


def _checked_bytes(max_bytes: int) -> int:
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0:
        raise ValueError(f"max_bytes={max_bytes!r} must be a whole number of bytes, 0 (keep nothing) or more.")
    return max_bytes


# ~27k token positions of SmolLM2-135M's float32 hidden states (2.3 KB each), twice that in
# bfloat16: what a few hundred aided questions keep (docs/results.md §3.10).
DEFAULT_HIDDEN_BYTES = 64 * 2**20


class HiddenStateCache(PassageKVCache):
    """The last hidden state (H,) of token sequences the generator ran, keyed by the sequence's
    `digest` (its prompt, then every token fed after it): a causal model's state at a position is
    a function of the tokens up to it, so a later question that runs the same sequence (a re-ask:
    the same prompts, the same answer prefixes) reads it instead, and the next-token log-probs
    are the vocabulary projection of it. Bounded and evicted as PassageKVCache."""


def digest(tokens) -> bytes:
    """A token sequence's digest (16 bytes of BLAKE2b over its ids)."""
    return hashlib.blake2b(array("q", tokens).tobytes(), digest_size=16, person=b"rag-prompt").digest()


def extend(d: bytes, token: int) -> bytes:
    """The digest of a sequence with digest d followed by `token`. A sequence reached by extending is
    named otherwise than the same ids as one prompt: only a missed reuse, never a wrong one."""
    return hashlib.blake2b(d + int(token).to_bytes(8, "little", signed=True), digest_size=16,
                           person=b"rag-extend").digest()


def chain(d: bytes, tokens) -> list[bytes]:
    """The digests after each of `tokens` fed in turn to a sequence with digest d."""
    out = []
    for t in tokens:
        d = extend(d, t)
        out.append(d)
    return out
