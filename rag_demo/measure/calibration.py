"""Fitting the answer cards' confidence: `python -m rag_demo eval --fit-confidence RUN [RUN ...]`.

Reads sweep runs (measure/sweep.py: tidy rows, each answer with its `signals`), fits one logistic
regression per (preset, mode) on the answers at the default K with dense retrieval, and writes
the model the app loads (assets/confidence.json, rag_demo/confidence.py) with what it was fitted
on and how it did on questions it was not fitted on.

The split: every question of a file marked `--fit-all` (the dev set: written here, so it cannot
be the measure) and half of the others (the external questions, by a hash of their id) are fitted
on; the other half is held out. The held-out answers, each with its confidence, are written as
tidy rows (`--heldout-out`), which the Results tab's reliability diagram reads.

"Right" is `contains`: a gold answer's words occur in the answer. The cue's threshold is the
largest that keeps its precision (flagged answers that are wrong) at PRECISION or more on the
fitted answers; its recall is then whatever that leaves.
"""
from __future__ import annotations

import datetime
import hashlib
import json
from pathlib import Path

import numpy as np
import pandas as pd

from rag_demo.confidence import FEATURES, ConfidenceModel, Logistic
from rag_demo.measure.metrics import precision_recall
from rag_demo.measure.run_rows import load_meta, load_rows

PRECISION = 0.85  # the cue's target precision on the fitted answers (0.8 is the bar it must clear held out)
C = 1.0  # inverse L2 strength: the features are standardised, a handful of them on hundreds of answers


def held_out(question_id: str) -> bool:
    """Whether a question falls in the held-out half (a stable hash of its id)."""
    return int(hashlib.sha256(question_id.encode()).hexdigest(), 16) % 2 == 1


def answers_at(rows: pd.DataFrame, k: int = 5, retriever: str = "dense") -> pd.DataFrame:
    """The answers a card shows by default: RAG modes at K = k with `retriever`, and closed-book."""
    rag = rows["mode"].isin(["sequence", "token"]) & (rows["k"] == k) & (rows["retriever"] == retriever)
    closed = rows["mode"] == "closed-book"
    return rows[(rag | closed) & rows["signals"].notna()]


def _matrix(rows: pd.DataFrame, features: tuple[str, ...]) -> np.ndarray:
    return np.array([[float(sig[f]) for f in features] for sig in rows["signals"]], dtype=np.float64)


def fit_one(rows: pd.DataFrame, mode: str, precision: float = PRECISION,
            features: tuple[str, ...] | None = None) -> Logistic:
    """A standardised L2 logistic regression of right (contains) on the mode's signals (or on
    `features`, a probe's other choice of them), and the cue's threshold."""
    from sklearn.linear_model import LogisticRegression

    features = FEATURES[mode] if features is None else tuple(features)
    x, y = _matrix(rows, features), (rows["contains"].to_numpy() > 0).astype(int)
    if len(set(y)) < 2:
        raise ValueError(f"the {mode} answers to fit on are all {'right' if y.all() else 'wrong'}: add questions.")
    mean, scale = x.mean(0), x.std(0)
    scale[scale == 0] = 1.0
    reg = LogisticRegression(C=C, max_iter=1000).fit((x - mean) / scale, y)
    model = Logistic(features, tuple(mean), tuple(scale), tuple(reg.coef_[0]), float(reg.intercept_[0]), 0.5)
    p = np.array([model.predict(dict(zip(features, row))) for row in x])
    return Logistic(*[getattr(model, f) for f in ("features", "mean", "scale", "coef", "intercept")],
                    threshold=choose_threshold(p, y, precision))


def choose_threshold(p: np.ndarray, right: np.ndarray, precision: float) -> float:
    """The largest t such that the answers with confidence below t are wrong at least `precision`
    of the time (the most recall at that precision); 0 (never flags) when none reaches it.

    >>> p, right = np.array([.1, .2, .3, .9]), np.array([0, 0, 1, 1])
    >>> choose_threshold(p, right, 0.9), choose_threshold(p, right, 0.6)  # the two lowest: 2 of 2 wrong; three: 2 of 3
    (0.25, 0.6)
    """
    order = np.argsort(p)
    best, wrong = 0.0, 0
    for n, i in enumerate(order, start=1):
        wrong += int(right[i] == 0)
        nxt = p[order[n]] if n < len(order) else 1.0
        if wrong / n >= precision and nxt > p[i]:  # flagging every answer up to this one
            best = float((p[i] + nxt) / 2) if n < len(order) else 1.0
    return best


