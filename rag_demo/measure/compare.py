"""`eval --compare`: saved eval reports side by side, question by question.

For each row (mode|retriever) every report answered, over the questions every report holds: n,
EM / F1 / contains, the same over the questions whose K passages hold a gold answer ("given
retrieval"), and for each report after the first the paired difference in given-retrieval
contains with a 95% bootstrap interval (2,000 resamples of the questions, seed 0), and how many
answers are identical to the first report's (the check that a refactor changed nothing).
"""
from __future__ import annotations

import json
import random
from pathlib import Path


def load_report(label_path: str) -> tuple[str, dict]:
    """"LABEL=PATH" (or a bare PATH, labelled by its file name) -> (label, the eval --out report)."""
    label, sep, path = label_path.rpartition("=")
    if not sep:
        label, path = Path(label_path).stem, label_path
    try:
        report = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"--compare {label_path!r}: cannot read an eval report there ({e}): give LABEL=PATH of an "
                         "`eval --out` JSON.") from None
    if "questions" not in report:
        raise ValueError(f"--compare {label_path!r} is not an eval report (no 'questions'): give an `eval --out` JSON.")
    return label, report


def _mean(xs) -> float:
    xs = list(xs)
    return 100 * sum(xs) / len(xs) if xs else float("nan")


def bootstrap(diffs: list[float], n: int = 2000, seed: int = 0) -> tuple[float, float]:
    """95% interval of the mean of paired differences, in points."""
    if not diffs:
        return float("nan"), float("nan")
    rng = random.Random(seed)
    means = sorted(sum(rng.choice(diffs) for _ in diffs) / len(diffs) for _ in range(n))
    return 100 * means[int(0.025 * n)], 100 * means[int(0.975 * n) - 1]


def compare_reports(runs: list[tuple[str, dict]], rows: list[str] | None = None) -> str:
    """The markdown comparison of labelled reports (the first is the baseline)."""
    if len(runs) < 2:
        raise ValueError("--compare needs two reports or more: LABEL=PATH LABEL=PATH ...")
    by_q = [(label, {q["question"]: q for q in r["questions"]}) for label, r in runs]
    common = sorted(set.intersection(*(set(q) for _, q in by_q)))
    if not common:
        raise ValueError("the reports share no question: compare runs over the same QA file.")
    shared_rows = sorted(set.intersection(*(set(q[common[0]]["answers_by_row"]) for _, q in by_q)))
    shown = [r for r in shared_rows if rows is None or r in rows]
    lines = [f"Questions every report answered: {len(common)}", "",
             "| run | row | n | EM | F1 | contains | n given | EM | F1 | contains | Δ contains given (95% CI) "
             "| same answers | tokens |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|"]
    _, base = by_q[0]
    for row in shown:
        for i, (label, r) in enumerate(by_q):
            res = [r[q]["answers_by_row"][row] for q in common]
            given = [x for x in res if x["hit"]]
            delta, same = "", ""
            if i:
                both = [q for q in common if r[q]["answers_by_row"][row]["hit"] and base[q]["answers_by_row"][row]["hit"]]
                d = [r[q]["answers_by_row"][row]["contains"] - base[q]["answers_by_row"][row]["contains"] for q in both]
                lo, hi = bootstrap(d)
                delta = f"{_mean(d):+.1f} ({lo:+.1f}, {hi:+.1f}), n={len(d)}"
                n_same = sum(r[q]["answers_by_row"][row]["text"] == base[q]["answers_by_row"][row]["text"] for q in common)
                same = f"{n_same}/{len(common)}"
            lines.append(
                f"| {label} | {row} | {len(res)} | {_mean(x['em'] for x in res):.1f} | {_mean(x['f1'] for x in res):.1f} "
                f"| {_mean(x['contains'] for x in res):.1f} | {len(given)} | {_mean(x['em'] for x in given):.1f} "
                f"| {_mean(x['f1'] for x in given):.1f} | {_mean(x['contains'] for x in given):.1f} | {delta} | {same} "
                f"| {sum(x['n_tokens'] for x in res) / len(res):.1f} |")
    return "\n".join(lines)


def differing(runs: list[tuple[str, dict]]) -> list[tuple[str, str, list[str]]]:
    """(question, row, each report's answer) wherever the reports' answers differ."""
    by_q = [{q["question"]: q for q in r["questions"]} for _, r in runs]
    out = []
    for q in sorted(set.intersection(*(set(x) for x in by_q))):
        for row in sorted(set.intersection(*(set(x[q]["answers_by_row"]) for x in by_q))):
            texts = [x[q]["answers_by_row"][row]["text"] for x in by_q]
            if len(set(texts)) > 1:
                out.append((q, row, texts))
    return out
