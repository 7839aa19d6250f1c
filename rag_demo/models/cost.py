"""What a question costs in generator work, estimated before it runs.

`CostModel` prices one mode's answer from K, beams, max new tokens and prompt lengths:
    prefill   K·S prompt tokens, less those kept       x prefill_s_per_token
    decoding  T steps of R rows (R = K·B, or B)        x (step_s + R·row_s)
    scoring   rows·T teacher-forced tokens             x score_s_per_token
(S prompt length, T max new tokens, B beams; thorough RAG-Sequence scores all C ≤ K·B candidates
under all K docs; "kept": passage tokens whose keys and values an earlier question left in the
generator's passage cache, which a prefill does not run). `calibrate` measures the constants on
this CPU; attention's growth with context is not modelled (a small share of a small model's time
at these prompt lengths). Memory
counts the KV caches (rows x tokens x layers x 2 x kv width), their copies while beams are
reordered, the per-step logits and the scoring chunks. docs/DESIGN.md §10.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from rag_demo.models.machine import best_of

GiB = 2**30
# A calibrated constant stays within these factors of the default (see CostModel.calibrate).
CALIBRATION_RANGE = (0.2, 5.0)


@dataclass
class Cost:
    """An estimate: seconds of generator work and peak extra bytes of one request."""

    seconds: float
    peak_bytes: int
    per_mode: dict[str, float] = field(default_factory=dict)  # seconds per mode
    heavy: bool = False

    def describe(self) -> str:
        return f"about {_fmt_s(self.seconds)} and {self.peak_bytes / GiB:.1f} GB"


def _fmt_s(s: float) -> str:
    return f"{s:.1f} s" if s < 10 else f"{s:.0f} s"


@dataclass
class ModelDims:
    """What the cost model needs to know of a generator."""

    layers: int
    kv_width: int  # key (= value) width per token and layer: kv heads x head dim
    vocab: int
    dtype_bytes: int  # of the KV cache

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_width * self.dtype_bytes  # keys and values, every layer


def model_dims(gen) -> ModelDims:
    """ModelDims of a generator adapter (SmolLM2 / Llama-like, or BART's decoder)."""
    cfg = gen.model.config
    layers = getattr(cfg, "num_hidden_layers", None) or cfg.decoder_layers
    heads = getattr(cfg, "num_key_value_heads", None) or getattr(cfg, "decoder_attention_heads", None) or cfg.num_attention_heads
    hidden = cfg.hidden_size if hasattr(cfg, "hidden_size") else cfg.d_model
    heads_q = getattr(cfg, "num_attention_heads", None) or cfg.decoder_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or hidden // heads_q
    dtype_bytes = next(gen.model.parameters()).element_size()
    if gen.kind == "encoder-decoder":
        layers *= 2  # self-attention and cross-attention caches
    return ModelDims(layers, heads * head_dim, gen.vocab_size, dtype_bytes)


@dataclass
class CostModel:
    """Seconds per unit of generator work on this CPU (see the module docstring). Defaults are
    SmolLM2-135M's costs on a small CPU; `calibrate` replaces them with the running machine's
    numbers at warm-up."""

    prefill_s_per_token: float = 0.0006
    step_s: float = 0.035  # a decoding step's cost that does not grow with rows (30 layers of small ops)
    row_s: float = 0.004  # each row of a decoding step
    score_s_per_token: float = 0.0012  # a teacher-forced token (the vocabulary projection included)
    calibrated: bool = False

    def request(self, dims: ModelDims, mode: str, k: int, beams: int, new_tokens: int, prompt_tokens: int,
                thorough: bool = True, scoring_rows: int = 64, logits_chunk: int = 32 * 2**20,
                drafts: str = "none", cached_tokens: int = 0, retries: int = 0,
                contrast_tokens: int = 0) -> tuple[float, int]:
        """(seconds, peak bytes) of one mode's answer, worst case (every output runs to new_tokens).
        retries (ReaderAids.echo_retries): each rejected answer is decoded again from its prefill, so
        the worst case decodes 1 + retries times. contrast_tokens (ReaderAids.context_contrast): the
        prompt without passages, prefilled once and run beside every decoding row at each step.
        drafts (RAG-Token, RagSettings.token_drafts): "own" decodes each doc's drafts too, "shared"
        takes RAG-Sequence's (asked in the same request); either way its k·B + B candidates may be
        scored under all k docs (rank_by_rag_token's worst case). cached_tokens: prompt tokens of
        the k prompts whose keys and values are kept (`Generator.cached_tokens`): not prefilled,
        still held by every row's cache (0, the worst case, when nothing is known)."""
        S, T, B = prompt_tokens, new_tokens, beams
        kv = dims.kv_bytes_per_token
        step_logits = 3 * 4 * dims.vocab  # float32 logits, log-softmax and mixing copies, per row
        draft_rows, batch = 0, None  # batch: rows scored at once, when not all `scored` rows in one go
        if mode == "closed-book":
            rows, prefill_rows, scored = B, 1, 0
        elif mode == "token" and drafts != "none":
            rows, prefill_rows, scored = B * k, k, k * (k * B + B)
            draft_rows, batch = (k * B if drafts == "own" else 0), k * B + B  # one doc's candidates at a time
        elif mode == "token":
            rows, prefill_rows, scored = B * k, k, (k if B > 1 else 0)
        else:
            cands = k * B if thorough else 1
            rows, prefill_rows, scored = k * B, k, k * cands
        prefilled = max(0, prefill_rows * S - cached_tokens)  # tokens the prefill runs
        contrast_rows = rows if contrast_tokens else 0  # each row's logits without its passage too
        decode = (T * (self.step_s + (rows + contrast_rows) * self.row_s)
                  + (T * (self.step_s + draft_rows * self.row_s) if draft_rows else 0.0))
        seconds = (prefilled * self.prefill_s_per_token + contrast_tokens * self.prefill_s_per_token
                   + (1 + retries) * decode
                   + scored * T * self.score_s_per_token)
        prefill_state = prefill_rows * S * kv + contrast_tokens * kv
        # a reorder copies the cache before freeing it
        decoding = 2 * rows * (S + T) * kv + 2 * contrast_rows * (contrast_tokens + T) * kv + rows * step_logits
        scoring = (min(batch or scored, scoring_rows) * (S + T) * kv + 4 * logits_chunk) if scored else 0
        peak = prefill_state + max(decoding, scoring)
        return seconds, int(peak)

    def expected(self, dims: ModelDims, mode: str, k: int, beams: int, new_tokens: int, prompt_tokens: int,
                 fit: CostFit, preset: str, thorough: bool = True, drafts: str = "none", cached_tokens: int = 0,
                 prompts_kept: bool = False) -> float:
        """Seconds one mode's answer takes as answers usually run (what a card shows beside the time
        it took), not the worst case `request` prices for the budget:

            expected = f · request(T = min(max new tokens, typical tokens))

        with the typical length and the factor f fitted per preset and mode (`CostFit`; f from the
        re-ask fit when every prompt's hidden state is kept, and then no prefill is priced)."""
        key = f"{preset}|{mode}"
        T = max(1, min(new_tokens, round(fit.typical_tokens.get(key, CostFit.DEFAULT_TOKENS))))
        prefill_rows = 1 if mode == "closed-book" else k
        cached = prefill_rows * prompt_tokens if prompts_kept else cached_tokens
        seconds, _ = self.request(dims, mode, k, beams, T, prompt_tokens, thorough=thorough, drafts=drafts,
                                  cached_tokens=cached)
        return seconds * (fit.reask if prompts_kept else fit.factor).get(key, 1.0)

    def calibrate(self, gen, prompt_tokens: int = 160, rows: int = 5, steps: int = 3, repeats: int = 3) -> "CostModel":
        """Measure this CPU: a prefill of `rows` prompts, decoding steps at 1 and `rows` rows, and
        a teacher-forced pass; -> a calibrated copy (a few seconds for SmolLM2). Each figure is
        the fastest of `repeats` (a busy neighbour only ever slows a run down), and each constant
        stays within CALIBRATION_RANGE of the default: a warm-up on a machine that is briefly
        overloaded must not make every later request look too expensive to serve."""
        import torch

        ids = [list(range(100, 100 + prompt_tokens))] * rows
        targets = torch.full((rows, 16), 300, dtype=torch.long)

        def timed(fn) -> float:  # each caller has made its own untimed call
            return best_of(fn, repeats, warm=False)

        _, st = gen.prefill(ids)  # untimed: first-call allocations
        prefill = timed(lambda: gen.prefill(ids)) / (rows * prompt_tokens)

        def step_time(r: int) -> float:
            state = gen.select(st, torch.arange(r))
            tok = torch.full((r, 1), 200, dtype=torch.long)
            gen.advance(state, tok)  # untimed
            return timed(lambda: [gen.advance(state, tok) for _ in range(steps)]) / steps

        one, many = step_time(1), step_time(rows)
        row_s = max(1e-5, (many - one) / (rows - 1))
        step_s = max(1e-4, one - row_s)
        score = timed(lambda: gen.advance_gather(gen.select(st, torch.arange(rows)), targets, targets)) / (rows * 16)
        lo, hi = CALIBRATION_RANGE
        measured = dict(prefill_s_per_token=prefill, step_s=step_s, row_s=row_s, score_s_per_token=score)
        kept = {k: min(max(v, lo * getattr(self, k)), hi * getattr(self, k)) for k, v in measured.items()}
        return CostModel(**kept, calibrated=True)


COST_FIT_PATH = Path(__file__).resolve().parents[2] / "assets" / "cost_fit.json"


@dataclass(frozen=True)
class CostFit:
    """How answers usually run, against the worst case `CostModel.request` prices: per
    "preset|mode", the answer's typical length in tokens and the factor that turns the priced
    seconds of that length into the seconds measured (fitted on the dev questions by
    `bench --fit-cost`, measure/cost_fit.py); `reask` the same factor for a question whose prompts'
    hidden states are all kept (a re-ask reads them instead of running the model)."""

    typical_tokens: dict[str, float] = field(default_factory=dict)
    factor: dict[str, float] = field(default_factory=dict)
    reask: dict[str, float] = field(default_factory=dict)
    about: dict = field(default_factory=dict)

    DEFAULT_TOKENS = 8.0  # a short answer and its stop token, when nothing is fitted

    def to_dict(self) -> dict:
        return {"version": 1, "typical_tokens": self.typical_tokens, "factor": self.factor, "reask": self.reask,
                "about": self.about}

    @classmethod
    def load(cls, path: str | Path = COST_FIT_PATH) -> "CostFit":
        """The shipped fit (an empty one, every factor 1, when the file is absent)."""
        path = Path(path)
        if not path.is_file():
            return cls()
        d = json.loads(path.read_text(encoding="utf-8"))
        if d.get("version") != 1:
            raise ValueError(f"{path} is not a cost fit (version 1): make one with python -m rag_demo bench --fit-cost.")
        return cls(d["typical_tokens"], d["factor"], d.get("reask", {}), d.get("about", {}))


class Speed:
    """How much slower than at warm-up the generator runs now (1: as fast; 2: twice as slow).

    Every prefill and decoding step (`Timed`) is compared with what the cost model prices it at;
    the ratio's moving average, divided by its value at warm-up (`settle`), scales every estimate
    (RagPipeline.estimate), so a server whose CPU another job shares prices its questions at the
    speed it runs them. The ratio itself is not 1 when quiet (the model prices worst cases and
    kept prompt openings make real prefills cheaper): only its change since warm-up counts."""

    ALPHA = 0.05  # each call's weight: about the last twenty calls count
    # a factor stays in here, whatever one odd call measured: wide enough for a machine another job
    # slows eightfold (two processes each wanting every core), narrow enough that one stalled call
    # cannot price every later question out of the budget
    RANGE = (0.25, 20.0)

    def __init__(self) -> None:
        self.ratio: float | None = None  # moving average of observed / modelled seconds
        self.baseline: float | None = None  # its value at warm-up

    def observe(self, modelled: float, seconds: float) -> None:
        if modelled <= 0:
            return
        r = seconds / modelled
        self.ratio = r if self.ratio is None else self.ratio + self.ALPHA * (r - self.ratio)

    def settle(self) -> None:
        """Warm-up is over: the speed measured so far is the machine's own."""
        self.baseline = self.ratio

    @property
    def factor(self) -> float:
        if self.ratio is None or not self.baseline:
            return 1.0
        lo, hi = self.RANGE
        return min(max(self.ratio / self.baseline, lo), hi)


class Timed:
    """A generator whose prefills and decoding steps are timed into `speed` against `model`'s price
    of them; everything else is the wrapped generator's."""

    def __init__(self, gen, model: CostModel, speed: Speed) -> None:
        self._gen, self._model, self._speed = gen, model, speed

    def __getattr__(self, name):
        return getattr(self._gen, name)

    def _ran(self) -> int | None:
        """Positions the generator has run so far (None: it does not count them; it keeps nothing)."""
        return getattr(self._gen, "positions_run", None)

    def prefill(self, prompts, keep_prompt_logprobs: int = 0):
        # kept passages are not run: priced as run, a re-ask would look like a faster machine
        cached = getattr(self._gen, "cached_tokens", None)
        kept = cached(prompts, keep_prompt_logprobs) if cached is not None else 0
        before, t0 = self._ran(), time.perf_counter()
        out = self._gen.prefill(prompts, keep_prompt_logprobs=keep_prompt_logprobs)
        if before is None or self._ran() != before:  # read from kept hidden states: nothing ran to time
            tokens = len(prompts) * max(len(p) for p in prompts) - kept
            self._speed.observe(tokens * self._model.prefill_s_per_token, time.perf_counter() - t0)
        return out

    def advance(self, state, tokens):
        before, t0 = self._ran(), time.perf_counter()
        out = self._gen.advance(state, tokens)
        rows, length = tokens.shape
        # timed only when the model ran exactly these tokens: not a step read from kept states,
        # nor one that also ran the tokens skipped before it
        if before is None or self._ran() - before == rows * length:
            modelled = (self._model.step_s + rows * self._model.row_s if length == 1
                        else rows * length * self._model.score_s_per_token)
            self._speed.observe(modelled, time.perf_counter() - t0)
        return out

    def advance_many(self, items):
        """The generator's `advance_many`, timed as one model call over all of the items' rows."""
        before, t0 = self._ran(), time.perf_counter()
        out = self._gen.advance_many(items)
        rows = sum(int(item[1].shape[0]) for item in items)
        ran = sum(int(item[1].numel()) for item in items)
        # timed as a decoding step only when it was one: teacher-forced answers in it cost per token
        if (before is None or self._ran() - before == ran) and all(item[1].shape[1] == 1 for item in items):
            self._speed.observe(self._model.step_s + rows * self._model.row_s, time.perf_counter() - t0)
        return out
