"""Command line: `python -m rag_demo ask|index ...`.

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

from .config import ANSWER_STYLES, GENERATOR_DTYPES, INDEX_KINDS, QUESTION_POSITIONS, READER_FIELDS, check_mode, check_question, MAX_BEAMS, MAX_K, MAX_NEW_TOKENS, MAX_ECHO_RETRIES, MAX_CONTEXT_CONTRAST, MAX_LENGTH_PENALTY, MAX_WORKED_EXAMPLES, MODES, SEQUENCE_DECODINGS, STACKS, RagSettings, StackSpec

EXAMPLE = "Who painted A Sunday Afternoon on the Island of La Grande Jatte?"


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
                 "index_rerank"):
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
        from .corpus import load_documents

        return load_documents(args.corpus_file)
    if name == "factbook":
        from .factbook import load_factbook

        return load_factbook(cache_dir=_spec(args).cache_dir)
    return None


def _knowledge(args):
    """The knowledge dataset given with --knowledge-dataset/--knowledge-index (read before any
    model loads, so a bad one fails at once), or None."""
    from .knowledge import knowledge_paths, load_knowledge

    paths = knowledge_paths(getattr(args, "knowledge_dataset", None), getattr(args, "knowledge_index", None))
    if paths is None:
        return None
    if getattr(args, "corpus_file", None):
        raise ValueError("--corpus-file and --knowledge-dataset both give the passages: use one of them.")
    return load_knowledge(*paths, say=_progress)


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--stack", default="offline", help=f"one of {', '.join(STACKS)} (default: offline)")
    p.add_argument("--cache-dir", help="index cache folder (default: $RAG_DEMO_CACHE or the user cache dir)")
    p.add_argument("--rag-token", help="paper stack: RAG-Token checkpoint (Hub id or folder)")
    p.add_argument("--rag-sequence", help="paper stack: RAG-Sequence checkpoint (Hub id or folder)")
    p.add_argument("--ctx-encoder", help="paper stack: DPR context encoder (Hub id or folder)")
    p.add_argument("--generator-dtype", help=f"offline generator weights: {', '.join(GENERATOR_DTYPES)} (default auto: "
                   "bfloat16 where the CPU has native bfloat16, else float32)")
    p.add_argument("--passage-dtype", help=f"passage embeddings (index builds): {', '.join(GENERATOR_DTYPES)} (default "
                   "auto: bfloat16 autocast where the CPU has native bfloat16, else float32; questions are float32)")
    p.add_argument("--rebuild-index", action="store_true", help="ignore the cached index and rebuild it")
    p.add_argument("--index-kind", default=StackSpec.index_kind, help=f"{', '.join(INDEX_KINDS)} (default auto: exact "
                   "flat while the vectors fit in 2 GB, else the compressed ivfpq; rag_demo/ann.py)")
    p.add_argument("--index-rerank", type=int, default=StackSpec.index_rerank,
                   help="ivfpq: re-score the top N x k hits exactly (0: off; default 40)")
    p.add_argument("--corpus", default="vital", help=f"built-in corpus: {' or '.join(CORPORA)} (vital: Wikipedia "
                   "Vital Articles, the default; factbook: the CIA World Factbook)")
    p.add_argument("--corpus-file", action="append", help="use these documents (.txt/.md/.csv/.jsonl/.pdf) "
                   "instead of a built-in corpus; repeatable")


def _add_knowledge(p: argparse.ArgumentParser) -> None:
    """A knowledge dataset in transformers' RAG format as the passages (rag_demo/knowledge.py)."""
    p.add_argument("--knowledge-dataset", help="use this knowledge dataset (a datasets save_to_disk folder with "
                   "title, text, embeddings: transformers' RAG format) with its stored vectors; needs --knowledge-index")
    p.add_argument("--knowledge-index", help="the FAISS index file of --knowledge-dataset "
                   "(dataset.get_index('embeddings').save(path))")


def _switch(p: argparse.ArgumentParser, flag: str, default: bool, help: str) -> None:
    """A true / false reader setting; its help ends with the default."""
    p.add_argument(flag, default=str(default).lower(), choices=("true", "false"), help=f"{help}default {str(default).lower()}")


