"""Reader variants on BM25's top-K passages, without the dense index (docs/reader_results.md).

Used for #11 when the Vital Articles dense index was not built and could not be built in time
on the shared 2-core machine. p(z|x) = softmax(scale * MiniLM cosine) over the K BM25 passages,
exactly as `eval`'s BM25 rows. Questions: a `sample_items` sample (seed 0) of the external file
and/or the dev set. One JSON line per question is appended to OUT.jsonl as it is answered, so a
run stopped early still leaves its answers; scripts/reader_variants_table.py turns several such
files into the markdown tables of docs/reader_results.md, over the questions all of them answered.

    nice -n 19 python scripts/reader_variants.py --style short --files ext --n-ext 24 --out /tmp/cue_ext.json

`--variant example` adds one made-up worked example (a fictional island) as a chat turn;
`--variant default` is the prompt of rag_demo/generators.py for `--style`.
Prefer `python -m rag_demo eval --sample N --retrievers dense,bm25 --answer-style ...` once the
dense index is cached: it reports the same numbers for both retrievers."""
import argparse
import json
import sys
import time
from pathlib import Path
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1]))
import torch
from rag_demo.models import generators as G
from rag_demo.config import RagSettings, StackSpec
from rag_demo.models.stacks import load_stack
from rag_demo.knowledge.corpus import load_vital_articles
from rag_demo.knowledge.bm25 import BM25Retriever
from rag_demo.measure import evaluate as ev
from rag_demo.pipeline import RagPipeline

ap = argparse.ArgumentParser()
ap.add_argument("--variant", default="default")
ap.add_argument("--style", default="short")
ap.add_argument("--n-ext", type=int, default=80)
ap.add_argument("--n-dev", type=int, default=40)
ap.add_argument("--k", type=int, default=5)
ap.add_argument("--max-doc-tokens", type=int, default=192)
ap.add_argument("--max-new-tokens", type=int, default=32)
ap.add_argument("--scale", type=float, default=20.0)
ap.add_argument("--modes", default="closed-book,sequence,token")
ap.add_argument("--out")
ap.add_argument("--files", default="ext,dev")
a = ap.parse_args()

EXAMPLE_DOC = ("Veltrania", "Veltrania is a fictional island nation in the Coral Sea. Its capital is Port Amsel, "
               "founded in 1812 by the navigator Ilse Marten. The island's main export is vanilla.")
EXAMPLE_Q, EXAMPLE_A = "Who founded the capital of Veltrania?", "Ilse Marten"

orig_messages = G.DecoderOnlyGenerator.messages
def variant_messages(self, question, doc, max_doc_tokens, style="sentence"):
    m = orig_messages(self, question, doc, max_doc_tokens, style)
    v = a.variant
    if doc is None or style != "short":
        if v.startswith("example") and style == "short" and doc is None:
            return [m[0], {"role": "user", "content": f"Question: {EXAMPLE_Q}"}, {"role": "assistant", "content": EXAMPLE_A}, m[1]]
        return m
    text_ids = self.tokenizer(doc.text, add_special_tokens=False)["input_ids"]
    text = doc.text if len(text_ids) <= max_doc_tokens else self.tokenizer.decode(text_ids[:max_doc_tokens])
    if v == "qfirst":
        m[1]["content"] = f"Question: {question}\n\n{doc.title}: {text}\n\nQuestion: {question}"
    elif v == "answerlabel":
        m[1]["content"] = f"{doc.title}: {text}\n\nQuestion: {question}\nShort answer:"
    elif v.startswith("example"):
        ex = [{"role": "user", "content": f"{EXAMPLE_DOC[0]}: {EXAMPLE_DOC[1]}\n\nQuestion: {EXAMPLE_Q}"},
              {"role": "assistant", "content": EXAMPLE_A}]
        m = [m[0], *ex, m[1]]
    return m
G.DecoderOnlyGenerator.messages = variant_messages

spec = StackSpec()
stack = load_stack(spec)
corpus = load_vital_articles()
bm25 = BM25Retriever(corpus)
class FakeIndex:  # what answer_from / _answer read
    def __init__(self, corpus): self.corpus = corpus
    def __len__(self): return len(self.corpus)
