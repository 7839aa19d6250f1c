"""Could a rule flag a copy from the right passage's wrong span? A probe for the "probably wrong"
cue (docs/results.md §8).

The penicillin lesson's RAG answer, "Howard Florey", is copied from the Alexander Fleming passage:
the top passage is about someone the question does not name, and the answer is another name in
it. Call an answer *off-subject* when

    the top passage (highest p(z|x)) has a title the question does not name (not all its words
    occur in the question), and the answer is not that title (neither holds the other as a run
    of words).

This reads `eval --out` reports and prints, per RAG mode: how often off-subject answers are wrong,
how often the confident ones (no "probably wrong" cue on their card) are, and what flagging every
off-subject answer as well would do to the cue's precision and recall, on the questions the
confidence is fitted on and on the ones it is reported on (the calibrate and report splits,
rag_demo/splits.py; a report given with --fit-all counts as fitted). Then, as a signal instead of a
rule: the held-out AUROC of the confidence's logistic regression refitted on the fitted answers
with and without "off-subject" among its signals.

    python experiments/off_subject.py artifacts/off_subject_ext100.json --fit-all artifacts/off_subject_dev.json
    python experiments/off_subject.py --tiny      # smoke run on the fixture passages
"""
from __future__ import annotations

import argparse
import json
import sys

from _shared import TINY_HELP, temp_path, tiny_run

MODES = ("sequence", "token")


def off_subject(question: str, answer: str, top_title: str) -> bool:
    """Whether the top passage is about something the question does not name and the answer is
    not that something (see the module docstring)."""
    from rag_demo.reader.text import match_tokens, occurs_in

    text = answer.strip().rstrip(".")
    asked = set(match_tokens(question))
    named = all(w in asked for w in match_tokens(top_title))
    return bool(text) and not named and not (occurs_in(text, top_title) or occurs_in(top_title, text))


def answers(path: str, fitted_whole: bool) -> list[dict]:
    """One dict per RAG answer of an `eval --out` report: mode, right, cued, off, fitted."""
    from rag_demo.splits import split_of

    report = json.load(open(path, encoding="utf-8"))
    out = []
    for rec in report["questions"]:
        for key, a in rec["answers_by_row"].items():
            mode = key.split("|")[0]
            if mode not in MODES or not a["docs"]:
                continue
            top = max(a["docs"], key=lambda d: d["prior"])
            out.append({"mode": mode, "right": a["contains"] > 0, "cued": "probably_wrong" in a["cues"],
                        "signals": a["signals"],
                        "off": off_subject(rec["question"], a["text"], top["title"]),
                        "fitted": fitted_whole or split_of(str(rec.get("id"))) != "report"})
    return out


def share(part: list[dict], what) -> str:
    n = sum(1 for a in part if what(a))
    return f"{n}/{len(part)}" if part else "-"


def wrong(a: dict) -> bool:
    return not a["right"]


def table(rows: list[dict]) -> str:
    """Per mode and split: off-subject answers wrong, the confident ones wrong, the cue's precision
    and recall as shipped and with every off-subject answer flagged too."""
    from rag_demo.measure.metrics import precision_recall

    def pr(part: list[dict], flag) -> str:
        p, r = precision_recall([flag(a) for a in part], [wrong(a) for a in part])
        return "-" if p != p or r != r else f"{p:.2f} / {r:.2f}"  # NaN: nothing flagged, or nothing wrong

    lines = ["| mode | split | answers | off-subject: wrong | off-subject, no cue: wrong | cue P / R "
             "| cue or off-subject P / R |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for mode in MODES:
        for split, fitted in (("fitted", True), ("held out", False)):
            part = [a for a in rows if a["mode"] == mode and a["fitted"] == fitted]
            if not part:
                continue
            off = [a for a in part if a["off"]]
            confident = [a for a in off if not a["cued"]]
            lines.append(f"| {mode} | {split} | {len(part)} | {share(off, wrong)} | {share(confident, wrong)} "
                         f"| {pr(part, lambda a: a['cued'])} | {pr(part, lambda a: a['cued'] or a['off'])} |")
    return "\n".join(lines)


def as_signal(rows: list[dict]) -> str:
    """Per mode: held-out AUROC of the confidence refitted (calibration.fit_one) on the fitted
    answers over the mode's signals, and over them plus off-subject."""
    import numpy as np
    import pandas as pd

    from rag_demo.confidence import FEATURES
    from rag_demo.measure.calibration import auroc, fit_one

    lines = ["| mode | held-out AUROC, shipped signals | with off-subject | off-subject's weight |", "|---|---:|---:|---:|"]
    for mode in MODES:
        part = pd.DataFrame([{"signals": {**a["signals"], "off_subject": float(a["off"])}, "contains": float(a["right"]),
                              "fitted": a["fitted"]} for a in rows if a["mode"] == mode])
        if part.empty or part["fitted"].all() or not part["fitted"].any():
            continue
        train, test = part[part["fitted"]], part[~part["fitted"]]
        if train["contains"].nunique() < 2:
            continue
        right = test["contains"].to_numpy().astype(int)
        got = []
        for features in (FEATURES[mode], FEATURES[mode] + ("off_subject",)):
            model = fit_one(train, mode, features=features)
            got.append((auroc(np.array([model.predict(sig) for sig in test["signals"]]), right), model.coef[-1]))
        lines.append(f"| {mode} | {got[0][0]:.3f} | {got[1][0]:.3f} | {got[1][1]:+.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("reports", nargs="*", help="eval --out reports whose questions split by rag_demo/splits.py")
    ap.add_argument("--fit-all", nargs="*", default=[], help="reports counted as fitted whole (the dev set)")
    ap.add_argument("--tiny", action="store_true", help=TINY_HELP)
    args = ap.parse_args(argv)
    if args.tiny:
        args.reports = [str(tiny_run(temp_path("off_subject_tiny.json")))]
    if not args.reports and not args.fit_all:
        ap.error("give at least one eval --out report (or --tiny)")
    rows = [a for p in args.reports for a in answers(p, False)] + [a for p in args.fit_all for a in answers(p, True)]
    print(f"{len(rows)} RAG answers, {sum(a['off'] for a in rows)} off-subject")
    print(table(rows))
    print()
    print(as_signal(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
