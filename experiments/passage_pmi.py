"""Do the passages support the answer? Candidate signals for the "probably wrong" cue
(docs/results.md §8). First, how much retrieval raised the answer's probability over the generator alone,

    PMI = log p(y|x) - log p_closed(y|x)

log p(y|x) the RAG answer's own marginal (RAG-Sequence or RAG-Token, its `logprob` signal) and
log p_closed(y|x) the same answer's tokens teacher-forced under its preset's closed-book prompt and
weights (what the closed-book card would give this text). An answer the passages support should
owe them its probability; a guess from the generator's own weights should not. `pmi_mean` is the
same per answer token.

For the calibrate answers of the shipped sweep runs, and the open file's train answers that nothing
was fitted on (aided, paper; cue_enlarged.py), it scores each RAG answer once, then prints (a) the
AUROC right against wrong of log p, PMI and pmi_mean among the answerable answers, and (b) the cue
read on held-out halves of the answerable questions with each candidate signal set, with and
without PMI (cue_enlarged.py's procedure: the shipped "mix" rule). No report answer is read.

    .venv/bin/python experiments/passage_pmi.py                             # read the shipped scoring
    .venv/bin/python experiments/passage_pmi.py --out experiments/passage_pmi.jsonl   # score again (~10 min), read
    .venv/bin/python experiments/passage_pmi.py --tiny                      # smoke run

A second candidate is scored beside it: `verify`, the reader itself asked whether the question's
top dense passage supports the answer (log p("Yes") - log p("No"), P(True)-style). And the shipped
GROUNDING signals (rag_demo/confidence.py: whether the passages hold what the answer adds to its
question) are read beside both, added to the runs' answers as `eval --fit-confidence` adds them.
"""
from __future__ import annotations

import argparse
import json
import sys

import _shared  # noqa: F401 - puts the repository on sys.path
from _shared import ROOT, TINY_HELP, TINY_QA, tiny_pipeline
from cue_enlarged import BAR, TRAIN_RUN, held_out_halves, summary
from cue_signals import QA, RUNS

SCORES = ROOT / "experiments" / "passage_pmi.jsonl"  # the shipped scoring (--out writes a new one)


def closed_logprob(pipe, preset: str, question: str, answer: str) -> tuple[float, int]:
    """log p_closed(answer | question) under `preset`'s closed-book prompt and weights, teacher-forced
    -> (the sum, the answer's token count)."""
    from rag_demo.config import RagSettings
    from rag_demo.rag.decoding import score_candidates
    from rag_demo.reader.reading import prompt, question_read

    s = RagSettings(preset=preset)
    gen = pipe.stack.modes_for(s.decoding.weights)["closed-book"].generator
    ids = gen.tokenizer.encode(answer.strip(), add_special_tokens=False)
    if not ids:
        return 0.0, 0
    cb = prompt(gen, question_read(s.aids, question), None, s.decoding, s.aids)
    first, state = gen.prefill([cb])  # (1, V)
    lp, _ = score_candidates(gen, state, first, [ids], gen.pad_token_id)  # (1, 1, T)
    return float(lp[0, 0, : len(ids)].sum()), len(ids)


VERIFY = ("Passage: {title}: {text}\n\nQuestion: {question}\nProposed answer: {answer}\n\n"
          "Does the passage support the proposed answer? Answer Yes or No.")


def verify_score(pipe, question: str, answer: str, cache: dict) -> float:
    """The reader asked whether the question's top dense passage supports the answer:
    log p("Yes") - log p("No") as its first word, under the base weights' chat template."""
    if question not in cache:
        cache[question] = pipe.retrieve(question, "token", k=1).passages[0]
    z = cache[question]
    gen = pipe.stack.modes["closed-book"].generator
    tok = gen.tokenizer
    text = VERIFY.format(title=z.title, text=z.text, question=question, answer=answer.strip())
    chat = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False)
    ids = tok.encode(chat, add_special_tokens=False)
    first, _ = gen.prefill([list(ids)])  # (1, V)
    yes, no = (tok.encode(w, add_special_tokens=False)[0] for w in ("Yes", "No"))
    return float(first[0, yes] - first[0, no])


def load_rows():
    """Calibrate RAG answers of every preset, plus the open file's train answers (aided, paper), K 5, dense."""
    import pandas as pd

    from rag_demo.measure.calibration import answers_at
    from rag_demo.measure.run_rows import load_rows as load, with_answerable
    from rag_demo.splits import split_of

    rows = pd.concat([answers_at(load(p)) for p in RUNS + [TRAIN_RUN]], ignore_index=True)
    rows = rows.assign(split=rows["question_id"].map(lambda q: split_of(str(q))))
    keep = (rows["split"] == "calibrate") | ((rows["split"] == "train") & rows["preset"].isin(["aided", "paper"]))
    return with_answerable(rows[keep & rows["mode"].isin(["sequence", "token"]) & rows["answer"].notna()])


