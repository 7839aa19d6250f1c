"""Markdown tables from scripts/reader_variants.py's per-question JSONL files, over the questions
every file has: python scripts/reader_variants_table.py LABEL=FILE.jsonl ... (a label ending in
'*' also gets RAG-Token and closed-book re-scored with the text cut at the first '. ' (and ','),
which is what greedy decoding with those stop tokens would give; not RAG-Sequence, whose
rescoring would change)."""
import json, sys, re
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1]))
from rag_demo.measure import evaluate as ev
def cut(text, how):
    if how == "as generated": return text
    t = text.split("\n")[0]
    m = re.search(r"\.(\s|$)", t); t = t[:m.start()] if m else t
    if "comma" in how: t = t.split(",")[0]
    return t
files = [a.split("=") for a in sys.argv[1:]]  # label=path
data, common = {}, None
for label, f in files:
    data[label] = {r["question"]: r for r in map(json.loads, open(f))}
    common = set(data[label]) if common is None else common & set(data[label])
print(f"Questions every variant answered: {len(common)}\n")
print("| variant | file | mode | n | EM | F1 | contains | n given | EM | F1 | contains | tokens/answer |")
print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for label, _ in files:
    for how in (["as generated", "cut at '. '", "cut at '. ' or ','"] if label.endswith("*") else ["as generated"]):
        for fname in ("ext", "dev"):
            qs = [data[label][q] for q in sorted(common) if data[label][q]["file"] == fname]
            if not qs: continue
            for mode in ("closed-book", "sequence", "token"):
                if how != "as generated" and mode == "sequence": continue  # not exact for RAG-Sequence
                res = []
                for r in qs:
                    x = r["rows"][mode]; t = cut(x["text"], how)
                    res.append({"em": ev.exact_match(t, r["answers"]), "f1": ev.f1_score(t, r["answers"]),
                                "contains": ev.contains_answer(t, r["answers"]), "hit": r["hit"], "tok": x["n_tokens"]})
                al, gv = ev.answer_scores(res), ev.given_retrieval(res)
                p = lambda v: "-" if v != v else f"{100*v:.1f}"
                name = label.rstrip("*") + ("" if how == "as generated" else f" ({how}, simulated)")
                print(f"| {name} | {fname} | {mode} | {al['n']} | {p(al['em'])} | {p(al['f1'])} | {p(al['contains'])} | {gv['n']} | {p(gv['em'])} | {p(gv['f1'])} | {p(gv['contains'])} | {sum(x['tok'] for x in res)/len(res):.1f} |")
