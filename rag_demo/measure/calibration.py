"""Fitting the answer cards' confidence: `python -m rag_demo eval --fit-confidence RUN [RUN ...]`.

Reads sweep runs (measure/sweep.py: tidy rows, each answer with its `signals`) and fits one model
per (preset, mode) on the answers at the default K with dense retrieval, by the one split rule
(rag_demo/splits.py): fitted on the "calibrate" questions, reported on the "report" questions,
never fitted on "train" (what training read; its answers may help choose the signals, below) nor on
any other. The model file the app loads (assets/confidence.json, rag_demo/confidence.py) records
what it was fitted on and the report numbers each card quotes; the report answers, each with its
confidence, are written as tidy rows (`--heldout-out`) for the Results tab's reliability diagram.

Which signals: a logistic regression over one of FEATURE_SETS, the one whose cue meets the bar
(recall ≥ 0.5, at most RIGHT_FLAGGED of the right answers flagged, precision ≥ PRECISION) on the
most random halves of the answerable questions it was not fitted on (`choose_on_halves`): calibrate's,
joined by train's where a preset's weights never read them (`--choose-on`); with too few of them,
the one whose cue catches the most wrong answers on the mix (`choose_features`). The RAG modes'
candidates include the GROUNDING signals (whether the passages hold what the answer adds to its
question), which runs made before them lack: `with_grounding` adds them from the same passages
retrieved again. A logistic regression's output is its own calibration (Platt's); the report split
checks it, with reliability bins of equal count.

"Right" is `contains`: a gold answer's words occur in the answer. Each preset and mode is fitted
on a calibrate mix whose share of answerable questions is the report split's (`mix_weights`: the
answerable answers weighted up or down; the labels say which questions are answerable, no answer
of report is read). The cue's threshold is chosen on the same mix, on cross-validated confidences
(each answer's from a fit that did not see it): the one that flags the most wrong answers while
flagging at most RIGHT_FLAGGED of the right ones, with its precision at least PRECISION
(`cue_threshold`, `choose_threshold`); or, where the held-out halves chose it with the signals,
on the answerable answers of calibrate and train alone, with a tighter bound (PLACEMENTS, `fit_one`).
"""
from __future__ import annotations

import datetime
import json
from pathlib import Path

import numpy as np
import pandas as pd

from rag_demo.confidence import FEATURES, GROUNDING, ConfidenceModel, Logistic, grounding, in_passage
from rag_demo.measure.metrics import precision_recall, reliability_bins
from rag_demo.measure.run_rows import load_meta, load_rows, with_answerable
from rag_demo.splits import split_of

PRECISION = 0.8  # the cue's least precision on the calibrate mix (flagged answers that are wrong)
# the most of the right calibrate answers the cue may flag; within it the cue flags as many wrong
# answers as it can (docs/results.md §8)
RIGHT_FLAGGED = 0.2
C = 1.0  # inverse L2 strength: the features are standardised
FOLDS = 5
# the cue's bar on answerable questions, which a signal set is chosen by (`choose_on_halves`)
BAR = {"recall": 0.5, "right_flagged": RIGHT_FLAGGED, "precision": PRECISION}
HALVES = 30  # random halves of the answerable questions a candidate set is read on
# fewer answerable questions than this: the set is chosen on the mix (`choose_features`); halves of
# calibrate's fifty-odd overstated what a set would do (docs/results.md §8, calibrate enlarged)
MIN_ANSWERABLE = 100
# where the cue's threshold may be placed (`fit_one`), chosen with the signals on held-out halves:
# on the mix, or on the answerable answers alone with a bound on the right ones flagged
PLACEMENTS = (("mix", RIGHT_FLAGGED), ("answerable", 0.2), ("answerable", 0.15), ("answerable", 0.1))
TRAINED_ON_TRAIN = ("trained",)  # presets whose weights read the train split: its answers are not new to them
# the candidate signal sets per mode, simplest first; a set some answer lacks a signal of is not a candidate
FEATURE_SETS = {
    "closed-book": (("logprob",), ("logprob", "mean_logprob", "n_tokens"), FEATURES["closed-book"]),
    "sequence": (("logprob",), ("logprob", "mean_logprob", "in_passage", "margin"), FEATURES["sequence"],
                 ("logprob",) + GROUNDING),
    "token": (("logprob",), ("logprob", "mean_logprob", "in_passage", "margin"), FEATURES["token"],
              ("logprob",) + GROUNDING),
}