def auroc(p: np.ndarray, right: np.ndarray) -> float:
    """P(a right answer scores above a wrong one), ties counted half."""
    pos, neg = p[right == 1], p[right == 0]
    if not len(pos) or not len(neg):
        return float("nan")
    wins = sum(float((q > neg).sum()) + 0.5 * float((q == neg).sum()) for q in pos)
    return wins / (len(pos) * len(neg))


def report(rows: pd.DataFrame, model: ConfidenceModel, stack: str) -> list[dict]:
    """Per preset and mode: answers, how many wrong, AUROC, Brier score, the cue's precision and recall."""
    out = []
    for (preset, mode), part in rows.groupby(["preset", "mode"]):
        m = model.model_for(stack, preset, mode)
        if m is None:
            continue
        p = np.array([m.predict(sig) for sig in part["signals"]])
        right = (part["contains"].to_numpy() > 0).astype(int)
        flagged = p < m.threshold
        wrong = right == 0
        precision, recall = precision_recall(flagged, wrong)
        out.append({"preset": preset, "mode": mode, "answers": int(len(p)), "wrong": int(wrong.sum()),
                    "auroc": round(auroc(p, right), 3), "brier": round(float(((p - right) ** 2).mean()), 3),
                    "flagged": int(flagged.sum()),
                    "precision": round(precision, 3), "recall": round(recall, 3),
                    "threshold": round(m.threshold, 3)})
    return out


def fit(runs: list[str], fit_all: list[str], out: str, heldout_out: str | None, command: str, stack: str = "offline",
        k: int = 5) -> dict:
    """Fit, save and report (see the module docstring); -> the model file's `about`."""
    frames = []
    for path in runs:
        rows = load_rows(path)
        rows = answers_at(rows, k)
        whole = Path(path).name in fit_all or str(path) in fit_all
        rows = rows.assign(fit=True if whole else ~rows["question_id"].map(held_out))
        frames.append(rows)
    if not frames:
        raise ValueError("no runs given: pass sweep runs with --fit-confidence RUN [RUN ...].")
    rows = pd.concat(frames, ignore_index=True)
    train, test = rows[rows["fit"]], rows[~rows["fit"]]
    models = {}
    for (preset, mode), part in train.groupby(["preset", "mode"]):
        models[ConfidenceModel.key(stack, preset, mode)] = fit_one(part, mode)
    about = {"command": command, "date": datetime.date.today().isoformat(), "runs": [str(r) for r in runs],
             "fit_all": list(fit_all), "k": k, "label": "contains", "precision_target": PRECISION,
             "fitted_answers": int(len(train)), "held_out_answers": int(len(test))}
    model = ConfidenceModel(models, about)
    about["held_out"] = report(test, model, stack)
    about["fitted"] = report(train, model, stack)
    model = ConfidenceModel(models, about)
    model.save(out)
    if heldout_out:
        _write_heldout(test, model, stack, heldout_out, about)
    return about


def _write_heldout(test: pd.DataFrame, model: ConfidenceModel, stack: str, path: str, about: dict) -> None:
    """The held-out answers as tidy rows with their confidence (the reliability diagram's data), and
    a meta file naming the command, the questions and the cue's threshold per preset and mode."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    keep = ["qa", "question_id", "mode", "preset", "retriever", "k", "em", "f1", "contains", "gold_in_top_k"]
    with path.open("w", encoding="utf-8") as f:
        for _, r in test.iterrows():
            m = model.model_for(stack, r["preset"], r["mode"])
            row = {c: (None if pd.isna(r[c]) else r[c].item() if hasattr(r[c], "item") else r[c]) for c in keep}
            row["confidence"] = m.predict(r["signals"])
            row["cues"] = ["probably_wrong"] if row["confidence"] < m.threshold else []
            f.write(json.dumps(row) + "\n")
    thresholds = {k: m.threshold for k, m in model.models.items()}
    # the answers' own CPU: the sweeps that made them (the fit itself runs no model)
    cpus = list(dict.fromkeys(c for run in about["runs"] if (c := load_meta(run).get("cpu"))))
    meta = {"command": about["command"], "date": about["date"], "qa": ", ".join(about["runs"]),
            "questions": int(test["question_id"].nunique()), "cpu": "; ".join(cpus) or None,
            "note": "held-out half of the external questions (never fitted on)",
            "threshold": float(np.median(list(thresholds.values()))), "thresholds": thresholds}
    path.with_name(path.stem + ".meta.json").write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")
