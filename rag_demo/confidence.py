"""How likely an answer is right: the signals every answer carries, and the calibrated model that
turns them into one probability (docs/DESIGN.md §3b).

An answer's own numbers separate right from wrong better than any rule about retrieval: a
wrong answer of the small reader usually has a low log p(y|x), a rival candidate close behind,
or words no passage holds. `signals` reads them off an answer (an `Answer.to_dict()`-shaped
dict, so saved answers and live ones give the same numbers); `ConfidenceModel` is a logistic
regression over them, one per stack, preset and mode,

    P(right | answer) = sigmoid(b + Σ_j w_j · (x_j − mean_j) / scale_j)

fitted by `python -m rag_demo eval --fit-confidence` (measure/calibration.py) on the calibrate
split of the two labelled question files (assets/qa_open_vital.jsonl, assets/qa_train_vital.jsonl:
the command in assets/confidence.json), reported on their report split, and shipped as
assets/confidence.json with the command that made it. "Right" means a gold answer's words occur in
the answer (eval's `contains`). Below the model's `threshold` a card says the answer is probably
wrong, quoting what the cue did on the report split.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping

from rag_demo.config import CUT_STOPS
from rag_demo.reader.text import match_tokens, occurs_in

CONFIDENCE_PATH = Path(__file__).resolve().parents[1] / "assets" / "confidence.json"

# The signals of each mode, in the model's order. Closed-book reads no passages: only its own score.
BASE = ("logprob", "mean_logprob", "n_tokens", "ended", "empty", "echo")
RAG = BASE + ("margin", "single", "best_prior", "top_score", "max_posterior", "in_passage", "min_token_logprob")
FEATURES = {"sequence": RAG, "token": RAG, "closed-book": BASE}
# whether the passages hold what the answer adds to its question (`grounding`): RAG modes too, a
# candidate set of their own (measure/calibration.py FEATURE_SETS)
GROUNDING = ("new_words", "new_in_top", "new_in_passages")
NO_RIVAL = 20.0  # the margin an answer with no second candidate gets (nats): far ahead of any rival
FLOOR = -50.0  # log-probs below this are all "very unlikely": clipped so one outlier cannot dominate a fit


def signals(a: Mapping[str, Any]) -> dict[str, float]:
    """The numbers an answer's confidence is computed from, each a float:

    logprob        log p(y|x), clipped at FLOOR
    mean_logprob   log p(y|x) per generated token
    n_tokens       log(1 + tokens shown)
    ended          1 if the answer ended by itself (EOS or a stop token), 0 if a limit cut it
    empty          1 if it says nothing
    echo           the share of the answer's words that the question already says
    RAG modes only:
    margin         log p of the best candidate minus the second (NO_RIVAL when there is none)
    single         1 if no second candidate competed
    best_prior     max_z p(z|x): how sure retrieval was of one passage
    top_score      max_z q(x)·d(z): how well the best passage matches the question
    max_posterior  max_z of the answer's passage posterior: how much one passage carries it
    in_passage     1 if a passage (title and text) holds the answer's words as a run of tokens
    min_token_logprob  the weakest token: min_i log Σ_z p(z|x) p(y_i | x, z, y_<i) (the inspector's numbers)
    and GROUNDING (`grounding`).
    """
    n = len(a.get("token_ids") or [])
    text = (a.get("text") or "").strip().rstrip(".")
    lp = a.get("sequence_logprob")
    lp = FLOOR if lp is None or not math.isfinite(lp) else max(lp, FLOOR)
    words = match_tokens(text)
    asked = set(match_tokens(a.get("question") or ""))
    out = {"logprob": lp, "mean_logprob": max(lp / max(n, 1), FLOOR), "n_tokens": math.log1p(n),
           "ended": float(a.get("stopped", "eos") == "eos"), "empty": float(not text),
           "echo": sum(w in asked for w in words) / len(words) if words else 0.0}
    if a.get("mode") == "closed-book":
        return out
    docs = a.get("docs") or []
    cands = [c["logprob"] for c in a.get("candidates") or [] if c.get("logprob") is not None
             and math.isfinite(c["logprob"])]
    margin = cands[0] - cands[1] if len(cands) >= 2 else NO_RIVAL
    post = [p for p in a.get("doc_posterior") or [] if p is not None]
    out.update({
        "margin": min(max(margin, 0.0), NO_RIVAL), "single": float(len(cands) < 2),
        "best_prior": max((d["prior"] for d in docs), default=0.0),
        "top_score": max((d["score"] for d in docs), default=0.0),
        "max_posterior": max(post, default=0.0),
        "in_passage": in_passage(text, [(d["title"], d["text"]) for d in docs]),
        "min_token_logprob": _weakest_token(a.get("inspector") or [], [d["prior"] for d in docs]),
    })
    top = max(range(len(docs)), key=lambda i: docs[i]["prior"], default=None)  # the passage retrieval trusts most
    out.update(grounding(a.get("question") or "", text, [(d["title"], d["text"]) for d in docs], top))
    return out


def in_passage(answer: str, passages: list[tuple[str, str]]) -> float:
    """1.0 if a passage (title and text) holds the answer's words as a run of tokens, else 0.0."""
    return float(bool(answer) and any(occurs_in(answer, f"{title} {text}") for title, text in passages))


def grounding(question: str, answer: str, passages: list[tuple[str, str]], top: int | None = 0) -> dict[str, float]:
    """Whether the passages hold what the answer adds to the question. N = the answer's words that
    neither the question nor an English stop list holds (match_tokens' words):

    new_words        log(1 + |N|)
    new_in_top       |N ∩ words(passages[top])| / |N|  (title and text; 0 when N is empty)
    new_in_passages  |N ∩ ∪_z words(z)| / |N|

    An answer that only echoes its question has none; one copied from the top passage has them all
    there; one the generator made up has them nowhere (docs/results.md §8).

    >>> g = grounding("Who painted it?", "Vincent van Gogh painted it", [("Van Gogh", "Vincent painted."), ("Art", "")])
    >>> g["new_in_top"], g["new_in_passages"], round(g["new_words"], 3)  # vincent, van, gogh
    (1.0, 1.0, 1.386)
    """
    words = [set(match_tokens(f"{title} {text}")) for title, text in passages]
    new = set(match_tokens(answer)) - set(match_tokens(question)) - _stop_words()
    if not new:
        return {"new_words": 0.0, "new_in_top": 0.0, "new_in_passages": 0.0}
    seen = set().union(*words) if words else set()
    in_top = words[top] if top is not None and 0 <= top < len(words) else set()
    return {"new_words": math.log1p(len(new)), "new_in_top": len(new & in_top) / len(new),
            "new_in_passages": len(new & seen) / len(new)}


@lru_cache(maxsize=1)
def _stop_words() -> frozenset[str]:
    """NLTK's English stop list as bm25s ships it (its contractions split as match_tokens splits them)."""
    from bm25s.stopwords import STOPWORDS_EN_PLUS

    return frozenset(w for s in STOPWORDS_EN_PLUS for w in match_tokens(s))


def _weakest_token(inspector: list, prior: list[float]) -> float:
    """min over the answer's tokens of log Σ_z p(z|x) p(y_i | x, z, y_<i) (0 for no token)."""
    worst = 0.0
    for row in inspector:
        p = sum(w * q for w, q in zip(prior, row["p_token"]))
        worst = min(worst, math.log(p) if p > 0 else FLOOR)
    return max(worst, FLOOR)


@dataclass(frozen=True)
class Logistic:
    """One fitted logistic regression: its features, their standardisation, weights, bias and the
    cue's threshold (below it: "probably wrong")."""

    features: tuple[str, ...]
    mean: tuple[float, ...]
    scale: tuple[float, ...]
    coef: tuple[float, ...]
    intercept: float
    threshold: float

    def predict(self, x: Mapping[str, float]) -> float:
        """P(right) = sigmoid(b + Σ_j w_j (x_j − mean_j) / scale_j)."""
        z = self.intercept + sum(w * (x[f] - m) / s for f, m, s, w in zip(self.features, self.mean, self.scale,
                                                                            self.coef))
        return 1.0 / (1.0 + math.exp(-z)) if z > -700 else 0.0

    def to_dict(self) -> dict:
        return {"features": list(self.features), "mean": list(self.mean), "scale": list(self.scale),
                "coef": list(self.coef), "intercept": self.intercept, "threshold": self.threshold}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Logistic":
        return cls(tuple(d["features"]), tuple(d["mean"]), tuple(d["scale"]), tuple(d["coef"]), float(d["intercept"]),
                   float(d["threshold"]))


@dataclass(frozen=True)
class ConfidenceModel:
    """The shipped models by "stack|preset|mode", and what they were fitted on (`about`)."""

    models: dict[str, Logistic]
    about: dict

    @staticmethod
    def key(stack: str, preset: str, mode: str) -> str:
        return f"{stack}|{preset}|{mode}"

    def model_for(self, stack: str, preset: str, mode: str) -> Logistic | None:
        return self.models.get(self.key(stack, preset, mode))

    def quoted(self, stack: str, preset: str, mode: str) -> dict | None:
        """What a card says of its confidence: how many questions its own model (this preset and mode)
        was fitted on (calibrate split),
        and on how many others (report split) its cue's precision and recall, its AUROC and its
        largest reliability gap were measured (measure/calibration.py); None when not reported."""
        if self.model_for(stack, preset, mode) is None:
            return None
        got = next((r for r in self.about.get("report", []) if r["preset"] == preset and r["mode"] == mode), None)
        if got is None:
            return None
        fit = next((r for r in self.about.get("fitted", []) if r["preset"] == preset and r["mode"] == mode), None)
        return {"fitted_questions": fit["questions"] if fit else self.about.get("fitted_questions"),
                "questions": got["questions"],
                "precision": got["precision"], "recall": got["recall"], "auroc": got["auroc"],
                "max_gap": got.get("max_gap"), "features": list(self.model_for(stack, preset, mode).features)}

    def confidence(self, a: Mapping[str, Any], sig: Mapping[str, float] | None = None) -> float | None:
        """P(right) of an answer dict (None: no model for its stack, preset and mode)."""
        preset = (a.get("settings") or {}).get("preset", "")
        m = self.model_for(a.get("stack", ""), preset, a.get("mode", ""))
        return None if m is None else m.predict(sig if sig is not None else signals(a))

    def to_dict(self) -> dict:
        return {"version": 1, "about": self.about, "models": {k: m.to_dict() for k, m in self.models.items()}}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "ConfidenceModel":
        if d.get("version") != 1 or not isinstance(d.get("models"), dict):
            raise ValueError("this is not a confidence model file (version 1 with models): "
                             "make one with python -m rag_demo eval --fit-confidence.")
        return cls({k: Logistic.from_dict(v) for k, v in d["models"].items()}, dict(d.get("about") or {}))

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=1) + "\n", encoding="utf-8")
        return path