def score(pipe, rows, questions: dict[str, str], out: str) -> None:
    """Write one line per (preset, question, answer): its closed-book log-prob and token count."""
    seen, passages = set(), {}
    with open(out, "w") as f:
        for r in rows.itertuples():
            key = (r.preset, r.question_id, r.answer)
            if key in seen:
                continue
            seen.add(key)
            lp, n = closed_logprob(pipe, r.preset, questions[r.question_id], r.answer)
            v = verify_score(pipe, questions[r.question_id], r.answer, passages)
            f.write(json.dumps({"preset": r.preset, "question_id": r.question_id, "answer": r.answer,
                                "closed_logprob": lp, "n": n, "verify": v}) + "\n")
            if len(seen) % 100 == 0:
                print(f"{len(seen)} scored", file=sys.stderr, flush=True)


def with_pmi(rows, scores_path: str):
    """rows with `pmi` and `pmi_mean` added to each answer's signals."""
    import pandas as pd

    from rag_demo.confidence import FLOOR  # as the answer's own log p is clipped

    s = pd.read_json(scores_path, lines=True).set_index(["preset", "question_id", "answer"])
    out = []
    for r in rows.itertuples():
        c = s.loc[(r.preset, r.question_id, r.answer)]
        sig = dict(r.signals)
        pmi = max(sig["logprob"], FLOOR) - max(float(c["closed_logprob"]), FLOOR)
        sig["pmi"], sig["pmi_mean"] = pmi, pmi / max(int(c["n"]), 1)
        sig["verify"] = float(c["verify"])
        out.append(sig)
    return rows.assign(signals=out)


def read(rows) -> None:
    import numpy as np

    from rag_demo.confidence import FEATURES
    from rag_demo.measure.calibration import FEATURE_SETS, auroc

    print("| preset | mode | answerable | right | AUROC log p | AUROC PMI | AUROC pmi_mean | AUROC verify | AUROC new_in_top |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for (preset, mode), part in rows.groupby(["preset", "mode"]):
        a = part[part["answerable"].astype(bool)]
        y = (a["contains"].to_numpy() > 0).astype(int)
        got = [auroc(np.array([s[k] for s in a["signals"]]), y) for k in ("logprob", "pmi", "pmi_mean", "verify", "new_in_top")]
        print(f"| {preset} | {mode} | {len(a)} | {y.mean():.2f} | " + " | ".join(f"{g:.3f}" for g in got) + " |")
    print()
    print("| preset | mode | signals | recall | right flagged | precision | bar holds |")
    print("|---|---|---|---|---|---|---:|")
    for (preset, mode), part in rows.groupby(["preset", "mode"]):
        sets = [tuple(f) for f in FEATURE_SETS[mode]]
        sets += [("logprob", "pmi"), ("logprob", "verify"), ("logprob", "pmi", "verify"),
                 ("logprob", "mean_logprob", "in_passage", "margin", "pmi"),
                 ("logprob", "mean_logprob", "in_passage", "margin", "pmi", "verify"), FEATURES[mode] + ("pmi", "verify")]
        for features in sets:
            s = summary(held_out_halves(part, features, "mix", 0.2, 30))
            cells = " | ".join(f"{s[k][0]:.2f} [{s[k][1]:.2f}-{s[k][2]:.2f}]" for k in BAR)
            name = ", ".join(features) if len(features) < 6 else f"all {len(features)}"
            print(f"| {preset} | {mode} | {name} | {cells} | {s['holds']:.2f} |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="score every answer and write the scores here (JSON Lines), then read them")
    ap.add_argument("--scores", default=str(SCORES), help="read a scoring written by --out (default: the shipped one)")
    ap.add_argument("--tiny", action="store_true", help=TINY_HELP)
    args = ap.parse_args(argv)
    if args.tiny:
        pipe = tiny_pipeline()
        for question, answers in TINY_QA:
            print(question, closed_logprob(pipe, "aided", question, answers[0]), verify_score(pipe, question, answers[0], {}))
        return 0
    rows = load_rows()
    if args.out:
        from rag_demo.measure.sweep import question_id
        from rag_demo.pipeline import RagPipeline
        from rag_demo.questions import load_qa

        questions = {question_id(item): item.question for path in QA for item in load_qa(path)}
        score(RagPipeline.load(), rows, questions, args.out)
    from rag_demo.measure.calibration import passages_again, with_grounding

    rows = with_grounding(rows, **passages_again([str(r) for r in RUNS + [TRAIN_RUN]]))
    read(with_pmi(rows, args.out or args.scores))
    return 0


if __name__ == "__main__":
    sys.exit(main())
