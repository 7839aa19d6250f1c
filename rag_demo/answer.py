"""What one answer is, as the CLI prints it and the page renders it (neither recomputes
anything): `Answer` and its passages (`RetrievedDoc`), the events a question's answers stream as,
and what is computed for the display from the engine's `Generation`: the candidates in order, the
token inspector, each passage's drop in log p(y|x), the caches kept, and the cues.
"""
from __future__ import annotations

import dataclasses
import unicodedata
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from rag_demo.rag.engine import Generation
from rag_demo.rag.marginalize import logprob_without_each, rag_sequence_logprob, rag_token_logprob
from rag_demo.reader.drafts import UPPER_BOUNDS
from rag_demo.reader.language import language_of


@dataclass(frozen=True)
class AnswerEvent:
    """One step of a question's answers: a mode's answer so far (`final` False: the dict of
    RagPipeline.partial_answer, after a decoding step) or its finished `Answer`."""

    mode: str
    final: bool
    answer: Any  # Answer when final, else a partial dict


Listen = Callable[[dict], None]  # gets each partial answer dict


@dataclass
class RetrievedDoc:
    rank: int  # 1-based
    id: str
    title: str
    text: str
    url: str | None
    score: float  # retrieval inner product q(x)·d(z)
    prior: float  # p(z|x) as every formula used it: the retriever's, with the generator's vote when that aid is on
    retriever_prior: float  # the retriever's own p(z|x) = softmax_z(scale · q(x)·d(z) / T) over the K
    # RagSettings.question_weight > 0 on a decoder-only generator: log p_G(question | passage),
    # the generator's own log-likelihood of the question's tokens after this passage
    question_logprob: float | None = None
    # RagSettings.passage_sentences > 0: the indices of the sentences (chunking.split_sentences) the
    # generator read; None: it read the whole passage
    read_sentences: list[int] | None = None


@dataclass
class Answer:
    question: str
    mode: str
    text: str
    tokens: list[str]  # the text each displayed token adds (special tokens left out)
    token_ids: list[int]
    docs: list[RetrievedDoc]
    token_doc_posteriors: list[list[float]]  # (T, K): row i is p(z | ...) for token i (docs/DESIGN.md §3.5)
    top_docs: list[int]  # (T,) 0-based index into docs of the passage token i leans on most (row argmax)
    doc_posterior: list[float] | None  # RAG-Sequence: p(z | x, y); RAG-Token: mean of the token rows shown
    sequence_logprob: float  # log p(y|x) under the mode's model, every generated token counted
    decoding: str
    timings: dict[str, float]  # seconds: encode, retrieve, generate, attribute, total
    stack: str
    corpus: str
    # RAG-Sequence, RAG-Token with token_drafts: [{"text", "logprob"}], "upper_bound": True where the number is one
    candidates: list[dict] = field(default_factory=list)
    stopped: str = "eos"  # why it ended: "eos", "max_new_tokens", "time_limit" (Budget), "cancelled"
    # what a stop (time limit, cancel) made this mode run instead of what its settings name, "" when
    # nothing: "fast_ranking" (thorough RAG-Sequence's rescoring skipped, the fast ranking stands),
    # "no_drafts" (RAG-Token's passage drafts not weighed, the mixture's own answer stands)
    fell_back: str = ""
    # RAG modes, the token inspector: per shown token i, {"p_token": [p(y_i | x, z, y_<i) for
    # each doc z], "top": per doc its top next tokens [[text, p], ...], "mix": RAG-Token's mixture's
    # [[text, p], ...] or None}; recorded by the engine (engine.Inspection), nothing recomputed
    inspector: list[dict] = field(default_factory=list)
    # RAG modes: per retrieved passage z, how much log p(y|x) of this answer drops when z is taken
    # away (p(z|x) renormalised over the rest; marginalize.logprob_without_each, no model pass);
    # None where nothing would be left (K = 1). The faithfulness check of the attributions.
    passage_drop: list[float | None] = field(default_factory=list)
    # the question as the generator read it (RagSettings.recase_question); "" when as typed
    read_question: str = ""
    # what ran: the preset ("paper" or "aided", and its title), every knob, the aids that were on,
    # the knobs changed from the preset (RagSettings.to_dict)
    settings: dict = field(default_factory=dict)
    # honest cues shown with the answer: [{"kind": "may_lack_answer" | "not_in_passages" | "not_english", "text"}]
    cues: list = field(default_factory=list)
    # which retriever chose the passages: "dense", or while the dense index is built in the
    # background "bm25 (dense index building: 40%)"; "" when the caller gave them (answer_from) or
    # none were read (closed-book)
    retriever: str = ""
    # the probability that this answer is right, from its own numbers (`signals`) and the model
    # calibrated on one split of the questions (rag_demo/confidence.py); None: no model for this
    # stack, preset and mode
    confidence: float | None = None
    signals: dict = field(default_factory=dict)
    # what the card says of its confidence model: questions fitted on (calibrate split), and on the
    # report split the cue's precision and recall (ConfidenceModel.quoted); None with no model
    confidence_model: dict | None = None
    # the seconds this mode was expected to take, priced before it ran from its own prompts and what
    # the generator kept then (models.cost.CostModel.expected; timings["total"] is what it took)
    expected_seconds: float | None = None
    # this mode's own share of the server's time limit (runs.Run.seconds; serving.admission.time_shares),
    # what "time limit reached" on a cut card refers to; None when no limit applied
    time_share_s: float | None = None
    # the passages the retriever ranked just after the K read (K+1 ..): [{"rank", "id", "title",
    # "text", "url", "score"}], what a larger K would have added; [] for closed-book and given passages
    near_misses: list = field(default_factory=list)
    # what the generator keeps for later questions, as this answer left it: {"passages": ...,
    # "hidden_states": ...}, each {"bytes", "max_bytes", "hits", "misses"} (hits and misses since
    # it loaded); {} for a generator that keeps nothing (BART)
    kept: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def kept_by(gen) -> dict:
    """Answer.kept: the generator's caches for later questions (`Generator.kept_caches`), as they stand."""
    return {name: {"bytes": st.bytes, "max_bytes": st.max_bytes, "hits": st.hits, "misses": st.misses}
            for name, st in ((name, cache.stats()) for name, cache in gen.kept_caches().items())}