def outside_fit(about: Mapping[str, Any], k: int | None, retriever: str, corpus: str, measured_weights: bool) -> list[str]:
    """What of a request lies outside the settings a confidence model was fitted at (its `about`:
    K, the dense retriever, the built-in corpus its runs read, the measured weights), each said as
    "this answer's ... (fitted ...)"; [] when the fit covers the request. `retriever` is the
    answer's ("dense", or "bm25 ..." while the dense index is built), `corpus` "name (N passages)"."""
    out = []
    fit_k = about.get("k")
    if k is not None and fit_k is not None and int(k) != int(fit_k):
        out.append(f"K {k} (fitted at K {fit_k})")
    fit_retriever = about.get("retriever", "dense")
    if retriever and retriever.split()[0] != fit_retriever:
        out.append(f"the {retriever.split()[0]} retriever (fitted on {fit_retriever})")
    fit_corpus = about.get("corpus")
    if fit_corpus and corpus and corpus != fit_corpus:
        out.append(f"{corpus} (fitted on {fit_corpus})")
    if not measured_weights:
        out.append("other generator weights than those measured")
    return out


@lru_cache(maxsize=4)
def load_model(path: str | Path = CONFIDENCE_PATH) -> ConfidenceModel | None:
    """The shipped model (None when the file is absent: answers then carry no confidence)."""
    path = Path(path)
    if not path.is_file():
        return None
    return ConfidenceModel.from_dict(json.loads(path.read_text(encoding="utf-8")))


