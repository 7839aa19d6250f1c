"""How a page build reads: the modules of rag_demo that `web.page.build_app` calls into, in call
order, at the depths it reaches. A *stay* is a run of calls into one module; a *return* is a stay
in a module the build was in before. A page build that reads top-down enters each module once or
twice (docs/results.md §11). Builds the page as app.py does, on the offline stack, before anything
loads (no model is loaded or run).

    .venv/bin/python scripts/page_stays.py [--depth 1]
"""
from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def module_calls(depth: int) -> list[str]:
    """The rag_demo modules build_app's calls enter, in order: a call made within `depth` frames of
    build_app, in rag_demo, counts (build_app's own module, page, counts when a call re-enters it)."""
    from rag_demo.serving.pool import PipelinePool, stack_factory
    from rag_demo.web import page

    pool = PipelinePool(stack_factory(lambda: None), None)
    seen: list[str] = []
    frames: list = []  # build_app's frame, then the rag_demo frames under it: (frame, counts as a level)

    def prof(frame, event, _arg):
        if event == "return" and frames and frame is frames[-1][0]:
            frames.pop()
        if event != "call":
            return
        if not frames:
            if frame.f_code is page.build_app.__code__:
                frames.append((frame, False))
            return
        name = frame.f_globals.get("__name__", "")
        caller = frames[-1][0]
        if frame.f_back is not caller or not name.startswith("rag_demo"):
            return
        if frame.f_code.co_name.startswith("<") and name == caller.f_globals.get("__name__"):
            frames.append((frame, False))  # a comprehension: its caller's own lines, not a call into a module
        elif sum(level for _, level in frames) < depth:
            seen.append(name.removeprefix("rag_demo."))
            frames.append((frame, True))

    sys.setprofile(prof)
    try:
        page.build_app(pool, default_stack="offline")
    finally:
        sys.setprofile(None)
    return seen


def stays(modules: list[str]) -> list[str]:
    return [m for i, m in enumerate(modules) if i == 0 or modules[i - 1] != m]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--depth", type=int, default=1, help="calls within this many frames of build_app (default 1)")
    a = ap.parse_args()
    s = stays(module_calls(a.depth))
    rooms = Counter(s)
    print(f"depth {a.depth}: {len(s)} stays in {len(rooms)} modules, {len(s) - len(rooms)} returns")
    print("  " + " -> ".join(s))
    for m, n in rooms.most_common():
        print(f"  {m}: entered {n}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
