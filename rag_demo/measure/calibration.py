"""Fitting the answer cards' confidence: `python -m rag_demo eval --fit-confidence RUN [RUN ...]`.

Reads sweep runs (measure/sweep.py: tidy rows, each answer with its `signals`) and fits one model
per (preset, mode) on the answers at the default K with dense retrieval, by the one split rule
(rag_demo/splits.py): fitted on the "calibrate" questions, reported on the "report" questions,
never on "train" (what training read) nor on any other. The model file the app loads
(assets/confidence.json, rag_demo/confidence.py) records what it was fitted on and the report
numbers each card quotes; the report answers, each with its confidence, are written as tidy rows
(`--heldout-out`) for the Results tab's reliability diagram.

Which signals: a logistic regression over the simplest of FEATURE_SETS whose 5-fold cross-validated
log-loss on the calibrate answers is within one standard error of the best (the 14-signal model
did no better than log p alone on new questions, and was over-confident where it was sure). A
logistic regression's output is its own calibration (Platt's); the report split checks it, with
reliability bins of equal count.

"Right" is `contains`: a gold answer's words occur in the answer. The cue's threshold is the largest
that flags at most RIGHT_FLAGGED of the calibrate answers that were right, with its precision
(flagged answers that are wrong) at PRECISION or more; its recall is whatever that leaves. On
questions the corpus often cannot answer, most answers are wrong and a right answer's own
probability of being right is seldom over one half: a cue at p(right) < 1/2 flagged most right
answers too (docs/results.md §8), so the rule bounds the right answers flagged instead.
"""
from __future__ import annotations

import datetime
import json
from pathlib import Path

import numpy as np
import pandas as pd

from rag_demo.confidence import FEATURES, ConfidenceModel, Logistic
from rag_demo.measure.metrics import precision_recall, reliability_bins
from rag_demo.measure.run_rows import load_meta, load_rows, with_answerable
from rag_demo.splits import split_of

PRECISION = 0.85  # the cue's least precision on the calibrate answers (0.8 is the bar it must clear on report)
# the most of the right calibrate answers the cue may flag: a quarter is the bar on report, where
# right answers to questions the corpus cannot answer look unsure and get flagged more than on
# calibrate (docs/results.md §8), so a tenth here
RIGHT_FLAGGED = 0.1
C = 1.0  # inverse L2 strength: the features are standardised
FOLDS = 5
# the candidate signal sets per mode, simplest first
FEATURE_SETS = {
    "closed-book": (("logprob",), ("logprob", "mean_logprob", "n_tokens"), FEATURES["closed-book"]),
    "sequence": (("logprob",), ("logprob", "mean_logprob", "in_passage", "margin"), FEATURES["sequence"]),
    "token": (("logprob",), ("logprob", "mean_logprob", "in_passage", "margin"), FEATURES["token"]),
}


def answers_at(rows: pd.DataFrame, k: int = 5, retriever: str = "dense") -> pd.DataFrame:
    """The answers a card shows by default: RAG modes at K = k with `retriever`, and closed-book."""
    rag = rows["mode"].isin(["sequence", "token"]) & (rows["k"] == k) & (rows["retriever"] == retriever)
    closed = rows["mode"] == "closed-book"
    return rows[(rag | closed) & rows["signals"].notna()]


def _matrix(rows: pd.DataFrame, features: tuple[str, ...]) -> np.ndarray:
    return np.array([[float(sig[f]) for f in features] for sig in rows["signals"]], dtype=np.float64)


def _logistic(x: np.ndarray, y: np.ndarray, features: tuple[str, ...]) -> Logistic:
    from sklearn.linear_model import LogisticRegression

    mean, scale = x.mean(0), x.std(0)
    scale[scale == 0] = 1.0
    reg = LogisticRegression(C=C, max_iter=1000).fit((x - mean) / scale, y)
    return Logistic(features, tuple(mean), tuple(scale), tuple(reg.coef_[0]), float(reg.intercept_[0]), 0.5)


def cv_logloss(x: np.ndarray, y: np.ndarray, features: tuple[str, ...], folds: int = FOLDS) -> tuple[float, float]:
    """(mean, standard error) over `folds` stratified folds of the held-out log-loss."""
    from sklearn.model_selection import StratifiedKFold

    losses = []
    for fit, test in StratifiedKFold(folds, shuffle=True, random_state=0).split(x, y):
        m = _logistic(x[fit], y[fit], features)
        p = np.clip([m.predict(dict(zip(features, r))) for r in x[test]], 1e-6, 1 - 1e-6)
        losses.append(float(-np.mean(y[test] * np.log(p) + (1 - y[test]) * np.log(1 - p))))
    return float(np.mean(losses)), float(np.std(losses) / np.sqrt(len(losses)))


