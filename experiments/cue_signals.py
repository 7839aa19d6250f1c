"""Would the "probably wrong" cue catch more wrong answers with signals the answer's own numbers do
not carry? For the calibrate answers of the shipped sweep runs (never report's), three candidate
signals are computed and the cue is cross-validated as `eval --fit-confidence` does it
(measure/calibration.py: the mix weighted to report's answerable share, the threshold at the
bounds), with and without them:

    type_fit     +1 the question asks for a number, a date, a name or a place and the answer holds
                 one, -1 it does not, 0 the question asks for no type
    support      the share of the question's words (those the answer does not say) in the passage
                 sentence that holds the answer; 0 when no passage holds it
    answer_mass  Σ_z p(z|x) over the passages that hold the answer

The passages are retrieved again (dense, K 5, the retriever's prior at temperature 1): retrieval
is deterministic, the answers are the runs' own, so no answer is generated.

    .venv/bin/python experiments/cue_signals.py                    # the shipped runs' calibrate answers
    .venv/bin/python experiments/cue_signals.py --tiny             # smoke run
"""
from __future__ import annotations

import argparse
import json
import re
import sys

import _shared  # noqa: F401 - puts the repository on sys.path
from _shared import ROOT, TINY_HELP

RUNS = [ROOT / "assets" / "results" / "qa_open_vital.jsonl", ROOT / "assets" / "results" / "qa_train_vital.jsonl"]
QA = [ROOT / "assets" / "qa_open_vital.jsonl", ROOT / "assets" / "qa_train_vital.jsonl"]
REPORT_SHARE = 0.122  # report's answerable share (its questions' labels; assets/confidence.json "answerable_share")
SIGNALS = ("type_fit", "support", "answer_mass")
STOP = set("the a an of in on at to for by with from and or is was were are be been who what when where which how "
           "why did do does that this it its as their his her they he she".split())
NUMBER_WORDS = (r"\b(one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|twenty|thirty|forty|fifty|"
                r"hundred|thousand|million|billion|dozen)\b")
DATE_WORDS = (r"\b(january|february|march|april|may|june|july|august|september|october|november|december|"
              r"century|centuries|bc|ad|bce)\b")


def asks_for(question: str) -> str | None:
    """The type of answer a question asks for: "number", "date", "name", "place" or None."""
    q = question.lower()
    if re.search(r"\bhow (many|much|long|old|far|tall|big|large|high|deep|fast)\b|\bnumber of\b|\bpopulation\b", q):
        return "number"
    if re.search(r"\bwhen\b|\bwhat year\b|\bwhich year\b|\blast time\b|\bfirst time\b|\byear\b|\bcentury\b", q):
        return "date"
    if re.search(r"\bwho\b|\bwhom\b|\bwhose\b", q):
        return "name"
    if re.search(r"\bwhere\b|\b(what|which) (country|city|state|continent)\b", q):
        return "place"
    return None


def type_fit(question: str, answer: str) -> float:
    """+1 / -1 / 0: the answer holds / lacks the type its question asks for / no type asked."""
    want, answer = asks_for(question), (answer or "").strip()
    if want is None or not answer:
        return 0.0
    low = answer.lower()
    if want == "number":
        ok = bool(re.search(r"\d", answer) or re.search(NUMBER_WORDS, low))
    elif want == "date":
        ok = bool(re.search(r"\d", answer) or re.search(DATE_WORDS, low))
    else:  # a name or a place: a capitalised word that is not a sentence's usual opening
        words = re.findall(r"[A-Za-z][\w'-]*", answer)
        openers = {"The", "A", "An", "It", "He", "She", "They", "In", "On", "At", "This", "That", "I"}
        ok = any(w[0].isupper() and (i > 0 or w not in openers) for i, w in enumerate(words))
    return 1.0 if ok else -1.0


def support(question: str, answer: str, passages: list[tuple[str, str]], prior: list[float]) -> dict[str, float]:
    """`support` and `answer_mass` of an answer over its passages [(title, text)] and p(z|x)."""
    from rag_demo.reader.text import match_tokens, occurs_in

    answer = (answer or "").strip().rstrip(".")
    asked = {w for w in match_tokens(question) if w not in STOP} - set(match_tokens(answer))
    best, mass = 0.0, 0.0
    for (title, text), p in zip(passages, prior):
        if not answer or not occurs_in(answer, f"{title} {text}"):
            continue
        mass += p
        for sentence in re.split(r"(?<=[.!?])\s+", text):
            if occurs_in(answer, sentence) or occurs_in(answer, title):
                words = set(match_tokens(sentence)) | set(match_tokens(title))
                best = max(best, len(asked & words) / len(asked) if asked else 0.0)
    return {"support": best, "answer_mass": mass}