def _add_reader_settings(p: argparse.ArgumentParser) -> None:
    """The reader's RagSettings (#11), each defaulting to RagSettings' own default."""
    d = RagSettings()
    p.add_argument("--answer-style", default=d.answer_style,
                   help=f"{' or '.join(ANSWER_STYLES)}: a phrase of a few words, stopped at the end of the line, or a "
                   f"full sentence (default {d.answer_style})")
    p.add_argument("--prior-temperature", type=float, default=d.prior_temperature,
                   help=f"p(z|x) = softmax((scores + W * log p_G(question | passage)) / T): above 1 flatter, below 1 sharper (default {d.prior_temperature:g})")
    p.add_argument("--worked-examples", type=int, default=d.worked_examples,
                   help="how many worked examples (invented passages, answered in the answer style) come before "
                   f"the question, 0-{MAX_WORKED_EXAMPLES} (default {d.worked_examples})")
    p.add_argument("--question-weight", type=float, default=d.question_weight,
                   help="p(z|x) = softmax((scores + W * log p_G(question | passage)) / T): the generator's vote on which "
                   f"passage to read, 0 = the retriever alone (default {d.question_weight:g})")
    p.add_argument("--question-position", default=d.question_position,
                   help=f"{' or '.join(QUESTION_POSITIONS)}: the question after the passage, or before and after "
                   f"(default {d.question_position})")
    p.add_argument("--passage-sentences", type=int, default=d.passage_sentences,
                   help="feed the generator only each passage's N sentences closest to the question; 0 = the "
                   f"whole passage (default {d.passage_sentences})")
    _switch(p, "--extractive", d.extractive,
            "true: answers copy a span of the passages (decoding may only continue one); ")
    p.add_argument("--copy-min-prior", type=float, default=d.copy_min_prior,
                   help="RAG-Token's extractive copies come only from passages with p(z|x) at least this (the most "
                   f"likely always), 0-1; 0 = any of the K (default {d.copy_min_prior:g})")
    p.add_argument("--echo-retries", type=int, default=d.echo_retries,
                   help="an answer that only repeats words of the question is decoded again with its first token "
                   f"banned, up to N times, 0-{MAX_ECHO_RETRIES}; 0 = keep it (default {d.echo_retries})")
    _switch(p, "--echo-subjects", d.echo_subjects,
            "true: an answer that opens by naming what the question is about (a retrieved passage's "
            "title the question names) is retried like an echo; ")
    _switch(p, "--recase-question", d.recase_question,
            "true: a question typed in lower case reaches the generator cased as the retrieved passages "
            "write its words; ")
    _switch(p, "--token-drafts", d.token_drafts,
            "true: RAG-Token also ranks each passage's own drafts by its exact log p(y|x), not only its beams; ")
    _switch(p, "--title-candidates", d.title_candidates,
            "true: with short answers each passage's title also competes as an answer of its doc; ")
    p.add_argument("--context-contrast", type=float, default=d.context_contrast,
                   help="context-aware decoding: choose each token by (1+A) log p(with passages) - A log p(without), "
                   f"0-{MAX_CONTEXT_CONTRAST:g}; 0 = off (default {d.context_contrast:g})")
    p.add_argument("--length-penalty", type=float, default=d.length_penalty,
                   help="beam search ranks finished answers by summed log-prob / length^L, 0-"
                   f"{MAX_LENGTH_PENALTY:g}; 0 = the summed log-prob (default {d.length_penalty:g})")
    p.add_argument("--max-doc-tokens", type=int, default=d.max_doc_tokens,
                   help=f"passage tokens fed to the generator per doc, 16-1024 (default {d.max_doc_tokens})")


def _add_decoding(p: argparse.ArgumentParser) -> None:
    p.add_argument("--decoding", default=RagSettings.sequence_decoding,
                   help=f"RAG-Sequence decoding: {' or '.join(SEQUENCE_DECODINGS)} (default {RagSettings.sequence_decoding})")