def passage_drops(mode: str, g: Generation) -> list[float | None]:
    """Answer.passage_drop: log p(y|x) over all K docs minus log p(y|x) without each doc."""
    if g.doc_lp is None or g.prior is None or mode not in ("token", "sequence"):
        return []
    full = (rag_token_logprob if mode == "token" else rag_sequence_logprob)(g.doc_lp, g.prior)  # ()
    without = logprob_without_each(g.doc_lp, g.prior, mode)  # (K,)
    return [float(full - w) if torch.isfinite(w) else None for w in without]

def inspector_rows(gen, g: Generation, shown: list[int]) -> list[dict]:
    """Answer.inspector from the engine's Inspection and per-doc log-probs, shown tokens only."""
    ins = g.inspection
    if ins is None or g.doc_lp is None:
        return []
    pieces: dict[int, str] = {}

    def named(ids: torch.Tensor, lps: torch.Tensor) -> list[list]:
        return [[pieces.setdefault(i, gen.piece(i)), float(p)]
                for i, p in zip(ids.tolist(), lps.exp().tolist())]

    out = []
    for t in shown:
        out.append({
            "p_token": g.doc_lp[:, t].exp().tolist(),  # (K,)
            "top": [named(ins.doc_top_ids[z, t], ins.doc_top_lp[z, t]) for z in range(ins.doc_top_ids.shape[0])],
            "mix": named(ins.mix_top_ids[t], ins.mix_top_lp[t]) if ins.mix_top_ids is not None else None,
        })
    return out


def ranked_candidates(gen, g: Generation) -> list[dict]:
    """Answer.candidates: the candidates the engine weighed, best score first, one a text (two
    tokenizations of the same words, a passage's copy and its title, show once: the better); a
    RAG-Token candidate left behind by the ranking's branch and bound carries its upper bound.

    One score per answer wherever it is shown: the chosen answer's entry is its log p(y|x), the
    number on its card. Fast RAG-Sequence ranks by score_fast, a lower bound of that marginal
    (each candidate counted only under the passages whose search wrote it), so there every other
    candidate is marked `lower_bound`: its full log p(y|x) is at least that."""
    bounded = g.extras.get(UPPER_BOUNDS, ())
    fast = g.decoding.startswith("fast")
    chosen = gen.decode(g.tokens).strip()
    rows = sorted(((gen.decode(t), lp, i in bounded) for i, (t, lp) in enumerate(g.candidates)),
                  key=lambda r: -r[1])
    out, seen = [], set()
    for text, lp, bounded in rows:
        if text.strip() in seen:
            continue
        seen.add(text.strip())
        if text.strip() == chosen and g.logprob is not None:
            out.append({"text": text, "logprob": g.logprob, "chosen": True})
        else:
            out.append({"text": text, "logprob": lp, **({"upper_bound": True} if bounded else {}),
                        **({"lower_bound": True} if fast else {})})
    return out


def cues(question: str, mm: Any = None, scores: Any = None) -> list[dict]:
    """What a learner should be told beside an answer: that the question does not look English
    (the models read English only), and, for a RAG answer, that its passages may not hold the
    answer (the best retrieval score is below the retriever's calibrated `doubt_below`)."""
    out = []
    lang = language_of(question)
    if lang != "English":
        out.append({"kind": "not_english", "text": f"This question seems to be in {lang}: the models here read English only, "
                    "so the answer is likely a guess. Ask in English."})
    if mm is not None and mm.doubt_below is not None and len(scores):
        best = float(max(scores))
        if best < mm.doubt_below:
            out.append({"kind": "may_lack_answer", "text": f"Retrieval cue: the passages may not hold the answer. "
                        f"The best one matches the question at {best:.2f}, below {mm.doubt_below:.2f}, where the "
                        "retrieved passages mostly lacked the answer. The generator answers anyway."})
    return out


def words(text: str) -> list[str]:
    """A text's words as the passage check compares them: Unicode-normalised (NFKC), case folded,
    every punctuation mark or symbol (Unicode's, not only ASCII's) a word break; articles kept, so
    an answer of one article is a word too.

    >>> words("Australia’s  “Big” Reef…"), words("the…")
    (['australia', 's', 'big', 'reef'], ['the'])
    """
    text = unicodedata.normalize("NFKC", text).casefold()
    return "".join(" " if unicodedata.category(ch)[0] in "PSZ" else ch for ch in text).split()


def unread(text: str, docs: list, stopped: str = "eos") -> list[dict]:
    """The cue of a RAG answer none of whose passages holds its words (`words`, as one run): the
    generator wrote it from its weights, or rephrased; nothing for a cut or empty answer."""
    want = words(text)
    if not docs or not want or stopped in ("time_limit", "cancelled"):
        return []
    n = len(want)
    for d in docs:
        hay = words(f"{d.title} {d.text}")
        if any(hay[i: i + n] == want for i in range(len(hay) - n + 1)):
            return []
    return [{"kind": "not_in_passages", "text": "No passage contains these words: the generator wrote this answer "
             "from its own weights (or rephrased a passage). Check it against the passages below."}]