def answers_at(rows: pd.DataFrame, k: int = 5, retriever: str = "dense") -> pd.DataFrame:
    """The answers a card shows by default: RAG modes at K = k with `retriever`, and closed-book."""
    rag = rows["mode"].isin(["sequence", "token"]) & (rows["k"] == k) & (rows["retriever"] == retriever)
    closed = rows["mode"] == "closed-book"
    return rows[(rag | closed) & rows["signals"].notna()]


def _matrix(rows: pd.DataFrame, features: tuple[str, ...]) -> np.ndarray:
    return np.array([[float(sig[f]) for f in features] for sig in rows["signals"]], dtype=np.float64)


def _logistic(x: np.ndarray, y: np.ndarray, features: tuple[str, ...], w: np.ndarray | None = None) -> Logistic:
    from sklearn.linear_model import LogisticRegression

    mean, scale = x.mean(0), x.std(0)
    scale[scale == 0] = 1.0
    reg = LogisticRegression(C=C, max_iter=1000).fit((x - mean) / scale, y, sample_weight=w)
    return Logistic(features, tuple(mean), tuple(scale), tuple(reg.coef_[0]), float(reg.intercept_[0]), 0.5)


def mix_weights(answerable: np.ndarray, share: float | None) -> np.ndarray:
    """Per answer, the weight that makes the answerable questions `share` of the mix:
    w = share / a for an answerable one, (1 − share) / (1 − a) for the others (a: their share here);
    all 1 when `share` is None or the answers are all one kind (then no mix can match)."""
    answerable = np.asarray(answerable, dtype=bool)
    a = float(answerable.mean()) if len(answerable) else 0.0
    if share is None or a in (0.0, 1.0):
        return np.ones(len(answerable))
    return np.where(answerable, share / a, (1 - share) / (1 - a))


def cross_validated(x: np.ndarray, y: np.ndarray, features: tuple[str, ...], w: np.ndarray,
                    strata: np.ndarray | None = None, folds: int = FOLDS) -> np.ndarray:
    """Each answer's P(right) from a fit on the other folds (stratified by `strata`, default y)."""
    from sklearn.model_selection import StratifiedKFold

    strata = y if strata is None else strata
    folds = max(2, min(folds, int(np.unique(strata, return_counts=True)[1].min())))
    p = np.zeros(len(y))
    for fit, test in StratifiedKFold(folds, shuffle=True, random_state=0).split(x, strata):
        m = _logistic(x[fit], y[fit], features, w[fit])
        p[test] = [m.predict(dict(zip(features, r))) for r in x[test]]
    return p


def cv_logloss(x: np.ndarray, y: np.ndarray, features: tuple[str, ...], folds: int = FOLDS,
               w: np.ndarray | None = None) -> tuple[float, float]:
    """(mean, standard error) over `folds` stratified folds of the held-out (weighted) log-loss."""
    from sklearn.model_selection import StratifiedKFold

    w = np.ones(len(y)) if w is None else w
    losses = []
    for fit, test in StratifiedKFold(folds, shuffle=True, random_state=0).split(x, y):
        m = _logistic(x[fit], y[fit], features, w[fit])
        p = np.clip([m.predict(dict(zip(features, r))) for r in x[test]], 1e-6, 1 - 1e-6)
        loss = -(y[test] * np.log(p) + (1 - y[test]) * np.log(1 - p))
        losses.append(float(np.average(loss, weights=w[test])))
    return float(np.mean(losses)), float(np.std(losses) / np.sqrt(len(losses)))