def reader_settings(args) -> dict:
    """The reader settings of parsed arguments, as RagSettings keyword arguments."""
    return {name: getattr(args, name) for name in READER_FIELDS}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m rag_demo", description="Retrieval-Augmented Generation demo")
    sub = parser.add_subparsers(dest="command", required=True)
    ask = sub.add_parser("ask", help="answer a question")
    ask.add_argument("question", nargs="?", default=EXAMPLE)
    ask.add_argument("--mode", default="all", help=f"one of {', '.join(MODES)}, or all (default)")
    ask.add_argument("--k", type=int, default=RagSettings.k, help=f"passages to retrieve, 1-{MAX_K} (default 5)")
    ask.add_argument("--beams", type=int, default=RagSettings.num_beams, help=f"beam size, 1 (greedy) to {MAX_BEAMS}")
    ask.add_argument("--max-new-tokens", type=int, default=RagSettings.max_new_tokens, help=f"1-{MAX_NEW_TOKENS}")
    _add_decoding(ask)
    ask.add_argument("--json", action="store_true", help="print the Answer(s) as JSON")
    _add_reader_settings(ask)
    _add_common(ask)
    _add_knowledge(ask)
    index = sub.add_parser("index", help="build (or load) the index of a built-in corpus (--corpus)")
    index.add_argument("--export", metavar="DIR", help="also write corpus, vectors and FAISS index in transformers' "
                       "RAG format: DIR/hf_dataset (save_to_disk) and DIR/hf_dataset_index.faiss")
    _add_common(index)
    _add_knowledge(index)
    ev = sub.add_parser("eval", help="score retrieval (recall@1/5/20) and answers (EM, F1) on a QA file")
    ev.add_argument("--qa", default="assets/qa_dev.jsonl", help='JSONL, one {"question": ..., "answers": [...]} per line')
    ev.add_argument("--modes", default="closed-book,sequence,token", help="comma-separated modes (default: all three)")
    ev.add_argument("--retrievers", default="dense,bm25", help="whose passages the RAG modes read: dense, bm25 or both")
    ev.add_argument("--k", type=int, default=RagSettings.k, help=f"passages per answer, 1-{MAX_K} (default 5)")
    ev.add_argument("--limit", type=int, help="evaluate only the first N questions")
    ev.add_argument("--sample", type=int, help="evaluate a random sample of N questions (deterministic: see --seed)")
    ev.add_argument("--seed", type=int, default=0, help="random seed of --sample (default 0)")
    ev.add_argument("--labels", help='JSONL of {"id", "answerable"}: evaluate only the questions labelled answerable '
                    "(applied before --sample)")
    ev.add_argument("--beams", type=int, default=RagSettings.num_beams, help=f"beam size, 1 (greedy) to {MAX_BEAMS}")
    ev.add_argument("--max-new-tokens", type=int, default=RagSettings.max_new_tokens, help="default 32")
    _add_decoding(ev)
    ev.add_argument("--out", default="artifacts/eval.json", help="where to save the JSON report")
    _add_reader_settings(ev)
    _add_common(ev)
    _add_knowledge(ev)
    be = sub.add_parser("bench", help="latency per stage, memory, index throughput, cold start, reference ratios")
    be.add_argument("--n", type=int, default=20, help="questions per mode (default 20)")
    be.add_argument("--qa", default="assets/qa_dev.jsonl", help="questions are taken from this QA file")
    be.add_argument("--modes", default="token,sequence,closed-book", help="comma-separated modes")
    be.add_argument("--skip-cold-build", action="store_true", help="skip cold start without a cached index (~3-5 min)")
    be.add_argument("--skip-reference", action="store_true", help="skip the comparison with transformers' RAG classes")
    be.add_argument("--reference-n", type=int, default=5, help="questions for the reference comparison (default 5)")
    _add_decoding(be)
    be.add_argument("--out", default="artifacts/bench.json", help="where to save the JSON results")
    be.add_argument("--scale", action="store_true", help="instead: the index kinds (flat, hnsw, ivfpq, ivfpq + re-rank) "
                    "on synthetic vectors around the real ones, and their RAM projected to wiki_dpr's 21M passages")
    be.add_argument("--scale-n", type=int, default=1_000_000, help="vectors for --scale (default 1,000,000)")
    be.add_argument("--scale-dims", default="384,768", help="comma-separated vector widths for --scale (default 384,768)")
    _add_reader_settings(be)
    _add_common(be)
    return parser


def format_answer(a) -> str:
    """Human-readable rendering: answer, passages, attribution table."""
    from .pipeline import MODE_TITLES

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
    from .pipeline import RagPipeline

    modes = ["sequence", "token", "closed-book"] if args.mode == "all" else [check_mode(args.mode)]
    check_question(args.question)  # fail before loading models, not after
    settings = RagSettings(k=args.k, num_beams=args.beams, max_new_tokens=args.max_new_tokens,
                           sequence_decoding=args.decoding, **reader_settings(args))
    spec, corpus = _spec(args), _corpus(args)
    t0 = time.perf_counter()
    knowledge = _knowledge(args)
    pipe = RagPipeline.load(spec, corpus=corpus, settings=settings, progress=_load_progress, rebuild_index=args.rebuild_index,
                            knowledge=knowledge)
    _progress(f"Ready in {time.perf_counter() - t0:.1f} s ({pipe.stack.describe()})")
    answers = pipe.answer_modes(args.question, modes)
    if args.json:
        print(json.dumps({m: a.to_dict() for m, a in answers.items()}, indent=2, ensure_ascii=False))
    else:
        print(f"Question: {args.question}\nCorpus: {pipe.index.corpus.name}\n")
        print("\n\n".join(format_answer(a) for a in answers.values()))
    return 0


def cmd_index(args) -> int:
    from .pipeline import RagPipeline

    from .knowledge import check_export_dir, export_knowledge

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
    from .evaluate import (evaluate, format_report, keep_answerable, parse_modes, parse_retrievers, read_qa, sample_items,
                           save_report)
    from .pipeline import RagPipeline

    if args.limit is not None and args.sample is not None:
        raise ValueError("--limit and --sample both choose questions: pass one of them.")
    qa = read_qa(args.qa, args.limit)
    items = qa.items if args.labels is None else keep_answerable(qa.items, args.labels)
    items = items if args.sample is None else sample_items(items, args.sample, args.seed)
    modes, retrievers = parse_modes(args.modes), parse_retrievers(args.retrievers)
    settings = RagSettings(k=args.k, num_beams=args.beams, max_new_tokens=args.max_new_tokens,
                           sequence_decoding=args.decoding, **reader_settings(args))
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


def cmd_bench(args) -> int:
    if args.scale:
        from .scale import run_scale

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
    from .bench import run_bench

    return run_bench(args, _spec(args), _progress)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return {"ask": cmd_ask, "index": cmd_index, "eval": cmd_eval, "bench": cmd_bench}[args.command](args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
