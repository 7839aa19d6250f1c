"""The answer and retrieval metrics eval scores: exact match and F1 after SQuAD's normalisation,
"contains" (a gold answer inside the prediction), whether a passage holds an answer, recall@K.
"""

from __future__ import annotations

import logging
from collections import Counter

from rag_demo.questions import has_answer, passage_text  # noqa: F401 - where eval has always found them
from rag_demo.reader.text import normalize_answer

log = logging.getLogger(__name__)

# ---------------------------------------------------------------- metrics

def exact_match(prediction: str, golds: list[str]) -> float:
    """EM = max over gold answers g of [normalize(prediction) == normalize(g)], 1.0 or 0.0.

    >>> exact_match("The Seurat.", ["Georges Seurat", "Seurat"])
    1.0
    """
    p = normalize_answer(prediction)
    return float(any(p == normalize_answer(g) for g in golds))


def token_f1(pred_tokens: list[str], gold_tokens: list[str]) -> float:
    if not pred_tokens or not gold_tokens:
        return float(pred_tokens == gold_tokens)  # both empty: 1, one empty: 0 (SQuAD v2 rule)
    common = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred_tokens), common / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def f1_score(prediction: str, golds: list[str]) -> float:
    """F1 = max over gold answers g of 2PR/(P+R), where, on normalised whitespace tokens,
    common = |multiset(pred) ∩ multiset(g)|, P = common/|pred|, R = common/|g|.

    >>> round(f1_score("by Georges Seurat", ["Georges Seurat"]), 4)  # P=2/3, R=1
    0.8
    """
    p = normalize_answer(prediction).split()
    return max(token_f1(p, normalize_answer(g).split()) for g in golds)


def contains_answer(prediction: str, golds: list[str]) -> float:
    """A lenient accuracy for chatty generators: 1.0 if has_answer(prediction, golds), else 0.0.

    >>> contains_answer("It was painted by Georges Seurat.", ["Seurat"])
    1.0
    """
    return float(has_answer(prediction, golds))


def first_hit(passage_texts: list[str], golds: list[str]) -> int | None:
    """1-based rank of the first passage that has an answer, or None."""
    return next((r for r, t in enumerate(passage_texts, 1) if has_answer(t, golds)), None)


def recall_at_k(hit_ranks: list[int | None], k: int) -> float:
    """recall@k = (1/N) * #{questions whose first answer-bearing passage has rank <= k}.

    hit_ranks: per question, `first_hit` over its ranked passages (None = no hit).
    >>> recall_at_k([1, 3, None, 7], 5)  # 2 of 4 questions have a hit in their top 5
    0.5
    """
    if not hit_ranks:
        raise ValueError("recall@k of zero questions is undefined: evaluate at least one question.")
    return sum(r is not None and r <= k for r in hit_ranks) / len(hit_ranks)


def precision_recall(flagged, target) -> tuple[float, float]:
    """A cue's (precision, recall) against what it should find: P(target | flagged) and
    P(flagged | target), from one flag and one truth per answer (booleans); NaN where there is
    nothing to take a share of.

    >>> precision_recall([True, True, False, False], [True, False, True, False])
    (0.5, 0.5)
    """
    pairs = [(bool(f), bool(t)) for f, t in zip(flagged, target, strict=True)]
    hits = sum(f and t for f, t in pairs)
    n_flagged, n_target = sum(f for f, _ in pairs), sum(t for _, t in pairs)
    return (hits / n_flagged if n_flagged else float("nan"), hits / n_target if n_target else float("nan"))


RELIABILITY_BINS = 4  # ~25-30 answers a bin on a split of ~110 questions: the binomial noise of a bin's accuracy is ~0.09


def reliability_bins(confidence, right, bins: int = RELIABILITY_BINS) -> list[dict]:
    """Answers sorted by confidence and cut into `bins` groups of (nearly) equal count; per group
    its answers, mean confidence and share right (a calibrated confidence has the two equal), and
    the confidence range it spans. Equal counts, not equal widths: a width-0.1 bin holding three
    answers says nothing.

    >>> [(b["n"], b["confidence"], b["right"]) for b in reliability_bins([.1, .2, .8, .9], [0, 1, 1, 1], bins=2)]
    [(2, 0.15, 0.5), (2, 0.85, 1.0)]
    """
    # by confidence alone (stable): sorting ties by right would put the wrong ones first and fake a slope
    pairs = sorted(zip((float(c) for c in confidence), (float(r) for r in right)), key=lambda pair: pair[0])
    if not isinstance(bins, int) or isinstance(bins, bool) or bins < 1:
        raise ValueError(f"bins={bins!r} is not a bin count: pass a positive integer.")
    n, out = len(pairs), []
    for i in range(min(bins, n)):
        part = pairs[i * n // min(bins, n): (i + 1) * n // min(bins, n)]
        out.append({"n": len(part), "from": part[0][0], "to": part[-1][0],
                    "confidence": round(sum(c for c, _ in part) / len(part), 4),
                    "right": round(sum(r for _, r in part) / len(part), 4)})
    return out


def runs_on(answer: str) -> bool:
    """Whether a short answer goes on past a complete sentence: a word ends with a sentence's full
    stop and more words follow ("1948. Universal Declaration of Human Rights."). A period after an
    initial ("J. K. Rowling"), inside an abbreviation ("U.S. dollar", "D.C.") or after a listed
    abbreviation ("St. Louis") ends nothing.

    >>> runs_on("1948."), runs_on("1948. Universal Declaration of Human Rights."), runs_on("J. K. Rowling.")
    (False, True, False)
    >>> runs_on("St. Louis, Missouri."), runs_on("Washington, D.C. is the capital."), runs_on("68.5 million.")
    (False, False, False)
    """
    from rag_demo.models.abbreviations import ABBREVIATIONS

    words = answer.split()
    for w in words[:-1]:
        if not w.endswith("."):
            continue
        stem = w.rstrip(".")
        if (len(stem) == 1 and stem.isalpha()) or "." in stem or stem in ABBREVIATIONS:
            continue
        return True
    return False
