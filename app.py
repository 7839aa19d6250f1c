"""`python app.py`: serve the RAG teaching demo (rag_demo/ui.py) on http://localhost:7860.

The page is served at once; the models and the index load in the background while the page
shows their progress. Options: --stack offline|paper, --corpus-file FILE (serve your own
documents instead of Wikipedia Vital Articles; tests use it to start fast), --port, --host.
"""
from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # no usage pings from a demo

from rag_demo.config import STACKS  # noqa: E402
from rag_demo.ui import PipelinePool, build_app, launch, stack_factory  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="RAG teaching demo (Gradio)")
    p.add_argument("--stack", default="offline", choices=STACKS, help="stack loaded at start (default: offline)")
    p.add_argument("--corpus-file", action="append", default=[], metavar="FILE",
                   help="built-in corpus from these files (.txt .md .csv .jsonl .pdf) instead of Vital Articles")
    p.add_argument("--host", default=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"),
                   help="interface to serve on (0.0.0.0 on a Space)")
    p.add_argument("--port", type=int, default=int(os.environ.get("GRADIO_SERVER_PORT", "7860")))
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    corpus_fn = None
    if args.corpus_file:
        from rag_demo.corpus import load_documents

        files = list(args.corpus_file)
        corpus_fn = lambda: load_documents(files, name="Demo documents")  # noqa: E731
    pool = PipelinePool(stack_factory(corpus_fn))
    stack = args.stack
    reason = pool.unavailable(stack)
    if reason:
        print(f"[rag-demo] the {stack} stack is unavailable ({reason}); serving the offline stack", file=sys.stderr)
        stack = "offline"
    pool.start(stack)  # load in the background; the page shows the progress
    demo = build_app(pool, default_stack=stack)
    launch(demo, server_name=args.host, server_port=args.port)


if __name__ == "__main__":
    main()