def _cue_at_bound(p: np.ndarray, y: np.ndarray, w: np.ndarray, a: np.ndarray) -> tuple[float, dict]:
    """(the cue's threshold, its recall, right flagged and precision on the answerable answers and,
    weighted, on the mix)."""
    t = cue_threshold(p, y, w)
    a = np.asarray(a, dtype=bool)
    return t, {"answerable": weighted_cue(p[a] < t, y[a], np.ones(int(a.sum()))), "mix": weighted_cue(p < t, y, w)}


def weighted_cue(flagged: np.ndarray, right: np.ndarray, w: np.ndarray) -> dict:
    """The cue's recall (wrong answers flagged), share of right answers flagged and precision,
    each answer counted with its mix weight."""
    wrong = np.asarray(right) == 0
    flagged = np.asarray(flagged, dtype=bool)
    tw, fw = w[wrong].sum(), w[flagged].sum()
    return {"recall": round(float(w[flagged & wrong].sum() / tw), 3) if tw else float("nan"),
            "right_flagged": round(float(w[flagged & ~wrong].sum() / w[~wrong].sum()), 3) if (~wrong).any() else float("nan"),
            "precision": round(float(w[flagged & wrong].sum() / fw), 3) if fw else float("nan")}


def choose_features(rows: pd.DataFrame, mode: str, share: float | None = None) -> tuple[tuple[str, ...], list[dict]]:
    """The candidate of FEATURE_SETS[mode] whose cue, on cross-validated confidences over the mix
    (`mix_weights`), catches the most wrong answers within the bounds (`choose_threshold`); the
    simplest on a tie. -> (its features, every candidate's numbers for the model file)."""
    y = (rows["contains"].to_numpy() > 0).astype(int)
    a = _answerable(rows)
    w = mix_weights(a, share)
    scores = []
    for features in candidates(rows, mode):
        x = _matrix(rows, features)
        mean, se = cv_logloss(x, y, features, w=w)
        _, cue = _cue_at_bound(cross_validated(x, y, features, w, 2 * y + a), y, w, a)
        scores.append({"features": list(features), "cv_logloss": round(mean, 4), "se": round(se, 4),
                       "cv_cue": cue})
    best = max(scores, key=lambda s: (np.nan_to_num(s["cv_cue"]["mix"]["recall"]), -len(s["features"])))
    return tuple(best["features"]), scores


