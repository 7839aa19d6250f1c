"""`python app.py`: serve the RAG teaching demo (rag_demo/web/) on http://localhost:7860.

The page is served at once; the models and the index load (and warm up) in the background while
the page shows their progress. Options: --stack offline|paper, --corpus-file FILE (serve your own
documents instead of Wikipedia Vital Articles; tests use it to start fast), --knowledge-dataset DIR
--knowledge-index FILE (a knowledge dataset in transformers' RAG format, its stored vectors used as
they are: rag_demo/knowledge/hf_format.py), --generator-dtype auto|float32|bfloat16, --port, --host.
When the corpus's dense index is not cached (a first start), the page answers at once with BM25's
passages, each card saying so, while the dense index is built in the background; answers switch to
it when it is complete (docs/DESIGN.md §6b). RAG_DEMO_TEST_EMBED_GATE (a file path) holds that
build until the file exists, for tests only.
The page's corpus dropdown also offers the CIA World Factbook (its index is built by the first
session that picks it, then cached on disk and shared).

Serving limits (rag_demo.serving.budget.Budget; each flag also reads an environment variable, and
defaults to the library's value, sized for a 16 GB, 2-vCPU Space):

  --max-seconds S        RAG_DEMO_MAX_SECONDS       refuse a question estimated to take longer
  --max-request-gb G     RAG_DEMO_MAX_REQUEST_GB    refuse a question estimated to need more extra memory
  --time-limit S         RAG_DEMO_TIME_LIMIT        stop decoding after S seconds (partial answers say so)
  --heavy-seconds S      RAG_DEMO_HEAVY_SECONDS     questions estimated above S run at low priority
  --model-concurrency N  RAG_DEMO_MODEL_CONCURRENCY model events running at once (default 20: a class's
                                                    decoding steps batched, serving/scheduler.py)
  --model-thread on|off  RAG_DEMO_MODEL_THREAD      on (default): every model call on one thread with
                                                    torch's intra-op threads, every other thread on one
                                                    (serving/model_thread.py says why)

Memory: at most MALLOC_ARENA_MAX (default 2) glibc malloc arenas, set before any thread starts,
at most 128 compiled oneDNN kernels (ONEDNN_PRIMITIVE_CACHE_CAPACITY), and freed memory is given
back after each request (rag_demo/serving/memory.py says why).
"""
from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # no usage pings from a demo

from rag_demo.serving import memory  # noqa: E402 - torch-free, before anything starts threads

memory.limit_arenas(int(os.environ.get("MALLOC_ARENA_MAX", "2")))
memory.limit_kernel_cache()  # before torch compiles its first kernel

from rag_demo.config import GENERATOR_DTYPES, STACKS  # noqa: E402
from rag_demo.models.stack_spec import StackSpec  # noqa: E402
from rag_demo.serving.budget import MODEL_CONCURRENCY  # noqa: E402
from rag_demo.serving.pool import PipelinePool, stack_factory  # noqa: E402


def _env_float(name: str) -> float | None:
    v = os.environ.get(name)
    return float(v) if v not in (None, "") else None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="RAG teaching demo (Gradio)")
    p.add_argument("--stack", default="offline", choices=STACKS, help="stack loaded at start (default: offline)")
    p.add_argument("--corpus-file", action="append", default=[], metavar="FILE",
                   help="built-in corpus from these files (.txt .md .csv .jsonl .pdf) instead of Vital Articles")
    p.add_argument("--knowledge-dataset", metavar="DIR", help="serve this knowledge dataset (transformers' RAG format: "
                   "a save_to_disk folder with title, text, embeddings) with its stored vectors; needs --knowledge-index")
    p.add_argument("--knowledge-index", metavar="FILE", help="the FAISS index file of --knowledge-dataset")
    p.add_argument("--generator-dtype", default=os.environ.get("RAG_DEMO_GENERATOR_DTYPE", "auto"),
                   choices=GENERATOR_DTYPES, help="offline generator weights (default auto: bfloat16 where the CPU "
                   "has it natively, else float32)")
    p.add_argument("--passage-cache-mb", type=int, default=int(os.environ.get("RAG_DEMO_PASSAGE_CACHE_MB",
                                                                          StackSpec.passage_cache_mb)),
                   help=f"MiB of passages' keys and values the offline generator keeps for later questions "
                   f"(0: none; default {StackSpec.passage_cache_mb})")
    p.add_argument("--hidden-cache-mb", type=int, default=int(os.environ.get("RAG_DEMO_HIDDEN_CACHE_MB",
                                                                         StackSpec.hidden_cache_mb)),
                   help=f"MiB of hidden states the offline generator keeps, so a question asked again runs only "
                   f"what it reads anew (0: none; default {StackSpec.hidden_cache_mb})")
    p.add_argument("--host", default=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"),
                   help="interface to serve on (0.0.0.0 on a Space)")
    p.add_argument("--port", type=int, default=int(os.environ.get("GRADIO_SERVER_PORT", "7860")))
    b = p.add_argument_group("serving limits (default: the library's Budget)")
    b.add_argument("--max-seconds", type=float, default=_env_float("RAG_DEMO_MAX_SECONDS"),
                   help="refuse a question whose estimated time is above this")
    b.add_argument("--max-request-gb", type=float, default=_env_float("RAG_DEMO_MAX_REQUEST_GB"),
                   help="refuse a question whose estimated peak extra memory is above this")
    b.add_argument("--time-limit", type=float, default=_env_float("RAG_DEMO_TIME_LIMIT"),
                   help="wall-clock seconds per question; decoding stops there")
    b.add_argument("--heavy-seconds", type=float, default=_env_float("RAG_DEMO_HEAVY_SECONDS"),
                   help="questions estimated above this run at low priority")
    b.add_argument("--model-concurrency", type=int,
                   default=int(os.environ.get("RAG_DEMO_MODEL_CONCURRENCY", MODEL_CONCURRENCY)),
                   help=f"model events running at once (default {MODEL_CONCURRENCY})")
    b.add_argument("--model-thread", default=os.environ.get("RAG_DEMO_MODEL_THREAD", "on"), choices=("on", "off"),
                   help="on (default): every model call runs on one thread with torch's intra-op threads, every "
                   "other thread on one (serving/model_thread.py); off: each on its visitor's thread")
    return p.parse_args(argv)


