"""Search error or model error? RAG-Token's misses, each gold answer scored by the model itself.

For every question of an `eval --out` run whose RAG-Token answer (dense passages) missed while
its passages held a gold answer, the question is answered again with the run's settings and,
where RAG-Token ranks its candidates (the token_drafts aid: rag_demo.reader.drafts.rank_by_rag_token),
each gold answer written as a short answer (" Gold.") is scored too, by the exact RAG-Token
log p(y|x) under all K passages. A gold answer that scores above the chosen one is a search error
(the model prefers it, its candidates did not hold it); below, the model itself prefers its wrong
answer.

    python experiments/token_misses.py runs/a.json          # the run's stack: offline, Vital Articles
    python experiments/token_misses.py --tiny               # smoke run on a run it makes

Prints one JSON line a miss, then the counts. Analysis only: it reads the gold answers, so
nothing it finds may be used on single questions.
"""
from __future__ import annotations

import argparse
import json
import sys

from _shared import TINY_HELP, temp_path, tiny_pipeline, tiny_run


def run_settings(run: dict):
    """The RagSettings the run recorded (knobs it does not name take their preset's value)."""
    from rag_demo.config import KNOBS, RagSettings

    s = run.get("settings", {})
    return RagSettings(preset=s.get("preset", "aided"), **{k: v for k, v in s.items() if k in KNOBS})


def misses(pipe, run: dict, settings, limit: int | None = None) -> list[dict]:
    """One row per RAG-Token miss given retrieval that was ranked again (see the module's docstring)."""
    import rag_demo.reader.drafts as drafts
    from rag_demo.measure.metrics import has_answer
    from rag_demo.rag.decoding import score_candidates
    from rag_demo.rag.marginalize import rag_token_logprob

    gen = pipe.stack.modes["token"].generator
    seen: dict = {}
    rank = drafts.rank_by_rag_token

    def scored_rank(gen_, state0, first_lp, cands, prior, stop=None):
        golds = [gen.title_answer_ids(g) for g in seen["golds"]]
        every = cands + golds
        lp, _ = score_candidates(gen_, state0, first_lp, every, gen_.pad_token_id)  # (K, C, T)
        seen["scores"] = [float(rag_token_logprob(lp[:, c, : len(t)], prior)) if t else float("-inf")
                          for c, t in enumerate(every)]
        seen["texts"], seen["n"] = [gen.decode(t) for t in every], len(cands)
        return rank(gen_, state0, first_lp, cands, prior, stop)

    rows: list[dict] = []
    drafts.rank_by_rag_token = scored_rank
    try:
        for q in run["questions"]:
            a = q["answers_by_row"].get("token|dense")
            if a is None or not a.get("hit") or a["contains"]:
                continue
            if limit is not None and len(rows) >= limit:
                break
            seen.clear()
            seen["golds"] = q["answers"]
            pipe.answer(q["question"], "token", settings)
            if "scores" not in seen:  # the drafts were cut short, or token_drafts is off: no ranking
                continue
            sc, n, texts = seen["scores"], seen["n"], seen["texts"]
            best = max(range(n), key=lambda c: sc[c])
            gold = max(range(n, len(sc)), key=lambda c: sc[c])
            row = dict(question=q["question"], chosen=texts[best], chosen_lp=round(sc[best], 3), gold=texts[gold],
                       gold_lp=round(sc[gold], 3),
                       gold_in_candidates=any(has_answer(texts[c], q["answers"]) for c in range(n)))
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:
        drafts.rank_by_rag_token = rank
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run", nargs="?", help="an eval --out JSON file (offline stack, Vital Articles)")
    ap.add_argument("--limit", type=int, help="stop after this many misses")
    ap.add_argument("--tiny", action="store_true", help=TINY_HELP + "; with no run given, a tiny run it makes")
    args = ap.parse_args(argv)
    if not args.run and not args.tiny:
        ap.error("give an eval --out JSON file (or --tiny)")
    path = args.run or str(tiny_run(temp_path("tiny_run.json"), modes=("token",)))
    with open(path, encoding="utf-8") as f:
        run = json.load(f)
    settings = run_settings(run)
    if not settings.aids.token_drafts:
        print("note: the run's settings have token_drafts off, so RAG-Token ranks no candidates; "
              "it is turned on here", file=sys.stderr)
        settings = settings.merged(token_drafts=True)
    if args.tiny:
        pipe = tiny_pipeline()
    else:
        from rag_demo.pipeline import RagPipeline

        pipe = RagPipeline.load()
    rows = misses(pipe, run, settings, args.limit)
    above = [r for r in rows if r["gold_lp"] > r["chosen_lp"]]
    print(f"{len(rows)} misses ranked; a gold answer scores above the chosen one in {len(above)} "
          f"({sum(r['gold_in_candidates'] for r in above)} of them among the candidates); "
          f"a gold answer among the candidates in {sum(r['gold_in_candidates'] for r in rows)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
