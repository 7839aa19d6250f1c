"""Reader variants on BM25's top-K passages, without the dense index (experiments/README.md, 2026-11-22).

Made for #11 when the Vital Articles dense index was not built and could not be built in time on
a shared 2-core machine. p(z|x) = softmax(scale * MiniLM cosine) over the K BM25 passages, the
passages embedded on the fly (as `eval`'s BM25 rows score them, without needing the index).
Questions: a `sample_items` sample (--seed) of the external file and/or the dev set. One JSON
line per question is appended to OUT.jsonl (OUT with the suffix .jsonl) as it is answered, so a
run stopped early still leaves its answers and a rerun resumes; experiments/reader_variants_table.py
turns several such files into markdown tables over the questions all of them answered; OUT gets
the summary and every record.

    python experiments/reader_variants.py --style short --variant answerlabel --files ext --n-ext 24 --out runs/label.json
    python experiments/reader_variants.py --tiny --n-ext 2 --files ext --out /tmp/tiny.json   # smoke run

Variants (on top of --preset; the paper preset, the default here, has every reader aid off):
  default      the preset's prompt for --style
  qfirst       the question before the passage as well as after it (the question_position=both knob)
  example      one worked example as earlier chat turns (the worked_examples=1 knob)
  answerlabel  short style: each user turn with a passage ends "\\nShort answer:" (no knob: a wrapper)

Prefer `python -m rag_demo eval --sample N --retrievers dense,bm25 ...` once the dense index is
cached: it reports the same numbers for both retrievers, for every knob.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import inspect
import json
import sys
import time
from pathlib import Path

from _shared import DEV_QA, EXTERNAL_QA, TINY_HELP, TINY_KNOBS, tiny_corpus, tiny_items, tiny_stack

VARIANTS = {"default": {}, "qfirst": {"question_position": "both"}, "example": {"worked_examples": 1},
            "answerlabel": {}}
ANSWER_LABEL = "\nShort answer:"


class PassagesOnly:
    """What answering from given passages reads of an index: its corpus and its size (no vectors)."""

    def __init__(self, corpus) -> None:
        self.corpus = corpus

    def __len__(self) -> int:
        return len(self.corpus)


@contextlib.contextmanager
def answer_label(on: bool):
    """While active (and `on`), the decoder-only generator's short-style user turns that hold a
    passage end with ANSWER_LABEL (its prompt format's `messages`, models/chat_format.py); the
    original `messages` is put back afterwards."""
    from rag_demo.models.chat_format import ChatFormat as G

    if not on:
        yield
        return
    original = G.messages
    signature = inspect.signature(original)

    def labelled(self, *args, **kwargs):
        turns = original(self, *args, **kwargs)
        call = signature.bind(self, *args, **kwargs)
        call.apply_defaults()
        if call.arguments["doc"] is not None and call.arguments["style"] == "short":
            turns = [{**t, "content": t["content"] + ANSWER_LABEL} if t["role"] == "user" else t for t in turns]
        return turns

    G.messages = labelled
    try:
        yield
    finally:
        G.messages = original


def with_scale(stack, scale: float | None):
    """The stack with every mode's retrieval score scale set to `scale` (None: unchanged)."""
    if scale is None:
        return stack
    copies: dict[int, object] = {}
    modes = {m: copies.setdefault(id(mm), dataclasses.replace(mm, score_scale=scale)) for m, mm in stack.modes.items()}
    return dataclasses.replace(stack, modes=modes)


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 epilog="Variants: see the module's docstring.")
    ap.add_argument("--variant", default="default", choices=sorted(VARIANTS))
    ap.add_argument("--preset", default="paper", choices=("paper", "aided"), help="the settings' preset (default paper)")
    ap.add_argument("--style", default="short", choices=("short", "sentence"), help="answer_style (default short)")
    ap.add_argument("--files", default="ext,dev", help="which question files: ext, dev or ext,dev (default)")
    ap.add_argument("--qa-ext", default=str(EXTERNAL_QA), help="the external questions (default: %(default)s)")
    ap.add_argument("--qa-dev", default=str(DEV_QA), help="the dev set (default: %(default)s)")
    ap.add_argument("--n-ext", type=int, default=80, help="external questions sampled (default 80)")
    ap.add_argument("--n-dev", type=int, default=40, help="dev questions sampled (default 40)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--k", type=int, default=5)
    ap.add_argument("--max-doc-tokens", type=int, default=192)
    ap.add_argument("--max-new-tokens", type=int, help="default 32 (with --tiny: 4)")
    ap.add_argument("--scale", type=float, help="retrieval score scale before the softmax (default: the stack's, 20)")
    ap.add_argument("--modes", default="closed-book,sequence,token")
    ap.add_argument("--out", required=True, help="the summary JSON; answers go to OUT.jsonl as they come")
    ap.add_argument("--tiny", action="store_true", help=TINY_HELP + "; the questions are 3 about those passages")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    import torch

    from rag_demo.config import RagSettings
    from rag_demo.knowledge.bm25 import BM25Retriever
    from rag_demo.measure import evaluate as ev
    from rag_demo.pipeline import RagPipeline
    from rag_demo.reader.aided import prompt

    files = a.files.split(",")
    if a.max_new_tokens is None:
        a.max_new_tokens = TINY_KNOBS["max_new_tokens"] if a.tiny else 32
    if a.tiny:
        stack, corpus = tiny_stack(), tiny_corpus()
        items = {"ext": tiny_items(a.n_ext), "dev": tiny_items(a.n_dev)}
    else:
        from rag_demo.models.stack_spec import StackSpec
        from rag_demo.knowledge.corpus import load_vital_articles
        from rag_demo.models.stacks import load_stack

        spec = StackSpec()
        stack, corpus = load_stack(spec), load_vital_articles(cache_dir=spec.cache_dir)
        items = {"ext": ev.sample_items(ev.load_qa(a.qa_ext), a.n_ext, a.seed) if "ext" in files else [],
                 "dev": ev.sample_items(ev.load_qa(a.qa_dev), a.n_dev, a.seed) if "dev" in files else []}
    stack = with_scale(stack, a.scale)
    bm25 = BM25Retriever(corpus)
    pipe = RagPipeline(stack, PassagesOnly(corpus))  # type: ignore[arg-type]
    mm = stack.modes["token"]
    s = RagSettings(preset=a.preset, k=a.k, max_doc_tokens=a.max_doc_tokens, max_new_tokens=a.max_new_tokens,
                    answer_style=a.style, **VARIANTS[a.variant])
    modes = a.modes.split(",")
    rag_modes = [m for m in modes if m != "closed-book"]
    out, lines = Path(a.out), Path(a.out).with_suffix(".jsonl")
    out.parent.mkdir(parents=True, exist_ok=True)
    done = set()
    if lines.is_file():  # resume: questions already answered in OUT.jsonl are skipped
        with open(lines, encoding="utf-8") as fh:
            done = {(r.get("file"), r["question"]) for r in map(json.loads, fh)}
    recs = []
    t0 = time.time()
    with answer_label(a.variant == "answerlabel"):
        for fname in ("ext", "dev"):
            for it in items[fname] if fname in files else []:
                q = it.question
                if (fname, q) in done:
                    continue
                _, ps = bm25.search([q], a.k)
                ps = ps[0]
                qv = mm.question_encoder.encode_questions([q])  # (1, D)
                pv = stack.ctx_encoder.encode_passages(ps, show_bar=False)  # (K, D)
                scores = torch.from_numpy((pv @ qv[0]).astype("float32"))  # (K,)
                hit = ev.reader_hit(ps, it.answers)
                gen = mm.generator
                rec = {"file": fname, "question": q, "answers": it.answers, "source": it.meta.get("source"), "hit": hit,
                       "prompt_tokens": sum(len(prompt(gen, q, p, s.decoding, s.aids)) for p in ps) / len(ps),
                       "rows": {}}
                answers = pipe.answer_from_modes(q, rag_modes, ps, scores, s) if rag_modes else {}
                if "closed-book" in modes:
                    answers["closed-book"] = pipe.answer(q, "closed-book", s)
                for mode in modes:
                    ans = answers[mode]
                    rec["rows"][mode] = {"text": ans.text, "em": ev.exact_match(ans.text, it.answers),
                                         "f1": ev.f1_score(ans.text, it.answers),
                                         "contains": ev.contains_answer(ans.text, it.answers), "hit": hit,
                                         "n_tokens": len(ans.token_ids), "docs": [d.title for d in ans.docs],
                                         "post": ans.doc_posterior, "cands": ans.candidates}
                recs.append(rec)
                with open(lines, "a", encoding="utf-8") as fh:
                    fh.write(json.dumps(rec) + "\n")
                print(f"{len(recs)} {time.time() - t0:.0f}s "
                      + " | ".join(f"{m}: {x['text'][:40]!r} {x['contains']:.0f}" for m, x in rec["rows"].items())
                      + f" hit={hit} gold={it.answers[:2]}", file=sys.stderr, flush=True)
            if fname in files:
                print(f"{fname} done {time.time() - t0:.0f}s", file=sys.stderr, flush=True)
    plen = sum(r["prompt_tokens"] for r in recs) / len(recs) if recs else float("nan")
    summary = {}
    for fname in ("ext", "dev"):
        for mode in modes:
            res = [r["rows"][mode] for r in recs if r["file"] == fname]
            if res:
                summary[f"{fname}|{mode}"] = {"all": ev.answer_scores(res), "given": ev.given_retrieval(res),
                                              "tokens": sum(x["n_tokens"] for x in res) / len(res)}
    out.write_text(json.dumps({"args": vars(a), "settings": s.to_dict(), "prompt_tokens_mean": plen,
                               "summary": summary, "records": recs}, indent=1), encoding="utf-8")
    print(f"variant={a.variant} preset={a.preset} style={a.style} mdt={a.max_doc_tokens} scale={a.scale or mm.score_scale} "
          f"k={a.k} prompt_tokens={plen:.0f} time={time.time() - t0:.0f}s (this run's {len(recs)} questions)")
    for key, v in summary.items():
        al, gv = v["all"], v["given"]
        print(f"{key:18s} n={al['n']:3d} EM {100 * al['em']:5.1f} F1 {100 * al['f1']:5.1f} C {100 * al['contains']:5.1f} "
              f"| given n={gv['n']:3d} EM {100 * gv['em']:5.1f} F1 {100 * gv['f1']:5.1f} C {100 * gv['contains']:5.1f} "
              f"| tok {v['tokens']:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