pipe = RagPipeline(stack, FakeIndex(corpus))
stack.modes["token"].score_scale  # same object for all modes offline
mm = stack.modes["token"]; mm.score_scale = a.scale

ext = ev.sample_items(ev.load_qa("/work/shared/data/qa_train_vital.jsonl"), a.n_ext, 0) if "ext" in a.files else []
dev = ev.sample_items(ev.load_qa(str(__import__("pathlib").Path(__file__).resolve().parents[1] / "assets/qa_dev.jsonl")), a.n_dev, 0) if "dev" in a.files else []
s = RagSettings(k=a.k, max_doc_tokens=a.max_doc_tokens, max_new_tokens=a.max_new_tokens, answer_style=a.style)
modes = a.modes.split(",")
recs = []
t0 = time.time()
done_qs = set()
if Path(a.out + ".jsonl").is_file():  # resume: questions already answered in OUT.jsonl are skipped
    done_qs = {json.loads(line)["question"] for line in open(a.out + ".jsonl")}
for fname, items in (("ext", ext), ("dev", dev)):
    for it in items:
        q = it.question
        if q in done_qs:
            continue
        _, ps = bm25.search([q], a.k); ps = ps[0]
        qv = mm.question_encoder.encode_questions([q])
        pv = stack.ctx_encoder.encode_passages(ps) if hasattr(stack.ctx_encoder, "encode_passages") else None
        scores = torch.from_numpy((pv @ qv[0]).astype("float32"))
        hit = ev.reader_hit(ps, it.answers)
        rec = {"file": fname, "question": q, "answers": it.answers, "source": it.meta.get("source"), "hit": hit, "rows": {}}
        for mode in modes:
            ans = pipe.answer(q, "closed-book", s) if mode == "closed-book" else pipe.answer_from(q, mode, ps, scores, s)
            rec["rows"][mode] = {"text": ans.text, "em": ev.exact_match(ans.text, it.answers), "f1": ev.f1_score(ans.text, it.answers),
                                 "contains": ev.contains_answer(ans.text, it.answers), "hit": hit, "n_tokens": len(ans.token_ids),
                                 "docs": [d.title for d in ans.docs], "post": ans.doc_posterior, "cands": ans.candidates}
        recs.append(rec)
        with open(a.out + ".jsonl", "a") as fh:
            fh.write(json.dumps(rec) + "\n")
        print(f"{len(recs)} {time.time()-t0:.0f}s " + " | ".join(f"{m}: {x['text'][:40]!r} {x['contains']:.0f}" for m, x in rec["rows"].items()) + f" hit={hit} gold={it.answers[:2]}", file=sys.stderr, flush=True)
    print(f"{fname} done {time.time()-t0:.0f}s", file=sys.stderr, flush=True)
# prompt length
g = mm.generator
plen = sum(len(g.prompt(r["question"], p, a.max_doc_tokens, a.style)) for r in recs[:10] for p in bm25.search([r["question"]], a.k)[1][0]) / (10 * a.k)
out = {"args": vars(a), "prompt_tokens_mean": plen, "summary": {}}
for fname in ("ext", "dev"):
    for mode in modes:
        res = [r["rows"][mode] for r in recs if r["file"] == fname]
        if not res: continue
        out["summary"][f"{fname}|{mode}"] = {"all": ev.answer_scores(res), "given": ev.given_retrieval(res),
                                             "tokens": sum(x["n_tokens"] for x in res) / len(res)}
out["records"] = recs
json.dump(out, open(a.out, "w"), indent=1)
print(f"variant={a.variant} style={a.style} mdt={a.max_doc_tokens} scale={a.scale} k={a.k} prompt_tokens={plen:.0f} time={time.time()-t0:.0f}s")
for key, v in out["summary"].items():
    al, gv = v["all"], v["given"]
    print(f"{key:18s} n={al['n']:3d} EM {100*al['em']:5.1f} F1 {100*al['f1']:5.1f} C {100*al['contains']:5.1f} | given n={gv['n']:3d} EM {100*gv['em']:5.1f} F1 {100*gv['f1']:5.1f} C {100*gv['contains']:5.1f} | tok {v['tokens']:.1f}")
