"""Would another rule choose better among the candidates a run already ranked? A simulation.

Every answer of an `eval --out` run keeps the candidates its mode weighed, each with the exact
log p(y|x) of that mode (RAG-Token: the mixture's; RAG-Sequence: the score that chose it). For
the questions whose K passages hold a gold answer ("given retrieval"), this re-chooses among
those saved candidates with three rules and prints EM / contains for each, beside "oracle" (a
candidate contains a gold answer: the most any rule over these candidates can reach):

* length: log p(y|x) / n^alpha, n the answer's tokens plus its end of turn (transformers' beam
  length penalty; alpha 0 is the engine's own choice);
* type: only candidates of the type a wh-word asks for (a digit for when / how many, a
  capitalised name of at most five words for who), when any candidate has it;
* channel: log p(y|x) + lam * log p(question | passage, y), the generator's likelihood of the
  question after the passage and the answer (a noisy-channel reader, Lewis & Fan 2019, "Generative
  Question Answering"), marginalised over the passages with p(z|x) >= 0.05 (`--channel`: loads
  SmolLM2 and scores the top 4 candidates of each answer, ~1 s a question on one thread).

    python experiments/rerank_candidates.py runs/a.json [runs/b.json ...] [--channel]
    python experiments/rerank_candidates.py --tiny --channel     # smoke run on a run it makes

The runs must come from the Vital Articles corpus (the channel rule reads their passages by id).
Analysis only: a rule is kept as a setting only if it helps on every file (experiments/README.md).
"""
from __future__ import annotations

import argparse
import functools
import json
import math
import re
import sys

from _shared import TINY_HELP, temp_path, tiny_corpus, tiny_generator, tiny_run

ROWS = ("sequence|dense", "token|dense")
CHANNEL_SYSTEM = "Write the question that the answer answers, using the passage."
CHANNEL_TOP = 4  # candidates a question scored by the channel rule (the best by log p(y|x))
CHANNEL_MIN_PRIOR = 0.05  # passages the channel reads: those the reader's mixture reads (copy_min_prior)
ALPHAS = (0.0, 0.25, 0.5, 1.0)
LAMBDAS = (0.1, 0.25, 0.5, 1.0)


def given(run: dict, row: str):
    """(question record, answer record) for the answers whose passages hold a gold answer."""
    for q in run["questions"]:
        a = q["answers_by_row"].get(row)
        if a and a["hit"] and a.get("candidates"):
            yield q, a


def wh_type(question: str) -> str | None:
    s = question.lower()
    if re.search(r"\b(when|what year|which year|what date|how many|how much|how old|how long)\b", s):
        return "number"
    if re.search(r"^\s*(who|whom)\b", s):
        return "name"
    return None


def has_type(kind: str, text: str) -> bool:
    t = text.strip().rstrip(".")
    if kind == "number":
        return bool(re.search(r"\d", t))
    return bool(t) and t[0].isupper() and not re.search(r"\d", t) and len(t.split()) <= 5


def score(pairs, choose) -> tuple[float, float, int]:
    from rag_demo.measure.metrics import contains_answer, exact_match

    em = co = n = 0
    for q, a in pairs:
        best = choose(q, a)
        n += 1
        em += exact_match(best, q["answers"])
        co += contains_answer(best, q["answers"])
    return 100 * em / n, 100 * co / n, n