def choose_features(rows: pd.DataFrame, mode: str) -> tuple[tuple[str, ...], list[dict]]:
    """The simplest of FEATURE_SETS[mode] within one standard error of the best cross-validated
    log-loss, and every candidate's numbers (for the model file)."""
    y = (rows["contains"].to_numpy() > 0).astype(int)
    scores = []
    for features in FEATURE_SETS[mode]:
        mean, se = cv_logloss(_matrix(rows, features), y, features)
        scores.append({"features": list(features), "cv_logloss": round(mean, 4), "se": round(se, 4)})
    best = min(scores, key=lambda s: s["cv_logloss"])
    chosen = next(s for s in scores if s["cv_logloss"] <= best["cv_logloss"] + best["se"])
    return tuple(chosen["features"]), scores


def fit_one(rows: pd.DataFrame, mode: str, precision: float = PRECISION,
            features: tuple[str, ...] | None = None) -> Logistic:
    """A standardised L2 logistic regression of right (contains) on `features` (default: the mode's
    chosen ones, `choose_features`), and the cue's threshold."""
    features = choose_features(rows, mode)[0] if features is None else tuple(features)
    x, y = _matrix(rows, features), (rows["contains"].to_numpy() > 0).astype(int)
    if len(set(y)) < 2:
        raise ValueError(f"the {mode} answers to fit on are all {'right' if y.all() else 'wrong'}: add questions.")
    model = _logistic(x, y, features)
    p = np.array([model.predict(dict(zip(features, row))) for row in x])
    return Logistic(*[getattr(model, f) for f in ("features", "mean", "scale", "coef", "intercept")],
                    threshold=choose_threshold(p, y, precision))


def choose_threshold(p: np.ndarray, right: np.ndarray, precision: float, right_flagged: float = RIGHT_FLAGGED) -> float:
    """The largest t such that the answers with confidence below t are wrong at least `precision`
    of the time and hold at most `right_flagged` of the right answers: the most recall the two
    bounds allow; 0 (never flags) when no t meets both.

    >>> p, right = np.array([.1, .2, .3, .4, .9]), np.array([0, 0, 1, 0, 1])
    >>> choose_threshold(p, right, 0.9, 0.5), choose_threshold(p, right, 0.6, 0.5)  # two lowest; four: 3 of 4 wrong
    (0.25, 0.65)
    >>> choose_threshold(p, right, 0.6, 0.2)  # flagging .3 would flag half the right answers
    0.25
    """
    order = np.argsort(p)
    best, wrong, n_right = 0.0, 0, int((right == 1).sum())
    for n, i in enumerate(order, start=1):
        wrong += int(right[i] == 0)
        nxt = p[order[n]] if n < len(order) else 1.0
        flagged_right = (n - wrong) / n_right if n_right else 0.0
        if wrong / n >= precision and flagged_right <= right_flagged and nxt > p[i]:  # flagging every answer up to this one
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


def fit(runs: list[str], out: str, heldout_out: str | None, command: str, stack: str = "offline", k: int = 5) -> dict:
    """Fit on the runs' calibrate answers, report on their report answers, save (see the module
    docstring); -> the model file's `about`."""
    frames = [answers_at(load_rows(path), k) for path in runs]
    if not frames:
        raise ValueError("no runs given: pass sweep runs with --fit-confidence RUN [RUN ...].")
    rows = pd.concat(frames, ignore_index=True)
    rows = rows.assign(split=rows["question_id"].map(lambda q: split_of(str(q))))
    calibrate, test = rows[rows["split"] == "calibrate"], rows[rows["split"] == "report"]
    if calibrate.empty or test.empty:
        raise ValueError(f"the runs hold {len(calibrate)} calibrate and {len(test)} report answers at K = {k}: run "
                         "the sweep with --split calibrate,report (rag_demo/splits.py) first.")
    models, chosen = {}, {}
    for (preset, mode), part in calibrate.groupby(["preset", "mode"]):
        features, scores = choose_features(part, mode)
        key = ConfidenceModel.key(stack, preset, mode)
        models[key] = fit_one(part, mode, features=features)
        chosen[key] = scores
    about = {"command": command, "date": datetime.date.today().isoformat(), "runs": [str(r) for r in runs], "k": k,
             "label": "contains", "precision_target": PRECISION, "split": "fitted on calibrate, reported on report",
             "fitted_answers": int(len(calibrate)), "fitted_questions": int(calibrate["question_id"].nunique()),
             "report_answers": int(len(test)), "report_questions": int(test["question_id"].nunique()),
             "candidates": chosen}
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
