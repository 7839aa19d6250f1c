"""What the page shows of a session: the status line, the dropdowns' choices, the example questions.

Reads the pool and the `Session` (rag_demo.serving.session); pure HTML and lists, no gradio.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from rag_demo.config import STACKS
from rag_demo.knowledge.corpus import VITAL_ARTICLES_NAME
from rag_demo.knowledge.factbook import FACTBOOK_NAME
from rag_demo.serving.pool import PipelinePool
from rag_demo.serving.session import Session, active_index
from rag_demo.web.render import esc, plural

STACK_BLURB = {
    "offline": "offline: MiniLM + SmolLM2-135M (CPU, no network)",
    "paper": "paper: DPR + BART-large (facebook/rag-*-nq, Hub)",
}
LESSONS_PATH = Path(__file__).resolve().parents[2] / "assets" / "lessons.json"
# Each built-in corpus's lessons: {corpus name: [{"title", "look", "questions", "expect" | "fails", ...}]}.
# A lesson's "look" is the one line of what to look at; tests/test_lessons.py checks every
# question's answers against its "expect" (or that a deliberate failure still fails as it says),
# and its "cued" (whether a card shows the "probably wrong" cue) where the text says so.
LESSONS: dict[str, list[dict]] = json.loads(LESSONS_PATH.read_text(encoding="utf-8"))
VITAL_EXAMPLES = tuple(dict.fromkeys(q for lesson in LESSONS[VITAL_ARTICLES_NAME] for q in lesson["questions"]))
FACTBOOK_EXAMPLES = tuple(dict.fromkeys(q for lesson in LESSONS[FACTBOOK_NAME] for q in lesson["questions"]))
# questions both built-in corpora answer, with different figures: ask one, switch the corpus, ask again
HOT_SWAP_EXAMPLES = tuple(q for q in VITAL_EXAMPLES if q in FACTBOOK_EXAMPLES and "population" in q)


def render_status(pool: PipelinePool, s: Session, pipe: Any | None = None, note: str = "") -> str:
    """Which stack and corpus are live (or the loading progress), and an optional note (e.g. why
    a stack switch was refused): said here, once, instead of in a pop-up."""
    note_html = f'<div class="rag-status-note">{esc(note)}</div>' if note else ""
    if pipe is None:
        pipe = pool.loaded(s.stack)
    if pipe is None:
        frac, msg = pool.progress(s.stack)
        err = pool.error(s.stack)
        if err:
            return f'<div class="rag-status rag-error">Could not load the <b>{esc(s.stack)}</b> stack: {esc(err)}</div>'
        pct = 100 * (frac or 0.0)
        return (
            f'<div class="rag-status rag-loading">Loading the <b>{esc(s.stack)}</b> stack ({pct:.0f}%): {esc(msg)}'
            f'<div class="rag-bar"><div style="width:{pct:.0f}%"></div></div></div>'
        )
    index = active_index(s, pipe) if s.stack == pipe.stack.name else pipe.index
    edits = f'<span class="rag-tag">{plural(len(s.edits), "passage")} edited in your copy</span>' if s.edits else ""
    building = retrieval_note(pipe) if index is pipe.index else ""
    w = getattr(pipe.stack, "weights", None)
    weights = "" if w is None else (
        f' · <span class="rag-weights" data-measured="{str(w.measured).lower()}">weights {esc(w.describe())}</span>'
        + (f'<div class="rag-status-note rag-weights-warning">{esc(w.warning())}</div>' if w.warning() else ""))
    return (
        f'<div class="rag-status" data-stack="{esc(pipe.stack.name)}" data-corpus="{esc(index.corpus.name)}" '
        f'data-retriever="{"bm25" if building else "dense"}">'
        f"Live: stack <b>{esc(pipe.stack.describe())}</b> · corpus <b>{esc(index.corpus.name)}</b> "
        f"({plural(len(index.corpus), 'passage')}){weights}{edits}{building}{note_html}</div>"
    )


def retrieval_note(pipe: Any) -> str:
    """The status line's note while the stack's dense index is built in the background (how far,
    and that BM25 retrieves meanwhile: RagPipeline.retrieval_status); "" once it serves."""
    status = getattr(pipe, "retrieval_status", None)
    text = status() if callable(status) else None
    return f'<div class="rag-status-note rag-building">{esc(text)}</div>' if text else ""


def lessons(corpus: Any, n: int = 6) -> list[dict]:
    """The lessons of the live corpus: the built-in corpora's own, or for your documents one lesson
    of template questions over their titles (titles made up for untitled CSV rows / JSONL lines
    are skipped)."""
    if corpus.name in LESSONS:
        return LESSONS[corpus.name]
    titles = [t for t in dict.fromkeys(p.title for p in corpus.passages) if not re.search(r" (row|line) \d+$", t)]
    templates = ("What is {}?", "What do the documents say about {}?", "Tell me about {}.")
    return [{"title": "Ask your documents", "look": "The answers come from your documents alone; the passage table "
             "shows which of them each answer leans on.",
             "questions": [templates[i % len(templates)].format(t) for i, t in enumerate(titles[:n])]}]


def example_questions(corpus: Any, n: int = 6) -> list[str]:
    """Every lesson question of the live corpus, in order."""
    return list(dict.fromkeys(q for lesson in lessons(corpus, n) for q in lesson["questions"]))


def render_lessons(corpus: Any) -> str:
    """The lessons as the Ask tab shows them: a title, one line of what to look at, and questions
    to click (the page's script puts one in the box and asks it)."""
    items = []
    for lesson in lessons(corpus):
        qs = "".join(f'<button type="button" class="rag-lesson-q">{esc(q)}</button>' for q in lesson["questions"])
        items.append(f'<div class="rag-lesson"><div class="rag-lesson-title">{esc(lesson["title"])}</div>'
                     f'<div class="rag-lesson-look">{esc(lesson["look"])}</div><div>{qs}</div></div>')
    return (f'<div class="rag-lessons"><div class="rag-lessons-head">Lessons: click a question to ask it, '
            f'then look where each lesson says</div>{"".join(items)}</div>')


def corpus_choices(pool: PipelinePool, s: Session) -> list[tuple[str, str]]:
    pipe = pool.loaded(s.stack) or next((pool.loaded(n) for n in pool.loaded_stacks()), None)
    builtin = pipe.index.corpus.name if pipe else VITAL_ARTICLES_NAME
    out = [(f"{builtin} (built in)", "builtin")]
    out += [(f"{name} (built in)", key) for key, name in pool.corpora().items() if name != builtin]
    if s.upload is not None:
        out.append((f"{s.upload.name} ({plural(len(s.upload), 'passage')})", "upload"))
    return out


def stack_choices(pool: PipelinePool) -> list[tuple[str, str]]:
    out = []
    for name in STACKS:
        reason = pool.unavailable(name)
        label = STACK_BLURB.get(name, name)
        out.append((f"{label} — unavailable: {reason}" if reason else label, name))
    return out


def passage_choices(s: Session) -> list[tuple[str, str]]:
    return [(f"[{i}] {title}: {text[:60]}…", pid) for i, (pid, title, text) in enumerate(s.last_docs, 1)]
