"""What the page shows of a session: the status line, the dropdowns' choices, the example questions.

Reads the pool and the `Session` (rag_demo.serving.session); pure HTML and lists, no gradio.
"""

from __future__ import annotations

import re
from typing import Any

from rag_demo.config import STACKS
from rag_demo.knowledge.corpus import VITAL_ARTICLES_NAME
from rag_demo.knowledge.factbook import FACTBOOK_NAME
from rag_demo.serving.pool import PipelinePool
from rag_demo.serving.session import Session, active_index
from rag_demo.web.render import esc, plural

STACK_BLURB = {
    "offline": "offline: MiniLM retriever + SmolLM2-135M generator (CPU, no network)",
    "paper": "paper: DPR retriever + BART-large (facebook/rag-*-nq, from the Hub)",
}
# Questions both built-in corpora answer, with different figures (Wikipedia's lead vs the CIA's
# 2025 estimates): ask one, switch the corpus, ask it again, and the answer follows the index.
# Germany and Canada: both RAG modes copy each corpus's figure (83 / 41 million against
# 84,012,284 / 39,187,155). Nigeria on Vital Articles: both RAG modes copy "242 million" from
# Nigeria's lead, p(z|x) 0.89 (asked again 2026-11-24; RAG-Token said "21 million", a span only
# Lagos's passage holds, until it copied only from passages with p(z|x) >= copy_min_prior). France was
# one until 2026-11-23: its lead's area (632,702 km2) and population (69.1 million) both open
# with a 6, and the greedy reader copied the area.
HOT_SWAP_EXAMPLES = (
    "What is the population of Germany?",
    "What is the population of Canada?",
    "What is the population of Nigeria?",
)
# Vital Articles questions whose answer is in the article's lead (checked against the corpus);
# but the capital of Australia: the top passages (Australia's lead, Melbourne, Adelaide) do not name
# Canberra, so the extractive reader answers another city (Melbourne on 2026-11-23; on 2026-11-24
# Perth, then Adelaide from RAG-Sequence and Melbourne from RAG-Token), and the Factbook corpus
# answers Canberra: what the index holds decides the answer.
VITAL_EXAMPLES = (*HOT_SWAP_EXAMPLES,
    "Who painted The Starry Night?",
    "What is the capital of Australia?",
    "Who wrote Hamlet?",
    "Who discovered penicillin?",
    "Who invented the World Wide Web?",
    "Who painted the Mona Lisa?",
    "Who wrote War and Peace?",
    "Where is the Taj Mahal?",
)
# Factbook questions (a test checks their answers are in the country's passages).
FACTBOOK_EXAMPLES = (
    *HOT_SWAP_EXAMPLES,
    "What is the capital of Australia?",
    "What languages are spoken in Switzerland?",
    "What is the currency of Japan?",
    "What is the highest point in Nepal?",
    "Who is the chief of state of Canada?",
)



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
    return (
        f'<div class="rag-status" data-stack="{esc(pipe.stack.name)}" data-corpus="{esc(index.corpus.name)}">'
        f"Live: stack <b>{esc(pipe.stack.describe())}</b> · corpus <b>{esc(index.corpus.name)}</b> "
        f"({plural(len(index.corpus), 'passage')}){edits}{note_html}</div>"
    )


def example_questions(corpus: Any, n: int = 6) -> list[str]:
    """Clickable questions for the live corpus: a curated list for Vital Articles (a test checks
    their articles are in it), template questions over document titles otherwise (titles made up
    for untitled CSV rows / JSONL lines are skipped)."""
    if corpus.name == VITAL_ARTICLES_NAME:
        return list(VITAL_EXAMPLES)
    if corpus.name == FACTBOOK_NAME:
        return list(FACTBOOK_EXAMPLES)
    titles = [t for t in dict.fromkeys(p.title for p in corpus.passages) if not re.search(r" (row|line) \d+$", t)]
    templates = ("What is {}?", "What do the documents say about {}?", "Tell me about {}.")
    return [templates[i % len(templates)].format(t) for i, t in enumerate(titles[:n])]


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