# Why an answer was cut short (Answer.stopped): its numbers describe a half-made answer, so such
# an answer is not rated, whatever cut it (max new tokens too).
CUT = CUT_STOPS


def judge(a: Mapping[str, Any], model: ConfidenceModel | None) -> tuple[dict[str, float], float | None, dict | None]:
    """(signals, confidence, the "probably wrong" cue or None) of an answer dict; a cut answer
    (stopped by the time limit, by Stop or by max new tokens: config.CUT_STOPS) gets no confidence
    and no cue."""
    sig = signals(a)
    if model is None or a.get("stopped") in CUT:
        return sig, None, None
    preset = (a.get("settings") or {}).get("preset", "")
    m = model.model_for(a.get("stack", ""), preset, a.get("mode", ""))
    if m is None:
        return sig, None, None
    p = m.predict(sig)
    cue = None
    if p < m.threshold:
        q = model.quoted(a.get("stack", ""), preset, a.get("mode", ""))
        measured = (f" On {q['questions']} questions the model was never fitted on, this cue caught "
                    f"{100 * q['recall']:.0f}% of the wrong answers, and {100 * q['precision']:.0f}% of the answers "
                    "it flagged were wrong." if q else "")
        cue = {"kind": "probably_wrong",
               "text": f"Probably wrong: its confidence, {100 * p:.0f}%, is below this cue's "
                       f"{100 * m.threshold:.0f}%.{measured} "
                       "Check it against the passages."}
    return sig, p, cue