def budget_from_args(args: argparse.Namespace):
    """The library's Budget with the given flags (or environment variables) applied."""
    from rag_demo.serving.budget import Budget

    given = {
        "max_seconds": args.max_seconds,
        "max_request_bytes": None if args.max_request_gb is None else int(args.max_request_gb * 2**30),
        "time_limit_s": args.time_limit,
        "heavy_seconds": args.heavy_seconds,
    }
    return Budget(**{k: v for k, v in given.items() if v is not None})


def cli_flags(args: argparse.Namespace) -> list[str]:
    """The flags that make `python -m rag_demo ask` read this server's corpus with its generator's
    precision ("show the code" on the page prints them)."""
    flags = [f for path in args.corpus_file for f in ("--corpus-file", os.path.abspath(path))]
    if args.knowledge_dataset:
        flags += ["--knowledge-dataset", os.path.abspath(args.knowledge_dataset),
                  "--knowledge-index", os.path.abspath(args.knowledge_index)]
    if args.generator_dtype != "auto":
        flags += ["--generator-dtype", args.generator_dtype]
    return flags


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    model_thread = None
    if args.model_thread == "on":  # before anything runs torch: no other thread may grow a team of threads
        from rag_demo.serving.model_thread import ModelThread

        model_thread = ModelThread(others=1)
    corpus_fn = None
    if args.corpus_file:
        from rag_demo.knowledge.uploads import load_documents

        files = list(args.corpus_file)
        corpus_fn = lambda: load_documents(files, name="Demo documents")  # noqa: E731
    knowledge = None
    try:
        from rag_demo.knowledge.hf_format import knowledge_paths, load_knowledge

        paths = knowledge_paths(args.knowledge_dataset, args.knowledge_index)
        if paths and args.corpus_file:
            raise ValueError("--corpus-file and --knowledge-dataset both give the passages: use one of them.")
        knowledge = load_knowledge(*paths, say=lambda msg: print(f"[rag-demo] {msg}", file=sys.stderr)) if paths else None
    except ValueError as e:
        sys.exit(f"error: {e}")
    pool = PipelinePool(stack_factory(corpus_fn, knowledge=knowledge, generator_dtype=args.generator_dtype,
                                      passage_cache_mb=args.passage_cache_mb, hidden_cache_mb=args.hidden_cache_mb),
                        model_thread=model_thread)
    pool.cli_flags = cli_flags(args)
    stack = args.stack
    reason = pool.unavailable(stack)
    if reason:
        print(f"[rag-demo] the {stack} stack is unavailable ({reason}); serving the offline stack", file=sys.stderr)
        stack = "offline"
    pool.start(stack)  # load and warm up in the background; the page shows the progress
    # gradio is imported after the loading starts: its seconds of import overlap the models' load
    from rag_demo.web.page import build_app, launch

    budget = budget_from_args(args)
    print(f"[rag-demo] serving limits: {budget}; model concurrency {args.model_concurrency}", file=sys.stderr)
    demo = build_app(pool, default_stack=stack, budget=budget, model_concurrency=args.model_concurrency)
    launch(demo, server_name=args.host, server_port=args.port)


if __name__ == "__main__":
    main()