def with_signals(rows, questions: dict[str, str], retrieve):
    """The RAG rows with SIGNALS added to each row's `signals`; retrieve(question) -> ([(title, text)], p(z|x))."""
    rows = rows[rows["mode"] != "closed-book"].copy()
    got = {qid: retrieve(questions[str(qid)]) for qid in rows["question_id"].unique()}
    rows["signals"] = [dict(s, type_fit=type_fit(questions[str(q)], a), **support(questions[str(q)], a, *got[q]))
                       for s, q, a in zip(rows["signals"], rows["question_id"], rows["answer"])]
    return rows


def compare(rows, share: float | None = REPORT_SHARE) -> list[dict]:
    """Per preset and mode: each signal's AUROC among answerable answers, and the cross-validated cue
    (calibration.choose_features' numbers) of the shipped candidate sets and of each with SIGNALS."""
    import numpy as np

    from rag_demo.measure import calibration as cal

    out = []
    for (preset, mode), part in rows.groupby(["preset", "mode"]):
        a = cal._answerable(part).astype(bool)
        y = (part["contains"].to_numpy() > 0).astype(int)
        aurocs = {f: round(cal.auroc(np.array([s[f] for s in part[a]["signals"]], dtype=float), y[a]), 2)
                  for f in ("logprob",) + SIGNALS}
        base = cal.FEATURE_SETS[mode]
        sets = base + tuple(tuple(f) + SIGNALS for f in base)
        saved = cal.FEATURE_SETS[mode]
        cal.FEATURE_SETS[mode] = sets
        try:
            _, scores = cal.choose_features(part, mode, share)
        finally:
            cal.FEATURE_SETS[mode] = saved
        out.append({"preset": preset, "mode": mode, "answerable": int(a.sum()), "right": int(y[a].sum()),
                    "auroc_answerable": aurocs, "candidates": scores})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tiny", action="store_true", help=TINY_HELP)
    a = ap.parse_args(argv)
    import pandas as pd

    from rag_demo.measure import calibration as cal
    from rag_demo.measure.run_rows import load_rows, with_answerable
    from rag_demo.splits import split_of

    if a.tiny:
        rows, questions, retrieve = _tiny()
    else:
        from rag_demo.pipeline import RagPipeline

        questions = {json.loads(line)["id"]: json.loads(line)["question"]
                     for path in QA for line in path.read_text(encoding="utf-8").splitlines() if line.strip()}
        rows = pd.concat([cal.answers_at(load_rows(p), 5) for p in RUNS], ignore_index=True)
        rows = with_answerable(rows[rows["question_id"].map(lambda q: split_of(str(q))) == "calibrate"])
        pipe = RagPipeline.load()

        def retrieve(q: str):
            import torch

            ret = pipe.retrieve(q, "token", 5)
            prior = torch.softmax(torch.as_tensor(ret.scores, dtype=torch.float32), 0)  # (K,) p(z|x) at temperature 1
            return [(p.title, p.text) for p in ret.passages], prior.tolist()
    for r in compare(with_signals(rows, questions, retrieve), None if a.tiny else REPORT_SHARE):
        print(f"{r['preset']} {r['mode']}: {r['answerable']} answerable answers, {r['right']} right; "
              f"AUROC among them {r['auroc_answerable']}")
        for s in r["candidates"]:
            cue = s["cv_cue"]["answerable"]
            print(f"  {'+'.join(s['features']) if len(s['features']) < 7 else str(len(s['features'])) + ' signals'}"
                  f"{' (+ the three)' if s['features'][-1] == SIGNALS[-1] and len(s['features']) >= 7 else ''}: "
                  f"answerable recall {cue['recall']}, right flagged {cue['right_flagged']}, "
                  f"precision {cue['precision']}")
    return 0


def _tiny():
    """Synthetic calibrate rows over the fixture passages: a right and a wrong answer to each question
    per mode, answerable, with random numbers for the shipped signals."""
    import random

    import pandas as pd

    from _shared import TINY_QA
    from rag_demo.confidence import FEATURES
    from rag_demo.models.random_models import FIXTURE_PASSAGES

    rng = random.Random(0)
    rows, questions = [], {}
    for i in range(12):
        q, gold = TINY_QA[i % len(TINY_QA)]
        questions[f"t{i}"] = q
        for mode in ("sequence", "token"):
            right = i % 2 == 0
            sig = {f: rng.random() for f in FEATURES[mode]}
            sig["logprob"] = (-1.0 if right else -3.0) + rng.gauss(0, 1)
            rows.append({"question_id": f"t{i}", "mode": mode, "preset": "aided", "answer": gold[0] if right else "Rome",
                         "contains": float(right), "answerable": True, "signals": sig})
    passages = list(FIXTURE_PASSAGES)  # (title, text)
    return pd.DataFrame(rows), questions, lambda q: (passages, [1 / len(passages)] * len(passages))


if __name__ == "__main__":
    sys.exit(main())