class Channel:
    """log p(question | passage, answer) under the generator, memoised."""

    def __init__(self, gen, passages) -> None:
        self.model, self.tok = gen.model, gen.tokenizer
        self.passages = {p.id: p for p in passages}
        self.end = self.tok.convert_tokens_to_ids("<|im_end|>")
        self.memo: dict = {}

    def logp(self, question: str, pid: str, answer: str) -> float:
        import torch

        key = (question, pid, answer)
        if key not in self.memo:
            doc = self.passages[pid]
            turns = [{"role": "system", "content": CHANNEL_SYSTEM},
                     {"role": "user", "content": f"{doc.title}: {doc.text}\n\nAnswer: {answer}"}]
            prompt = list(self.tok.apply_chat_template(turns, add_generation_prompt=True, tokenize=True,
                                                       return_dict=True)["input_ids"])
            prompt += self.tok("Question:", add_special_tokens=False)["input_ids"]
            target = self.tok(f" {question}", add_special_tokens=False)["input_ids"] + [self.end]
            ids = torch.tensor([prompt + target])  # (1, P + T)
            with torch.inference_mode():
                lp = self.model(ids).logits[0, len(prompt) - 1:-1].float().log_softmax(-1)  # (T, V)
            self.memo[key] = lp.gather(1, torch.tensor(target)[:, None]).sum().item()
        return self.memo[key]

    def marginal(self, q: dict, a: dict, answer: str) -> float:
        """log sum_z p(z|x) p(question | z, answer) over the passages the mixture reads, renormalised."""
        docs = [d for d in a["docs"] if d["prior"] >= CHANNEL_MIN_PRIOR] or a["docs"][:1]
        total = sum(d["prior"] for d in docs)
        terms = [math.log(d["prior"] / total) + self.logp(q["question"], d["id"], answer.rstrip(".")) for d in docs]
        top = max(terms)
        return top + math.log(sum(math.exp(t - top) for t in terms))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 epilog="The rules: see the module's docstring (experiments/README.md has the numbers).")
    ap.add_argument("runs", nargs="*", help="eval --out JSON files (Vital Articles corpus)")
    ap.add_argument("--channel", action="store_true", help="also the noisy-channel rule (runs the generator)")
    ap.add_argument("--tiny", action="store_true", help=TINY_HELP + "; with no run given, re-ranks a tiny run it makes")
    args = ap.parse_args(argv)
    if not args.runs and not args.tiny:
        ap.error("give at least one eval --out JSON file (or --tiny)")
    from rag_demo.measure.metrics import contains_answer

    if args.tiny:
        gen, corpus = tiny_generator(), tiny_corpus()
        runs = args.runs or [str(tiny_run(temp_path("tiny_run.json")))]
    else:
        from rag_demo.models.stack_spec import StackSpec
        from rag_demo.knowledge.corpus import load_vital_articles
        from rag_demo.models.stacks import load_smollm

        gen = load_smollm(StackSpec())  # its tokenizer counts tokens; the channel rule runs its model
        corpus = load_vital_articles(cache_dir=StackSpec().cache_dir) if args.channel else None
        runs = args.runs

    @functools.lru_cache(maxsize=None)
    def length(text: str) -> int:  # the answer's tokens plus its end of turn
        return len(gen.tokenizer(f" {text}", add_special_tokens=False)["input_ids"]) + 1

    channel = Channel(gen, corpus.passages) if args.channel else None
    print("| run | row | rule | n given | EM | contains |\n|---|---|---|---:|---:|---:|")
    for path in runs:
        with open(path, encoding="utf-8") as f:
            run = json.load(f)
        for row in ROWS:
            pairs = list(given(run, row))
            if not pairs:
                continue

            def line(rule, choose):
                em, co, n = score(pairs, choose)
                print(f"| {path} | {row} | {rule} | {n} | {em:.1f} | {co:.1f} |", flush=True)

            line("oracle", lambda q, a: next((c["text"] for c in a["candidates"] if contains_answer(c["text"], q["answers"])),
                                             a["candidates"][0]["text"]))
            for alpha in ALPHAS:
                line(f"length alpha {alpha:g}", lambda q, a, al=alpha: max(
                    a["candidates"], key=lambda c: c["logprob"] / length(c["text"]) ** al)["text"])

            def typed(q, a):
                kind = wh_type(q["question"])
                pool = [c for c in a["candidates"] if kind and has_type(kind, c["text"])] or a["candidates"]
                return max(pool, key=lambda c: c["logprob"])["text"]
            line("type", typed)
            if channel:
                for lam in LAMBDAS:
                    line(f"channel lam {lam:g}", lambda q, a, la=lam: max(
                        sorted(a["candidates"], key=lambda c: -c["logprob"])[:CHANNEL_TOP],
                        key=lambda c: c["logprob"] + la * channel.marginal(q, a, c["text"]))["text"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