def held_out_halves(rows: pd.DataFrame, mode: str, features: tuple[str, ...], share: float | None,
                    reps: int = HALVES, seed: int = 0, fit=None,
                    placement: tuple[str, float] = PLACEMENTS[0]) -> list[dict]:
    """The cue on answerable questions it was not fitted on: for `reps` random halves of the
    answerable questions in `rows` (one preset and mode), the model and threshold fitted as shipped
    (`fit_one` with `placement`) on every unanswerable answer and the other half, read on this half
    (`weighted_cue`, unweighted). `fit(rows) -> Logistic` replaces that fit (experiments)."""
    fit = fit or (lambda part: fit_one(part, mode, features=features, share=share, placement=placement))
    rng = np.random.default_rng(seed)
    answerable = _answerable(rows).astype(bool)
    ans, other = rows[answerable], rows[~answerable]
    questions = ans["question_id"].unique()
    out = []
    for _ in range(reps):
        held = ans["question_id"].isin(set(rng.choice(questions, len(questions) // 2, replace=False)))
        test = ans[held]
        y = (test["contains"].to_numpy() > 0).astype(int)
        try:
            m = fit(pd.concat([other, ans[~held]]))
        except ValueError:  # this half left the fit one kind of answer: the cue cannot be placed
            out.append({"recall": float("nan"), "right_flagged": float("nan"), "precision": float("nan")})
            continue
        p = np.array([m.predict(sig) for sig in test["signals"]])
        out.append(weighted_cue(p < m.threshold, y, np.ones(len(y))))
    return out


def bar_held(halves: list[dict]) -> float:
    """The share of held-out halves on which the cue meets the whole BAR (a half it could not be
    read on fails it)."""
    ok = [h["recall"] >= BAR["recall"] and h["right_flagged"] <= BAR["right_flagged"]
          and h["precision"] >= BAR["precision"] for h in halves]  # NaN compares False
    return float(np.mean(ok)) if ok else 0.0


def choose_on_halves(rows: pd.DataFrame, mode: str, share: float | None = None,
                     reps: int | None = None) -> tuple[tuple[str, ...], tuple[str, float], list[dict]]:
    """The candidate set and threshold placement (PLACEMENTS) whose cue meets the bar on the most
    held-out halves of the answerable questions (`held_out_halves`, `bar_held`): on a tie the
    simplest set, then the first placement; where none meets it on any half, the highest median
    recall (the closest to it) first. The bar is judged on questions a visitor asks, which the mix
    (mostly unanswerable ones) hides: there the candidate that catches the most wrong answers is
    often one that misses them on answerable questions (docs/results.md §8).
    -> (its features, its placement, every candidate's numbers)."""
    scores, reps = [], HALVES if reps is None else reps
    for features in candidates(rows, mode):
        for i, placement in enumerate(PLACEMENTS):
            halves = held_out_halves(rows, mode, features, share, reps, placement=placement)
            recall = float(np.nanmedian([h["recall"] for h in halves])) if halves else float("nan")
            scores.append({"features": list(features), "placement": list(placement), "halves": len(halves),
                           "bar_held": round(bar_held(halves), 3), "median_recall": round(recall, 3), "order": i})
    none_holds = all(s["bar_held"] == 0 for s in scores)
    best = max(scores, key=lambda s: (s["bar_held"], np.nan_to_num(s["median_recall"]) if none_holds else 0.0,
                                      -len(s["features"]), -s["order"]))
    return tuple(best["features"]), tuple(best["placement"]), scores


def candidates(rows: pd.DataFrame, mode: str) -> tuple[tuple[str, ...], ...]:
    """The sets of FEATURE_SETS[mode] whose every signal every answer carries (runs made before a
    signal existed lack it until `with_grounding` adds it)."""
    have = set.intersection(*(set(sig) for sig in rows["signals"])) if len(rows) else set()
    return tuple(f for f in FEATURE_SETS[mode] if set(f) <= have)


def with_grounding(rows: pd.DataFrame, question_of, passages_of) -> pd.DataFrame:
    """The RAG answers' signals with GROUNDING added where missing (`confidence.grounding`), from
    question_of(question_id) -> its text and passages_of(question, k) -> [(title, text)] the k
    passages the answer read, top first: the dense retrieval again, which is deterministic. A run's
    own `in_passage` signal is recomputed from the same passages as a check that they are the run's:
    a ValueError names how many differ when more than one in a hundred do (another index)."""
    out, differ, checked, got = [], 0, 0, {}
    for sig, mode, qid, answer, k in zip(rows["signals"], rows["mode"], rows["question_id"], rows["answer"],
                                         rows.get("k", pd.Series([None] * len(rows), index=rows.index))):
        if mode == "closed-book" or set(GROUNDING) <= set(sig):
            out.append(sig)
            continue
        question = question_of(str(qid))
        if (question, k) not in got:
            got[question, k] = passages_of(question, int(k))
        passages = got[question, k]
        text = (answer if isinstance(answer, str) else "").strip().rstrip(".")
        checked += 1
        differ += in_passage(text, passages) != sig["in_passage"]
        out.append({**sig, **grounding(question, text, passages)})
    if checked and differ > 0.01 * checked:
        raise ValueError(f"{differ} of {checked} answers' in_passage differs when their passages are retrieved "
                         "again: the runs read another index; fit with the index they were made on.")
    return rows.assign(signals=out)


def passages_again(runs: list[str]) -> dict:
    """`fit`'s question_of and passages_of for `with_grounding`: the questions from the QA files the
    runs' meta files name (those that exist), the passages from the default pipeline's dense
    retrieval (loaded on first use: runs that carry every signal load nothing)."""
    from rag_demo.questions import load_qa

    def qa_files(meta: dict) -> list[str]:
        return [meta["qa"]] * bool(meta.get("qa")) + [f for m in meta.get("runs") or [] for f in qa_files(m)]

    # a part run may name a temporary copy of its QA file's questions: the files at hand serve
    files = list(dict.fromkeys(f for run in runs for f in qa_files(load_meta(run)) if Path(f).is_file()))
    questions: dict[str, str] = {}
    pipe: list = []

    def question_of(qid: str) -> str:
        if not questions:
            questions.update({str(item.meta.get("id")): item.question for f in files for item in load_qa(f)})
        if qid not in questions:
            raise ValueError(f"question {qid!r} is in none of the QA files the runs' meta files name ({files}): "
                             "rerun the sweep, or fit on runs that carry every signal.")
        return questions[qid]

    def passages_of(question: str, k: int) -> list[tuple[str, str]]:
        if not pipe:
            from rag_demo.pipeline import RagPipeline

            pipe.append(RagPipeline.load())
        return [(z.title, z.text) for z in pipe[0].retrieve(question, "token", k=k).passages]

    return {"question_of": question_of, "passages_of": passages_of}


def _answerable(rows: pd.DataFrame) -> np.ndarray:
    if "answerable" not in rows:
        return np.zeros(len(rows), dtype=int)
    return rows["answerable"].fillna(False).to_numpy().astype(int)


def fit_one(rows: pd.DataFrame, mode: str, precision: float = PRECISION,
            features: tuple[str, ...] | None = None, share: float | None = None,
            placement: tuple[str, float] = PLACEMENTS[0], extra: pd.DataFrame | None = None) -> Logistic:
    """A standardised L2 logistic regression of right (contains) on `features` (default: the mode's
    chosen ones, `choose_features`), weighted to the mix (`mix_weights`), and the cue's threshold.
    `placement` ("mix", b): on cross-validated confidences of the same mix (`cue_threshold`);
    ("answerable", b): on the answerable answers alone, the rows' cross-validated confidences and
    the model's of `extra`'s answerable answers (answers it never saw: train's), at most b of their
    right ones flagged at precision ≥ `precision` (`choose_threshold`)."""
    features = choose_features(rows, mode, share)[0] if features is None else tuple(features)
    x, y = _matrix(rows, features), (rows["contains"].to_numpy() > 0).astype(int)
    if len(set(y)) < 2:
        raise ValueError(f"the {mode} answers to fit on are all {'right' if y.all() else 'wrong'}: add questions.")
    a = _answerable(rows)
    w = mix_weights(a, share)
    model = _logistic(x, y, features, w)
    p = cross_validated(x, y, features, w, 2 * y + a)
    where, bound = placement
    if where == "mix":
        threshold = choose_threshold(p, y, precision, bound, w)
    else:
        keep = a.astype(bool)
        p, y = p[keep], y[keep]
        if extra is not None and len(extra):
            more = extra[_answerable(extra).astype(bool)]
            p = np.concatenate([p, [model.predict(sig) for sig in more["signals"]]])
            y = np.concatenate([y, (more["contains"].to_numpy() > 0).astype(int)])
        threshold = choose_threshold(p, y, precision, bound)
    return Logistic(*[getattr(model, f) for f in ("features", "mean", "scale", "coef", "intercept")],
                    threshold=threshold)


def cue_threshold(p: np.ndarray, y: np.ndarray, w: np.ndarray, precision: float = PRECISION) -> float:
    """The cue's threshold on the weighted mix (`mix_weights`): the most wrong answers flagged with
    at most RIGHT_FLAGGED of the right ones and precision at least `precision` (`choose_threshold`).
    `fit_one` may place it on the answerable answers instead, where held-out halves chose that."""
    return choose_threshold(p, y, precision, RIGHT_FLAGGED, w)


def choose_threshold(p: np.ndarray, right: np.ndarray, precision: float, right_flagged: float = RIGHT_FLAGGED,
                     w: np.ndarray | None = None) -> float:
    """The largest t such that the answers with confidence below t are wrong at least `precision`
    of the time and hold at most `right_flagged` of the right answers, each answer counted with its
    weight `w` (default 1): the most recall the two bounds allow; 0 (never flags) when no t meets both.

    >>> p, right = np.array([.1, .2, .3, .4, .9]), np.array([0, 0, 1, 0, 1])
    >>> choose_threshold(p, right, 0.9, 0.5), choose_threshold(p, right, 0.6, 0.5)  # two lowest; four: 3 of 4 wrong
    (0.25, 0.65)
    >>> choose_threshold(p, right, 0.6, 0.2)  # flagging .3 would flag half the right answers
    0.25
    """
    w = np.ones(len(p)) if w is None else np.asarray(w, dtype=float)
    order = np.argsort(p)
    best, wrong, flagged, w_right = 0.0, 0.0, 0.0, float(w[right == 1].sum())
    for n, i in enumerate(order, start=1):
        flagged += w[i]
        wrong += w[i] * (right[i] == 0)
        nxt = p[order[n]] if n < len(order) else 1.0
        flagged_right = (flagged - wrong) / w_right if w_right else 0.0
        if wrong / flagged >= precision - 1e-12 and flagged_right <= right_flagged + 1e-12 and nxt > p[i]:
            best = float((p[i] + nxt) / 2) if n < len(order) else 1.0
    return best


def auroc(p: np.ndarray, right: np.ndarray) -> float:
    """P(a right answer scores above a wrong one), ties counted half."""
    pos, neg = p[right == 1], p[right == 0]
    if not len(pos) or not len(neg):
        return float("nan")
    wins = sum(float((q > neg).sum()) + 0.5 * float((q == neg).sum()) for q in pos)
    return wins / (len(pos) * len(neg))


def quality(confidence, right, flagged) -> dict:
    """How honest a confidence is over some answers: how many and how many wrong, its AUROC and
    Brier score, the "probably wrong" cue's flags, precision (flagged answers that are wrong),
    recall (wrong answers flagged) and the share of right answers it flags, and the reliability bins
    (equal count, metrics.reliability_bins) with their largest gap |mean confidence − share right|.
    The one computation behind the fit's report and `eval`'s."""
    p = np.asarray(list(confidence), dtype=float)
    right = np.asarray([int(bool(r)) for r in right])
    flagged = np.asarray([bool(f) for f in flagged])
    wrong = right == 0
    precision, recall = precision_recall(flagged, wrong)
    bins = reliability_bins(p, right) if len(p) else []
    n_right = int((~wrong).sum())
    return {"answers": int(len(p)), "wrong": int(wrong.sum()), "auroc": round(auroc(p, right), 3),
            "right_flagged": round(float((flagged & ~wrong).sum()) / n_right, 3) if n_right else float("nan"),
            "brier": round(float(((p - right) ** 2).mean()), 3) if len(p) else float("nan"),
            "flagged": int(flagged.sum()), "precision": round(precision, 3), "recall": round(recall, 3),
            "bins": bins, "max_gap": round(max((abs(b["confidence"] - b["right"]) for b in bins), default=float("nan")), 3)}


def report(rows: pd.DataFrame, model: ConfidenceModel, stack: str) -> list[dict]:
    """`quality` per preset and mode of the model's confidence over these answers, with the threshold."""
    out = []
    for (preset, mode), part in rows.groupby(["preset", "mode"]):
        m = model.model_for(stack, preset, mode)
        if m is None:
            continue
        p = np.array([m.predict(sig) for sig in part["signals"]])
        out.append({"preset": preset, "mode": mode, "questions": int(part["question_id"].nunique()),
                    **quality(p, part["contains"].to_numpy() > 0, p < m.threshold), "threshold": round(m.threshold, 3)})
    return out


def format_confidence(rows: list[dict]) -> str:
    """`quality` rows (each with its "preset" and "mode", or a "label") as a Markdown table: the cue's
    precision and recall, AUROC, Brier, and each reliability bin as answers: mean confidence / right."""
    if not rows:
        return "(no answer carries a confidence)"
    width = max(len(r["bins"]) for r in rows)
    sets = any("set" in r for r in rows)  # rows of several question sets: a first column names each
    lines = [("| questions " if sets else "") + "| preset | mode | answers | wrong | flagged | precision | recall "
             "| right flagged | AUROC | Brier | " + " | ".join(f"bin {i + 1}" for i in range(width)) + " | largest gap |",
             ("|---" if sets else "") + "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|" + "---|" * width + "---:|"]
    for r in rows:
        cells = [f"{b['n']}: {100 * b['confidence']:.0f}% / {100 * b['right']:.0f}%" for b in r["bins"]]
        cells += ["-"] * (width - len(cells))
        lines.append((f"| {r.get('set', '')} " if sets else "")
                     + f"| {r.get('preset', r.get('label', ''))} | {r.get('mode', '')} | {r['answers']} | {r['wrong']} "
                     f"| {r['flagged']} | {r['precision']:.2f} | {r['recall']:.2f} | {r.get('right_flagged', float('nan')):.2f} "
                     f"| {r['auroc']:.2f} | {r['brier']:.3f} "
                     f"| {' | '.join(cells)} | {r['max_gap']:.2f} |")
    return "\n".join(lines)


def fit(runs: list[str], out: str, heldout_out: str | None, command: str, stack: str = "offline", k: int = 5,
        question_of=None, passages_of=None, choose_on: list[str] | None = None) -> dict:
    """Fit on the runs' calibrate answers, report on their report answers, save (see the module
    docstring); -> the model file's `about`. With question_of and passages_of, answers made before
    the GROUNDING signals get them (`with_grounding`). The signals of each preset and mode are
    chosen on held-out halves of its answerable calibrate questions, joined by the train answers of
    the `choose_on` runs (never a preset's whose weights read train: TRAINED_ON_TRAIN), where there
    are MIN_ANSWERABLE of them (`choose_on_halves`), else on the mix (`choose_features`)."""
    frames = [answers_at(load_rows(path), k) for path in runs]
    if not frames:
        raise ValueError("no runs given: pass sweep runs with --fit-confidence RUN [RUN ...].")
    rows = pd.concat(frames, ignore_index=True)
    extra = pd.concat([answers_at(load_rows(path), k) for path in choose_on or []] or [rows.iloc[:0]],
                      ignore_index=True)
    extra = extra.assign(split=extra["question_id"].map(lambda q: split_of(str(q))))
    extra = extra[(extra["split"] == "train") & ~extra["preset"].isin(TRAINED_ON_TRAIN)]
    if question_of is not None and passages_of is not None:
        rows = with_grounding(rows, question_of, passages_of)
        extra = with_grounding(extra, question_of, passages_of)
    rows = rows.assign(split=rows["question_id"].map(lambda q: split_of(str(q))))
    calibrate, test = rows[rows["split"] == "calibrate"], rows[rows["split"] == "report"]
    if calibrate.empty or test.empty:
        raise ValueError(f"the runs hold {len(calibrate)} calibrate and {len(test)} report answers at K = {k}: run "
                         "the sweep with --split calibrate,report (rag_demo/splits.py) first.")
    calibrate = with_answerable(calibrate)
    # report's share of answerable questions: the labels of its questions, none of its answers
    labels = with_answerable(test.drop_duplicates("question_id"))
    share = float(labels["answerable"].mean())
    extra = with_answerable(extra) if len(extra) else extra.assign(answerable=False)
    models, chosen, mixes, choice = {}, {}, {}, {}
    for (preset, mode), part in calibrate.groupby(["preset", "mode"]):
        pool = pd.concat([part, extra[(extra["preset"] == preset) & (extra["mode"] == mode)]], ignore_index=True)
        n_answerable = int(pool.loc[_answerable(pool).astype(bool), "question_id"].nunique())
        placement = PLACEMENTS[0]
        if n_answerable >= MIN_ANSWERABLE:
            features, placement, scores = choose_on_halves(pool, mode, share)
        else:
            features, scores = choose_features(part, mode, share)
        key = ConfidenceModel.key(stack, preset, mode)
        models[key] = fit_one(part, mode, features=features, share=share, placement=placement,
                              extra=pool.iloc[len(part):])
        chosen[key] = scores
        choice[key] = {"rule": "held-out halves" if n_answerable >= MIN_ANSWERABLE else "the mix",
                       "threshold_on": "the mix" if placement[0] == "mix" else
                       f"answerable answers of calibrate and train, at most {placement[1]:g} of the right flagged",
                       "answerable_questions": n_answerable, "train_answers": int(len(pool) - len(part))}
        a = _answerable(part)
        matched = len(set(a)) > 1
        mixes[key] = {"answers": int(len(part)), "answerable": int(a.sum()),
                      "weighted_to": round(share, 3) if matched else None,
                      "note": None if matched else "every calibrate answer of this preset and mode is of one kind "
                                                   "(answerable or not): no mix could match report's share"}
    corpora = list(dict.fromkeys(c for run in runs if (c := load_meta(run).get("corpus"))))
    about = {"command": command, "date": datetime.date.today().isoformat(), "runs": [str(r) for r in runs], "k": k,
             "retriever": "dense", "corpus": corpora[0] if len(corpora) == 1 else None,
             "label": "contains", "precision_target": PRECISION, "right_flagged_bound": RIGHT_FLAGGED,
             "split": "fitted on calibrate, weighted to report's answerable share; reported on report",
             "answerable_share": round(share, 3), "mix": mixes,
             "fitted_answers": int(len(calibrate)), "fitted_questions": int(calibrate["question_id"].nunique()),
             "report_answers": int(len(test)), "report_questions": int(test["question_id"].nunique()),
             "candidates": chosen, "choice": choice, "choose_on": [str(r) for r in choose_on or []]}
    model = ConfidenceModel(models, about)
    about["report"] = report(test, model, stack)
    answerable = with_answerable(test)
    about["report_answerable"] = report(answerable[answerable["answerable"]], model, stack)
    about["fitted"] = report(calibrate, model, stack)
    model = ConfidenceModel(models, about)
    model.save(out)
    if heldout_out:
        _write_heldout(test, model, stack, heldout_out, about)
    return about


def _write_heldout(test: pd.DataFrame, model: ConfidenceModel, stack: str, path: str, about: dict) -> None:
    """The report answers as tidy rows with their confidence (the reliability diagram's data), and
    a meta file naming the command, the questions and the cue's threshold per preset and mode."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    keep = ["qa", "question_id", "mode", "preset", "retriever", "k", "em", "f1", "contains", "gold_in_top_k"]
    with path.open("w", encoding="utf-8") as f:
        for _, r in test.iterrows():
            m = model.model_for(stack, r["preset"], r["mode"])
            if m is None:
                continue
            row = {c: (None if pd.isna(r[c]) else r[c].item() if hasattr(r[c], "item") else r[c]) for c in keep}
            row["confidence"] = m.predict(r["signals"])
            row["cues"] = ["probably_wrong"] if row["confidence"] < m.threshold else []
            f.write(json.dumps(row) + "\n")
    thresholds = {k: m.threshold for k, m in model.models.items()}
    # the answers' own CPU: the sweeps that made them (the fit itself runs no model)
    cpus = list(dict.fromkeys(c for run in about["runs"] if (c := load_meta(run).get("cpu"))))
    meta = {"command": about["command"], "date": about["date"], "qa": ", ".join(about["runs"]),
            "questions": int(test["question_id"].nunique()), "cpu": "; ".join(cpus) or None,
            "note": "the report split (rag_demo/splits.py): never fitted on",
            "threshold": float(np.median(list(thresholds.values()))), "thresholds": thresholds}
    path.with_name(path.stem + ".meta.json").write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")
