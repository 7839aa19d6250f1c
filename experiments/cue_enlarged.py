"""Would more answerable questions place the "probably wrong" cue where it holds? Calibrate holds 53
answerable questions; the open file's train split holds 87 more that nothing was fitted on for the
aided and paper presets (the trained preset was trained on them, so it cannot use them). This
enlarges calibrate's answerable answers with them and asks, for each candidate signal set and
threshold rule, what the cue does on answerable questions it did not see: the answerable
questions are halved at random `--reps` times; the fit and its threshold see every unanswerable
calibrate answer and one half, and the cue is read on the other half (recall, right answers
flagged, precision; medians and the 10th-90th percentiles, and how often all three of the bar hold:
recall >= 0.5, right flagged <= 0.2, precision >= 0.8). No report answer is read.

Rules: "mix" places the threshold as `eval --fit-confidence` does (measure/calibration.py: the mix
weighted to report's answerable share, at most a fifth of the right answers flagged, precision
>= 0.8); "answerable B" bounds the right answers flagged to B and precision to 0.8 on the
answerable answers alone.

The train answers come from one sweep (its rows ship in assets/results/qa_open_vital_train.jsonl):

    python -m rag_demo eval --sweep --k 5 --qa assets/qa_open_vital.jsonl --split train \\
        --labels assets/qa_open_vital.jsonl --presets aided,paper --modes sequence,token \\
        --out assets/results/qa_open_vital_train.jsonl
    .venv/bin/python experiments/cue_enlarged.py                 # calibrate + train (the run above)
    .venv/bin/python experiments/cue_enlarged.py --no-train      # calibrate alone, for comparison
"""
from __future__ import annotations

import argparse
import sys

import _shared  # noqa: F401 - puts the repository on sys.path
from _shared import ROOT
from cue_signals import REPORT_SHARE, RUNS  # the shipped sweep runs and report's answerable share

TRAIN_RUN = ROOT / "assets" / "results" / "qa_open_vital_train.jsonl"
# the bar and the threshold placements the shipped choice reads
from rag_demo.measure.calibration import BAR, PLACEMENTS as RULES  # noqa: E402


def held_out_halves(part, features: tuple[str, ...], rule: str, bound: float, reps: int, seed: int = 0) -> list[dict]:
    """For `reps` random halves of the answerable questions in `part` (one preset and mode): the cue
    fitted with the other half and every unanswerable answer, its threshold placed by `rule` and
    `bound`, read on this half (measure/calibration.py held_out_halves, which the shipped choice of
    signals and placement reads)."""
    from rag_demo.measure import calibration as cal

    mode = str(part["mode"].iloc[0]) if "mode" in part else ""
    return cal.held_out_halves(part, mode, features, REPORT_SHARE, reps, seed, placement=(rule, bound))


def summary(results: list[dict]) -> dict:
    """Medians, 10th-90th percentiles and the share of halves where the whole bar holds (calibration.bar_held)."""
    import numpy as np

    from rag_demo.measure.calibration import bar_held

    got = {k: np.nan_to_num(np.array([r[k] for r in results], dtype=float)) for k in BAR}
    return {**{k: (float(np.median(v)), float(np.quantile(v, 0.1)), float(np.quantile(v, 0.9))) for k, v in got.items()},
            "holds": bar_held(results)}


def load(train: bool):
    """The aided and paper RAG answers at K 5, dense, of calibrate (and train), with `answerable`."""
    import pandas as pd

    from rag_demo.measure.calibration import answers_at
    from rag_demo.measure.run_rows import load_rows, with_answerable
    from rag_demo.splits import split_of

    rows = pd.concat([answers_at(load_rows(p)) for p in RUNS + ([TRAIN_RUN] if train else [])], ignore_index=True)
    rows = rows.assign(split=rows["question_id"].map(lambda q: split_of(str(q))))
    keep = rows["split"].isin(["calibrate", "train"]) & rows["preset"].isin(["aided", "paper"]) \
        & rows["mode"].isin(["sequence", "token"])
    return with_answerable(rows[keep])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--no-train", action="store_true", help="calibrate's answerable answers alone")
    ap.add_argument("--reps", type=int, default=30, help="random halves per signal set and rule (default 30)")
    args = ap.parse_args(argv)
    from rag_demo.measure.calibration import FEATURE_SETS

    rows = load(not args.no_train)
    print("| preset | mode | answerable | signals | rule | recall | right flagged | precision | bar holds |")
    print("|---|---|---:|---:|---|---|---|---|---:|")
    for (preset, mode), part in rows.groupby(["preset", "mode"]):
        n = int(part.loc[part["answerable"].astype(bool), "question_id"].nunique())
        for features in FEATURE_SETS[mode]:
            for rule, bound in RULES:
                s = summary(held_out_halves(part, features, rule, bound, args.reps))
                cells = " | ".join(f"{s[k][0]:.2f} [{s[k][1]:.2f}-{s[k][2]:.2f}]" for k in BAR)
                print(f"| {preset} | {mode} | {n} | {len(features)} | {rule} {bound:.2f} | {cells} | {s['holds']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
