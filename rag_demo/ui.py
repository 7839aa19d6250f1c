"""The web app: a Gradio Blocks teaching demo of RAG (Lewis et al. 2020) over `RagPipeline`.

Owns the page: HTML rendering of answers (answer cards with per-token passage colours, the
tokens x passages heatmap of the paper's Fig. 2, the retrieved passages table), per-session
state (uploaded corpus, edited passages: `Session` in a `gr.State`), lazy loading of one
pipeline per stack (`PipelinePool`), and the named API endpoints. Renderers take
`Answer.to_dict()` dicts, so they are pure and testable; nothing here recomputes the math.

Imports no torch: handlers call the library (loaded lazily, inside functions). Layout follows
gradio's demos: functions first, then `with gr.Blocks()` layout, then event wiring.
"""

from __future__ import annotations

import dataclasses
import html
import math
import re
import sys
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gradio as gr

from .config import (
    MODE_TITLES,
    MODES,
    MAX_BEAMS,
    MAX_K,
    MAX_NEW_TOKENS,
    MAX_QUESTION_CHARS,
    SEQUENCE_DECODINGS,
    STACKS,
    RagSettings,
    StackSpec,
    check_question,
)
from .corpus import MAX_UPLOAD_BYTES, VITAL_ARTICLES_NAME, check_passage_text, load_documents, supported_extensions

ASSETS = Path(__file__).resolve().parent.parent / "assets"
CSS_PATH = ASSETS / "style.css"
DIAGRAM_PATH = ASSETS / "rag_diagram.svg"

MODE_FORMULAS = {
    "sequence": "p(y|x) = Σ_z p(z|x) Π_i p(y_i|x,z,y_<i)",
    "token": "p(y|x) = Π_i Σ_z p(z|x) p(y_i|x,z,y_<i)",
    "closed-book": "p(y|x) = Π_i p(y_i|x,y_<i)",
}
ATTRIBUTION = {  # what a heatmap row means (docs/DESIGN.md §3.5)
    "sequence": "row i is the running posterior p(z | x, y_≤i): which passage the answer so far is "
    "consistent with; the last row is the answer's passage posterior.",
    "token": "row i is p(z | x, y_i, y_<i) ∝ p(z|x)·p(y_i | x, z, y_<i): which passage token i came from "
    "(the paper's Fig. 2).",
}
POSTERIOR_HEADS = {  # (column head, hover text) of each mode's passage posterior in the passage table
    "sequence": ("p(z|x,y)",
                 "RAG-Sequence: p(z | x, y) ∝ p(z|x) Π_i p(y_i | x, z, y_<i), the answer's passage posterior"),
    "token": ("mean p(z|x,y_i)", "RAG-Token: p(z | x, y_i, y_<i) averaged over the answer's tokens"),
}
STAGES = ("encode", "retrieve", "generate", "attribute")
STACK_BLURB = {
    "offline": "offline: MiniLM retriever + SmolLM2-135M generator (CPU, no network)",
    "paper": "paper: DPR retriever + BART-large (facebook/rag-*-nq, from the Hub)",
}
# Passage colours by rank: mid-tone, so dark text on them reads in light and dark mode alike.
PALETTE = (
    "#7fb3ff", "#ffb366", "#7dd87d", "#ff8a8a", "#c9a6ff", "#d9b38c", "#ff9ed8", "#bdbdbd", "#e0e060", "#6fdbe8",
    "#b3d1ff", "#ffd1a3", "#b5ebb5", "#ffbdbd", "#e0ccff", "#ead2bb", "#ffcbeb", "#e0e0e0", "#f0f09a", "#a8edf5",
)
# Vital Articles questions whose answer is in the article's lead (checked against the corpus).
VITAL_EXAMPLES = (
    "Who painted The Starry Night?",
    "What is the capital of Australia?",
    "Who wrote Hamlet?",
    "Who discovered penicillin?",
    "Who invented the World Wide Web?",
    "Who painted the Mona Lisa?",
    "Who wrote War and Peace?",
    "Where is the Taj Mahal?",
)
MAX_UPLOAD_FILES = 20
QUEUE_CONCURRENCY = 1  # the models are not shared across threads mid-forward: one model call at a time
QUEUE_MAX_SIZE = 32  # a burst of ~30 waiting requests; more get "queue full" instead of waiting minutes
HUB_PROBE_S = 5.0  # longest the page waits to learn whether the Hub is reachable
STATE_TTL_S = 3600  # a session's uploads and edits are dropped an hour after their last change

Progress = Callable[[float | None, str], None]  # (fraction done or None, message)


# ---------------------------------------------------------------- loading: one pipeline per stack


def _log(msg: str) -> None:
    print(f"[rag-demo] {msg}", file=sys.stderr, flush=True)


def default_unavailable(stack: str) -> str | None:
    """Why `stack` cannot be loaded here, or None. The paper stack needs the Hub unless its three
    checkpoints are in the local Hugging Face cache; the probe takes HUB_PROBE_S at most."""
    if stack != "paper":
        return None
    from .stacks import hub_unavailable_reason

    reason = hub_unavailable_reason(HUB_PROBE_S)  # bounded, DNS lookup included
    if reason is None:
        return None
    try:
        from huggingface_hub import try_to_load_from_cache

        spec = StackSpec(name="paper")
        repos = (spec.rag_token, spec.rag_sequence, spec.ctx_encoder)
        if all(isinstance(try_to_load_from_cache(r, "config.json"), str) for r in repos):
            return None  # cached: loads without the Hub
    except Exception:  # noqa: BLE001 - a cache probe must never break the page
        pass
    return reason


def stack_factory(corpus_fn: Callable[[], Any] | None = None, settings: RagSettings | None = None):
    """factory(stack, progress) -> RagPipeline over `corpus_fn()` (Vital Articles by default):
    `RagPipeline.load`, which relays its progress. Imports the library lazily."""

    def factory(stack: str, progress: Progress) -> Any:
        from .pipeline import RagPipeline

        return RagPipeline.load(StackSpec(name=stack), corpus_fn() if corpus_fn else None, settings, progress)

    return factory


class PipelinePool:
    """One loaded pipeline per stack, loaded lazily in a background thread on first use.

    `get` waits for the load and relays its progress; `lock` serialises model calls (the queue
    already runs one model event at a time; the lock keeps it safe under any queue setting, and
    for events outside that group, such as switching stacks, which may wait minutes for a load).
    """

    def __init__(
        self,
        factory: Callable[[str, Progress], Any] | None = None,
        preloaded: dict[str, Any] | None = None,
        unavailable: Callable[[str], str | None] = default_unavailable,
    ):
        self._factory = factory or stack_factory()
        self._pipes: dict[str, Any] = dict(preloaded or {})
        self._errors: dict[str, str] = {}
        self._threads: dict[str, threading.Thread] = {}
        self._progress: dict[str, tuple[float | None, str]] = {}
        self._reasons: dict[str, str | None] = {}
        self._unavailable_fn = unavailable
        self._guard = threading.Lock()
        self.lock = threading.RLock()

    @classmethod
    def of(cls, pipelines: Any, unavailable: Callable[[str], str | None] = default_unavailable) -> PipelinePool:
        """A pool from a pool, a factory(stack, progress), or one loaded RagPipeline (other stacks
        then load over the same built-in corpus)."""
        if isinstance(pipelines, PipelinePool):
            return pipelines
        if hasattr(pipelines, "answer_modes"):
            corpus = pipelines.index.corpus
            factory = stack_factory(lambda: corpus, pipelines.settings)
            return cls(factory, {pipelines.stack.name: pipelines}, unavailable)
        return cls(pipelines, None, unavailable)

    def unavailable(self, stack: str) -> str | None:
        """Cached reason the stack cannot load here (None: it can, or it is loaded already)."""
        if stack in self._pipes:
            return None
        if stack not in self._reasons:
            self._reasons[stack] = self._unavailable_fn(stack)
        return self._reasons[stack]

    def loaded(self, stack: str) -> Any | None:
        return self._pipes.get(stack)

    def loaded_stacks(self) -> list[str]:
        return list(self._pipes)

    def loading(self, stack: str) -> bool:
        t = self._threads.get(stack)
        return stack not in self._pipes and t is not None and t.is_alive()

    def error(self, stack: str) -> str | None:
        """Why the last load of `stack` failed (None: it did not)."""
        return self._errors.get(stack)

    def progress(self, stack: str) -> tuple[float | None, str]:
        return self._progress.get(stack, (None, "waiting to load"))

    def start(self, stack: str) -> None:
        """Begin loading `stack` in the background (no-op if loaded or loading)."""
        with self._guard:
            if stack in self._pipes or (stack in self._threads and self._threads[stack].is_alive()):
                return
            self._errors.pop(stack, None)
            self._progress[stack] = (0.0, f"Starting the {stack} stack ...")
            t = threading.Thread(target=self._load, args=(stack,), name=f"load-{stack}", daemon=True)
            self._threads[stack] = t
            t.start()

    def _load(self, stack: str) -> None:
        def report(frac: float | None, msg: str) -> None:
            prev = self._progress.get(stack, (None, ""))[0]
            self._progress[stack] = (prev if frac is None else frac, msg)
            _log(msg)

        t0 = time.perf_counter()
        try:  # not under `lock`: loading a stack touches only its own models, others keep answering
            pipe = self._factory(stack, report)
            self._pipes[stack] = pipe
            report(1.0, f"The {stack} stack is ready ({time.perf_counter() - t0:.1f} s)")
        except Exception as e:  # noqa: BLE001 - shown to the user, the app keeps serving
            self._errors[stack] = f"{type(e).__name__}: {e}" if not isinstance(e, ValueError) else str(e)
            report(None, f"Loading the {stack} stack failed: {self._errors[stack]}")

    def get(self, stack: str, progress: Progress | None = None, timeout: float | None = None) -> Any:
        """The loaded pipeline of `stack`, loading it first (relaying progress); ValueError if it cannot load."""
        if stack in self._pipes:
            return self._pipes[stack]
        reason = self.unavailable(stack)
        if reason:
            raise ValueError(f"the {stack} stack is unavailable here: {reason}. Use the offline stack.")
        self.start(stack)
        t0, last = time.monotonic(), None
        while stack not in self._pipes:
            thread = self._threads.get(stack)
            if stack in self._errors and not (thread and thread.is_alive()):
                raise ValueError(f"the {stack} stack could not be loaded: {self._errors[stack]}")
            now = self._progress.get(stack)
            if progress and now != last:
                progress(*now)
                last = now
            if timeout is not None and time.monotonic() - t0 > timeout:
                raise TimeoutError(f"the {stack} stack is still loading after {timeout:.0f} s")
            if thread:
                thread.join(0.25)
        return self._pipes[stack]


# ---------------------------------------------------------------- per-session state


@dataclass(frozen=True)
class Session:
    """What one browser tab (or one gradio_client.Client) has chosen; stored in a gr.State.

    The shared pipelines and their indexes are never changed: an upload gets its own index,
    an edit makes a copy of the active index (PassageIndex.with_edited_passage).
    """

    stack: str = "offline"
    corpus: str = "builtin"  # "builtin" (the stack's corpus) or "upload"
    upload: Any = None  # Corpus of this session's uploaded documents
    upload_index: Any = None  # its PassageIndex under `upload_stack`'s passage encoder
    upload_stack: str | None = None
    edited: Any = None  # the active index with this session's edits (None: no edits)
    edits: tuple[str, ...] = ()  # ids of edited passages
    last_docs: tuple[tuple[str, str, str], ...] = ()  # (id, title, text) of the last answer's passages


def active_index(s: Session, base: Any) -> Any:
    """The index this session answers from: its edited copy, its upload, or the shared one."""
    if s.edited is not None:
        return s.edited
    if s.corpus == "upload" and s.upload_index is not None:
        return s.upload_index
    return base.index


def _embed(pool: PipelinePool, base: Any, corpus: Any, progress: Callable) -> Any:
    """A fresh (uncached: uploads stay in memory) index of `corpus` under `base`'s passage encoder."""
    from .index import build_index

    def bar(done: int, total: int) -> None:
        progress((done, total), desc=f"Embedding {total:,} passages", unit="passages")

    progress((0, len(corpus)), desc=f"Embedding {len(corpus):,} passages", unit="passages")
    with pool.lock:
        return build_index(corpus, base.stack.ctx_encoder, bar)


def session_pipeline(pool: PipelinePool, s: Session, progress: Callable | None = None) -> tuple[Any, Session]:
    """(pipeline with the session's index, session): re-embeds an upload made under another stack."""
    relay = (lambda frac, msg: progress(frac, desc=msg)) if progress else None
    base = pool.get(s.stack, relay)
    if s.corpus == "upload" and s.upload is not None and s.edited is None and s.upload_stack != s.stack:
        index = _embed(pool, base, s.upload, progress or (lambda *a, **k: None))
        s = dataclasses.replace(s, upload_index=index, upload_stack=s.stack)
    index = active_index(s, base)
    return (base if index is base.index else base.with_index(index)), s


# ---------------------------------------------------------------- rendering (pure: dicts in, HTML out)


def esc(x: Any) -> str:
    return html.escape(str(x), quote=True)


def colour(rank: int) -> str:
    return PALETTE[(rank - 1) % len(PALETTE)]


def _mix(c: str, p: float, floor: float = 0.0) -> tuple[str, bool]:
    """(CSS background for colour c at strength p, whether text on it must be dark)."""
    pct = round(100 * max(floor, min(1.0, p)))
    return f"color-mix(in srgb, {c} {pct}%, transparent)", pct >= 55


def badge(rank: int, title: str | None = None) -> str:
    t = f' title="{esc(title)}"' if title else ""
    return f'<span class="rag-badge" style="background:{colour(rank)}"{t}>{rank}</span>'


def show_token(tok: str) -> str:
    """A token piece as a heatmap row label: newlines, tabs and all-space pieces made visible."""
    shown = tok.replace("\n", "↵").replace("\t", "⇥")
    return shown if shown.strip() else (shown.replace(" ", "␣") or "∅")


def plural(n: int, word: str) -> str:
    return f"{n:,} {word}" + ("" if n == 1 else "s")


def fmt_seconds(s: float) -> str:
    return f"{1000 * s:.0f} ms" if s < 1 else f"{s:.2f} s"


def _finite(x: Any) -> Any:
    """JSON-safe copy: non-finite floats become None."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x


def render_timings(t: dict[str, float]) -> str:
    keys = [k for k in STAGES if k in t] + [k for k in t if k not in STAGES and k != "total"]
    chips = [f"<span>{esc(k)} {fmt_seconds(t[k])}</span>" for k in keys]
    if "total" in t:
        chips.append(f'<span class="rag-total">total {fmt_seconds(t["total"])}</span>')
    return f'<div class="rag-timings" title="seconds per stage">{"".join(chips)}</div>'


def render_tokens(a: dict, anchor: str = "rag-p-") -> str:
    """Answer tokens coloured by their most responsible passage; a rank badge starts each run;
    hovering a token names the passage and its posterior; clicking jumps to the passage row."""
    docs, rows = a["docs"], a["token_doc_posteriors"]
    if not a["tokens"] or not rows:
        return '<div class="rag-tokens rag-placeholder">no tokens</div>'
    spans, prev = [], None
    for tok, row, j in zip(a["tokens"], rows, a["top_docs"], strict=False):
        d = docs[j]
        bg, dark = _mix(colour(d["rank"]), row[j], floor=0.35)
        tip = f"{tok!r} ← [{d['rank']}] {d['title']}  p = {row[j]:.2f}"
        sup = f"<sup>{d['rank']}</sup>" if j != prev else ""
        cls = "rag-tok rag-dark" if dark else "rag-tok"
        spans.append(
            f'<a class="{cls}" href="#{anchor}{d["rank"]}" data-rank="{d["rank"]}" style="background:{bg}" '
            f'title="{esc(tip)}">{sup}{esc(tok)}</a>'
        )
        prev = j
    used = sorted(set(a["top_docs"]))
    legend = "".join(
        f'<span class="rag-legend-item">{badge(docs[j]["rank"])} {esc(docs[j]["title"])}</span>' for j in used
    )
    return f'<div class="rag-tokens">{"".join(spans)}</div><div class="rag-legend">{legend}</div>'


def render_heatmap(a: dict) -> str:
    """Tokens (rows) x passages (columns), each cell shaded by the attribution posterior."""
    docs, rows = a["docs"], a["token_doc_posteriors"]
    if not rows:
        return ""
    head = "".join(f"<th>{badge(d['rank'], d['title'])}</th>" for d in docs)
    body = []
    for tok, row, best in zip(a["tokens"], rows, a["top_docs"], strict=False):
        cells = []
        for j, p in enumerate(row):
            bg, dark = _mix(colour(docs[j]["rank"]), p)
            cls = " ".join(c for c in ("rag-dark" if dark else "", "rag-max" if j == best else "") if c)
            cells.append(
                f'<td class="{cls}" style="background:{bg}" title="[{docs[j]["rank"]}] {esc(docs[j]["title"])}: '
                f'{p:.3f}">{p:.2f}</td>'
            )
        body.append(f'<tr><td class="rag-heat-tok">{esc(show_token(tok))}</td>{"".join(cells)}</tr>')
    return (
        f'<div class="rag-heat-wrap"><table class="rag-heat" data-tokens="{len(rows)}" data-docs="{len(docs)}">'
        f'<thead><tr><th>token</th>{head}</tr></thead><tbody>{"".join(body)}</tbody></table></div>'
        f'<div class="rag-caption">Tokens down, passages across; {esc(ATTRIBUTION[a["mode"]])}</div>'
    )


def _fmt_lp(lp: float | None) -> str:
    return f"{lp:.3f}" if lp is not None and math.isfinite(lp) else "-inf"


def render_answer(a: dict | None, anchor: str = "rag-p-", mode: str | None = None) -> str:
    """One answer card: answer text, score and timings, then coloured tokens and the heatmap."""
    mode = a["mode"] if a else mode
    head = (
        f'<div class="rag-card-head"><span class="rag-mode">{esc(MODE_TITLES[mode])}</span>'
        f'<span class="rag-formula">{esc(MODE_FORMULAS[mode])}</span></div>'
    )
    if a is None:
        wait = '<div class="rag-placeholder">Ask a question to see this answer.</div>'
        return f'<div class="rag-card rag-card-{mode}">{head}{wait}</div>'
    text = a["text"].strip()
    answer = f'<div class="rag-answer">{esc(text)}</div>' if text else (
        '<div class="rag-answer rag-empty">(empty answer)</div>'
    )
    lp_s = _fmt_lp(a["sequence_logprob"])
    k = f" · K = {plural(len(a['docs']), 'passage')}" if a["docs"] else ""
    meta = (
        f'<div class="rag-meta" title="log-probability of this answer under this model">score '
        f'<code>log p(y|x) = {lp_s}</code> · {esc(a["decoding"])}{k}</div>'
    )
    parts = [head, answer, meta, render_timings(a["timings"])]
    if mode == "closed-book":
        parts.append(
            '<div class="rag-note">No passages: the generator answers from what its weights memorised '
            "(the paper's parametric-only baseline). Compare it with the two RAG answers.</div>"
        )
    else:
        parts.append('<div class="rag-sub">Where each token came from</div>')
        parts.append(render_tokens(a, anchor))
        parts.append(
            f"<details open><summary>Heatmap: tokens × passages</summary>{render_heatmap(a)}</details>"
        )
        if a.get("candidates"):
            cands = "".join(
                f"<li><code>{_fmt_lp(c['logprob'])}</code> {esc(c['text'].strip() or '(empty)')}</li>"
                for c in a["candidates"]
            )
            parts.append(
                f"<details><summary>Candidates rescored ({len(a['candidates'])}, {esc(a['decoding'])})</summary>"
                f'<ol class="rag-note">{cands}</ol></details>'
            )
    return f'<div class="rag-card rag-card-{mode}" data-mode="{mode}">{"".join(parts)}</div>'


def doc_groups(answers: dict[str, dict]) -> list[tuple[str, list[str]]]:
    """[(group name, modes)]: modes that retrieved the same passages share one table ("all");
    the paper stack's two question encoders may retrieve different ones."""
    groups: dict[tuple, list[str]] = {}
    for mode, a in answers.items():
        if a and a["docs"]:
            groups.setdefault(tuple(d["id"] for d in a["docs"]), []).append(mode)
    if len(groups) == 1:
        return [("all", next(iter(groups.values())))]
    return [(modes[0], modes) for modes in groups.values()]


def anchors(answers: dict[str, dict]) -> dict[str, str]:
    return {m: f"rag-p-{g}-" for g, modes in doc_groups(answers) for m in modes}


def render_passages(answers: dict[str, dict], edits: tuple[str, ...] = ()) -> str:
    """The retrieved passages: rank, title (linked), text, retrieval score, p(z|x), and each mode's
    posterior over the passage given the answer."""
    groups = doc_groups(answers)
    if not groups:
        return '<div class="rag-passages rag-placeholder">The retrieved passages appear here.</div>'
    out = []
    for g, modes in groups:
        docs = answers[modes[0]]["docs"]
        corpus = answers[modes[0]]["corpus"]
        who = "" if g == "all" else f" for {' and '.join(MODE_TITLES[m] for m in modes)}"
        post_heads = "".join(
            f'<th title="{esc(POSTERIOR_HEADS[m][1])}">{MODE_TITLES[m]}<br>{POSTERIOR_HEADS[m][0]}</th>' for m in modes
        )
        rows = []
        for i, d in enumerate(docs):
            title = esc(d["title"])
            if d.get("url"):
                title = f'<a href="{esc(d["url"])}" target="_blank" rel="noopener">{title}</a>'
            tag = '<span class="rag-edited">edited by you</span>' if d["id"] in edits else ""
            posts = "".join(_prob_cell((answers[m].get("doc_posterior") or [None] * len(docs))[i]) for m in modes)
            rows.append(
                f'<tr id="rag-p-{g}-{d["rank"]}" data-id="{esc(d["id"])}"><td>{badge(d["rank"])}</td>'
                f'<td><div class="rag-ptitle">{title}{tag}</div><div class="rag-ptext">{esc(d["text"])}</div></td>'
                f'<td class="rag-num">{d["score"]:.3f}</td>{_prob_cell(d["prior"])}{posts}</tr>'
            )
        out.append(
            f'<div class="rag-passages"><h3>Retrieved passages{who} '
            f'<small>(top {len(docs)} of {esc(corpus)})</small></h3>'
            f'<table class="rag-ptable"><thead><tr><th>#</th><th>passage</th><th title="retrieval inner product '
            f'q(x)·d(z)">score<br>q(x)·d(z)</th><th title="softmax of the scores over the K passages">prior<br>p(z|x)'
            f"</th>{post_heads}</tr></thead><tbody>{''.join(rows)}</tbody></table></div>"
        )
    return "".join(out)


def _prob_cell(p: float | None) -> str:
    if p is None:
        return '<td class="rag-num">–</td>'
    return f'<td class="rag-num">{p:.3f}<div class="rag-bar"><div style="width:{100 * p:.0f}%"></div></div></td>'


def render_status(pool: PipelinePool, s: Session, pipe: Any | None = None) -> str:
    """Which stack and corpus are live (or the loading progress)."""
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
        f"({plural(len(index.corpus), 'passage')}){edits}</div>"
    )


def example_questions(corpus: Any, n: int = 6) -> list[str]:
    """Clickable questions for the live corpus: a curated list for Vital Articles (a test checks
    their articles are in it), template questions over document titles otherwise (titles made up
    for untitled CSV rows / JSONL lines are skipped)."""
    if corpus.name == VITAL_ARTICLES_NAME:
        return list(VITAL_EXAMPLES)
    titles = [t for t in dict.fromkeys(p.title for p in corpus.passages) if not re.search(r" (row|line) \d+$", t)]
    templates = ("What is {}?", "What do the documents say about {}?", "Tell me about {}.")
    return [templates[i % len(templates)].format(t) for i, t in enumerate(titles[:n])]


def corpus_choices(pool: PipelinePool, s: Session) -> list[tuple[str, str]]:
    pipe = pool.loaded(s.stack) or next((pool.loaded(n) for n in pool.loaded_stacks()), None)
    builtin = pipe.index.corpus.name if pipe else VITAL_ARTICLES_NAME
    out = [(f"{builtin} (built in)", "builtin")]
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


# ---------------------------------------------------------------- handlers


@contextmanager
def user_errors():
    """Library ValueErrors become gr.Error: a visible message, and the app keeps serving."""
    try:
        yield
    except gr.Error:
        raise
    except ValueError as e:
        raise gr.Error(str(e)) from e


def settings_from_inputs(k, num_beams, max_new_tokens, sequence_decoding) -> RagSettings:
    """RagSettings from the settings widgets' values, or a ValueError naming the bad one."""
    try:
        return RagSettings(k=int(k), num_beams=int(num_beams), max_new_tokens=int(max_new_tokens),
                           sequence_decoding=str(sequence_decoding))
    except TypeError as e:
        raise ValueError(f"settings must be numbers: {e}") from e


def check_passage_chosen(pid: object) -> None:
    if not pid:
        raise ValueError("No passage chosen: ask a question first, then pick one of its passages to edit.")


def _settings(k, num_beams, max_new_tokens, sequence_decoding) -> RagSettings:
    with user_errors():
        return settings_from_inputs(k, num_beams, max_new_tokens, sequence_decoding)


def _valid(check: Callable[[], Any]) -> dict:
    """gr.validate for one input: the library's ValueError message when `check()` raises."""
    try:
        check()
    except (ValueError, TypeError) as e:
        return gr.validate(False, str(e))
    return gr.validate(True, "")


def _validate_settings(k, num_beams, max_new_tokens, sequence_decoding) -> list[dict]:
    return [_valid(lambda: settings_from_inputs(k, num_beams, max_new_tokens, sequence_decoding))] * 4


def validate_ask(question, k, num_beams, max_new_tokens, sequence_decoding, s) -> list[dict]:
    """gradio validator of the events that ask a question. It runs before the queue (no model
    needed) and shows the library's message on the question box; a bad question then never
    reaches the outputs, which would otherwise each show an error badge. One gr.validate per
    input: question, the four settings, the session."""
    return [_valid(lambda: check_question(question)),
            *_validate_settings(k, num_beams, max_new_tokens, sequence_decoding), gr.validate(True, "")]


def validate_edit(pid, new_text, question, k, num_beams, max_new_tokens, sequence_decoding, s) -> list[dict]:
    """gradio validator of "save edit and ask again", like validate_ask: a passage must be
    chosen, its new text must not be empty, and the question must be askable."""
    return [_valid(lambda: check_passage_chosen(pid)), _valid(lambda: check_passage_text(str(pid), new_text)),
            _valid(lambda: check_question(question)),
            *_validate_settings(k, num_beams, max_new_tokens, sequence_decoding), gr.validate(True, "")]


def _answer_all(pool: PipelinePool, pipe: Any, question: str, settings: RagSettings, progress=None) -> dict:
    """The three answers, one mode at a time (so the progress bar can say which), as the JSON-able
    {"question", "stack", "corpus", "settings", "answers": {mode: Answer.to_dict()}}."""
    with user_errors():
        q = check_question(question)
    n = len(pipe.index)
    if settings.k > n:
        gr.Warning(f"This corpus has only {plural(n, 'passage')}: using K = {n} instead of {settings.k}.")
        settings = settings.merged(k=n)
    answers = {}
    for i, mode in enumerate(MODES):
        if progress:
            progress(i / len(MODES), desc=f"{MODE_TITLES[mode]}: retrieve, generate, attribute")
        with user_errors(), pool.lock:
            answers[mode] = _finite(pipe.answer(q, mode, settings).to_dict())
    return {
        "question": q, "stack": pipe.stack.name, "corpus": pipe.index.corpus.name,
        "settings": dataclasses.asdict(settings), "answers": answers,
    }


def _ask_outputs(result: dict, s: Session) -> tuple:
    """(3 answer cards, passages, raw JSON, edit-passage choices, edit text, session) for an answer."""
    answers = result["answers"]
    anc = anchors(answers)
    docs = next((a["docs"] for a in answers.values() if a["docs"]), [])
    s = dataclasses.replace(s, last_docs=tuple((d["id"], d["title"], d["text"]) for d in docs))
    choices = passage_choices(s)
    return (
        *(render_answer(answers[m], anc.get(m, "rag-p-all-")) for m in MODES),
        render_passages(answers, s.edits),
        result,
        gr.Dropdown(choices=choices, value=choices[0][1] if choices else None),
        docs[0]["text"] if docs else "",
        s,
    )


def _empty_outputs(s: Session) -> tuple:
    """The same outputs, cleared (after the corpus or the stack changed)."""
    return (
        *(render_answer(None, mode=m) for m in MODES),
        render_passages({}),
        None,
        gr.Dropdown(choices=[], value=None),
        "",
        dataclasses.replace(s, last_docs=()),
    )


def _examples(index: Any) -> gr.Dataset:
    return gr.Dataset(samples=[[q] for q in example_questions(index.corpus)])


def make_handlers(pool: PipelinePool, default_stack: str = "offline") -> dict[str, Callable]:
    """The event handlers, closed over the pool (tests call them directly)."""

    def fresh(s: Session | None) -> Session:
        return s if isinstance(s, Session) else Session(stack=default_stack)

    def on_load(s: Session | None):
        """Stream the default stack's loading progress into the status line, then say what is
        live and fill the example questions."""
        s = fresh(s)
        if pool.loaded(s.stack) is None and not pool.unavailable(s.stack):
            pool.start(s.stack)
            last = None
            while pool.loading(s.stack):
                now = render_status(pool, s)
                if now != last:
                    yield now, gr.skip(), gr.skip(), gr.skip(), s
                    last = now
                time.sleep(0.3)
        try:
            pipe, s = session_pipeline(pool, s)
        except ValueError as e:
            gr.Warning(str(e))
            yield render_status(pool, s), gr.skip(), gr.skip(), gr.skip(), s
            return
        yield (
            render_status(pool, s, pipe),
            _examples(active_index(s, pipe)),
            gr.Dropdown(choices=corpus_choices(pool, s), value=s.corpus),
            gr.Dropdown(choices=stack_choices(pool), value=s.stack),
            s,
        )

    def ask_session(question, k, num_beams, max_new_tokens, sequence_decoding, s, progress=gr.Progress()):
        """Answer in all three modes from this session's corpus (upload and edits included)."""
        s = fresh(s)
        settings = _settings(k, num_beams, max_new_tokens, sequence_decoding)
        with user_errors():
            check_question(question)
            pipe, s = session_pipeline(pool, s, progress)
        result = _answer_all(pool, pipe, question, settings, progress)
        return (render_status(pool, s, pipe), *_ask_outputs(result, s))

    def ask(
        question: str,
        k: int = 5,
        num_beams: int = 1,
        max_new_tokens: int = 32,
        sequence_decoding: str = "thorough",
        stack: str = "offline",
    ) -> dict:
        """Answer one question with RAG-Sequence, RAG-Token and closed-book over the stack's
        built-in corpus (no session state). Returns {"question", "stack", "corpus", "settings",
        "answers": {"sequence", "token", "closed-book"}}, each answer an Answer.to_dict()."""
        settings = _settings(k, num_beams, max_new_tokens, sequence_decoding)
        if stack not in STACKS:
            raise gr.Error(f"stack={stack!r} is unknown: use one of {', '.join(STACKS)}.")
        with user_errors():
            pipe = pool.get(stack)
        return _answer_all(pool, pipe, question, settings)

    def upload(files, s, progress=gr.Progress()):
        """Split the uploaded files into passages, embed them (progress bar) and answer from them."""
        s = fresh(s)
        paths = [getattr(f, "name", f) for f in (files if isinstance(files, list) else [files] if files else [])]
        if not paths:
            raise gr.Error(f"No file uploaded: choose one or more files ({', '.join(supported_extensions())}).")
        if len(paths) > MAX_UPLOAD_FILES:
            raise gr.Error(f"{len(paths)} files uploaded, over the limit of {MAX_UPLOAD_FILES}: upload fewer files.")
        total = sum(Path(p).stat().st_size for p in paths)
        if total > MAX_UPLOAD_BYTES:
            raise gr.Error(
                f"The upload is {total / 2**20:.1f} MB, over the limit of {MAX_UPLOAD_BYTES / 2**20:.0f} MB "
                "in all: upload smaller or fewer files."
            )
        names = [Path(p).name for p in paths]
        shown = ", ".join(names) if len(names) <= 3 else f"{', '.join(names[:3])} +{len(names) - 3}"
        progress(0.0, desc="Reading and splitting the files")
        with user_errors():
            corpus = load_documents(paths, name=f"Your documents: {shown}")
            base = pool.get(s.stack, lambda f, m: progress(f, desc=m))
        t0 = time.perf_counter()
        index = _embed(pool, base, corpus, progress)
        s = dataclasses.replace(
            s, corpus="upload", upload=corpus, upload_index=index, upload_stack=s.stack, edited=None, edits=()
        )
        gr.Info(f"Indexed {plural(len(corpus), 'passage')} from {plural(len(paths), 'file')} in "
                f"{time.perf_counter() - t0:.1f} s: questions are now answered from your documents.")
        return (
            render_status(pool, s, base),
            gr.Dropdown(choices=corpus_choices(pool, s), value="upload"),
            _examples(index),
            *_empty_outputs(s),
        )

    def choose_corpus(choice, s, progress=gr.Progress()):
        """Switch this session between the built-in corpus and its uploaded documents."""
        s = fresh(s)
        if choice == "upload" and s.upload is None:
            gr.Warning("No uploaded documents in this session yet: upload files first.")
            choice = "builtin"
        if choice not in ("builtin", "upload"):
            raise gr.Error(f"corpus {choice!r} is unknown: choose the built-in corpus or your documents.")
        if s.edits and choice != s.corpus:
            gr.Info("Your passage edits were dropped with the corpus switch.")
        s = dataclasses.replace(s, corpus=choice, edited=None, edits=())
        with user_errors():
            pipe, s = session_pipeline(pool, s, progress)
        return (
            render_status(pool, s, pipe),
            gr.Dropdown(choices=corpus_choices(pool, s), value=choice),
            _examples(active_index(s, pipe)),
            *_empty_outputs(s),
        )

    def choose_stack(stack, s, progress=gr.Progress()):
        """Switch this session's stack, loading it once (lazily, with progress). An unavailable
        stack is refused at once with the reason, and the session stays where it was."""
        s = fresh(s)
        if stack not in STACKS:
            raise gr.Error(f"stack={stack!r} is unknown: use one of {', '.join(STACKS)}.")
        stay = (render_status(pool, s), gr.Dropdown(choices=stack_choices(pool), value=s.stack),
                gr.skip(), *[gr.skip()] * (len(_empty_outputs(s)) - 1), s)
        reason = pool.unavailable(stack)
        if reason:
            gr.Warning(f"The {stack} stack is unavailable here: {reason}. Staying on the {s.stack} stack.")
            return stay
        if stack == s.stack:
            return stay
        if s.edits:
            gr.Info("Your passage edits were dropped with the stack switch (the new retriever re-embeds passages).")
        try:
            pipe, new = session_pipeline(pool, dataclasses.replace(s, stack=stack, edited=None, edits=()), progress)
        except ValueError as e:
            gr.Warning(f"{e} Staying on the {s.stack} stack.")
            return stay
        return (
            render_status(pool, new, pipe),
            gr.Dropdown(choices=stack_choices(pool), value=stack),
            _examples(active_index(new, pipe)),
            *_empty_outputs(new),
        )

    def pick_passage(pid, s):
        """Put the chosen passage's text into the edit box."""
        return next((text for i, _, text in fresh(s).last_docs if i == pid), "")

    def edit_passage(pid, new_text, question, k, num_beams, max_new_tokens, sequence_decoding, s,
                     progress=gr.Progress()):
        """Replace one passage's text in this session's copy of the index (re-embedded), then ask
        again: the answer follows the document, the models are unchanged."""
        s = fresh(s)
        with user_errors():
            check_passage_chosen(pid)
        settings = _settings(k, num_beams, max_new_tokens, sequence_decoding)
        with user_errors():
            check_question(question)
            pipe, s = session_pipeline(pool, s, progress)
            progress(0.0, desc="Re-embedding the edited passage")
            with pool.lock:
                edited = pipe.index.with_edited_passage(pid, new_text, pipe.stack.ctx_encoder)
        s = dataclasses.replace(s, edited=edited, edits=tuple(dict.fromkeys((*s.edits, pid))))
        pipe = pipe.with_index(edited)
        result = _answer_all(pool, pipe, question, settings, progress)
        gr.Info(f"Passage {pid!r} edited in your copy of the index (the shared index and the models are unchanged).")
        return (render_status(pool, s, pipe), *_ask_outputs(result, s))

    def reset_edits(s):
        """Drop this session's passage edits (back to the unedited corpus)."""
        s = dataclasses.replace(fresh(s), edited=None, edits=())
        return (render_status(pool, s), *_empty_outputs(s))

    return {
        "on_load": on_load, "ask_session": ask_session, "ask": ask, "upload": upload,
        "choose_corpus": choose_corpus, "choose_stack": choose_stack, "pick_passage": pick_passage,
        "edit_passage": edit_passage, "reset_edits": reset_edits,
    }


# ---------------------------------------------------------------- the page

INTRO = """<div class="rag-header"><h1>Retrieval-Augmented Generation, step by step</h1>
<p>Ask a question. A retriever finds the <i>K</i> passages closest to it; a small generator reads each one and
answers (<b>RAG-Sequence</b>: one passage per answer; <b>RAG-Token</b>: a new passage mix at every token). The
closed-book answer uses no passages at all. Every answer token is coloured by the passage it leans on most
(Lewis et al. 2020,
<a href="https://arxiv.org/abs/2005.11401" target="_blank" rel="noopener">arXiv:2005.11401</a>).</p></div>"""

HOW_IT_WORKS = r"""
### Retrieve, then generate

RAG couples a **parametric memory** (a generator's weights) with a **non-parametric memory** (an index of
passages). For a question $x$ it runs four steps, each timed under every answer:

1. **encode** the question into a vector $q(x)$;
2. **retrieve** the top-$K$ passages $z$ by inner product $q(x)\cdot d(z)$, with prior
   $p(z|x) = \mathrm{softmax}_z\, q(x)\cdot d(z)$ over those $K$;
3. **generate** with the generator $p(y_i \mid x, z, y_{<i})$ run once per passage, combined in one of two ways;
4. **attribute** each answer token to the passages (the heatmap).

**RAG-Sequence** uses one passage for the whole answer, mixing once per sequence:

$$p_{\text{RAG-Sequence}}(y|x) = \sum_{z \in \text{top-}K} p(z|x) \prod_{i=1}^{N} p(y_i \mid x, z, y_{<i})$$

**RAG-Token** may draw each token from a different passage, mixing at every step:

$$p_{\text{RAG-Token}}(y|x) = \prod_{i=1}^{N} \sum_{z \in \text{top-}K} p(z|x)\, p(y_i \mid x, z, y_{<i})$$

The **closed-book** baseline is the generator alone, $\prod_i p(y_i \mid x, y_{<i})$: what it memorised.
Each card's *score* is $\log p(y|x)$ of its answer under its own model. RAG-Sequence decoding is either
*thorough* (every candidate answer rescored under every passage, exact) or *fast* (a candidate gets
$p(y|x,z) \approx 0$ from passages that did not produce it, paper section 2.5).

### Reading the heatmap

Rows are answer tokens, columns the retrieved passages (coloured and numbered like the passage table).

* **RAG-Token**: row $i$ is $p(z \mid x, y_i, y_{<i}) \propto p(z|x)\, p(y_i \mid x, z, y_{<i})$: how much each
  passage explains token $i$. This is the paper's Figure 2: name tokens usually lock onto the passage that
  contains them, while function words spread out.
* **RAG-Sequence**: row $i$ is the running posterior $p(z \mid x, y_{\le i}) \propto p(z|x) \prod_{j \le i}
  p(y_j \mid x, z, y_{<j})$: which passage the answer so far is consistent with. Its last row is the answer's
  passage posterior, shown in the passage table.

A token is coloured by its darkest cell; hover it to see the passage and the probability, click it to jump to
the passage.

### Hot-swapping knowledge

The index is memory you can replace without retraining. Upload your own documents (they are split into
~100-word passages and embedded, in your session only), or edit a retrieved passage and ask again: the answer
follows the edited text while the models stay the same (the paper's index hot-swap, section 4.5, in miniature).
"""


def _diagram() -> str:
    try:
        svg = DIAGRAM_PATH.read_text(encoding="utf-8")
    except OSError:
        return ""
    return f'<div class="rag-diagram">{svg}</div>'


def build_app(pipelines: Any = None, *, default_stack: str | None = None,
              unavailable: Callable[[str], str | None] = default_unavailable) -> gr.Blocks:
    """The Blocks app over `pipelines`: a RagPipeline, a factory(stack, progress) -> RagPipeline,
    or a PipelinePool (None: the default factory, Vital Articles). Queue configured; launch with
    `launch(demo, ...)` (theme and CSS are launch() arguments in gradio 6)."""
    pool = PipelinePool.of(pipelines if pipelines is not None else stack_factory(), unavailable)
    if default_stack is None:
        default_stack = next(iter(pool.loaded_stacks()), "offline")
    h = make_handlers(pool, default_stack)
    settings0 = RagSettings()

    with gr.Blocks(title="RAG demo: retrieve, then generate") as demo:
        session = gr.State(None, time_to_live=STATE_TTL_S)
        gr.HTML(INTRO)
        status = gr.HTML(render_status(pool, Session(stack=default_stack)), elem_id="rag-status")
        with gr.Tabs():
            with gr.Tab("Ask", id="ask"):
                with gr.Row(equal_height=False):
                    with gr.Column(scale=3):
                        question = gr.Textbox(
                            label="Question", placeholder="Who painted The Starry Night?", lines=1,
                            max_length=MAX_QUESTION_CHARS + 1000, elem_id="rag-question",
                            info=f"One or two sentences, up to {MAX_QUESTION_CHARS} characters.",
                        )
                        ask_btn = gr.Button("Ask", variant="primary", elem_id="rag-ask")
                        examples = gr.Dataset(
                            components=[question], samples=[], label="Example questions (click one to ask it)",
                            elem_id="rag-examples", samples_per_page=8,
                        )
                    with gr.Column(scale=2):
                        corpus_dd = gr.Dropdown(
                            choices=[(f"{VITAL_ARTICLES_NAME} (built in)", "builtin")], value="builtin",
                            label="Corpus (the non-parametric memory)", elem_id="rag-corpus",
                        )
                        stack_dd = gr.Dropdown(
                            choices=stack_choices(pool), value=default_stack, label="Model stack",
                            elem_id="rag-stack",
                        )
                        with gr.Accordion("Upload your own documents", open=False, elem_id="rag-upload-acc"):
                            files = gr.File(
                                file_count="multiple", file_types=list(supported_extensions()),
                                label=f"{', '.join(supported_extensions())}; up to {MAX_UPLOAD_BYTES / 2**20:.0f} MB "
                                "in all", elem_id="rag-files",
                            )
                            upload_btn = gr.Button("Split, embed and use these documents", elem_id="rag-upload")
                        with gr.Accordion("Settings", open=False, elem_id="rag-settings"):
                            k = gr.Slider(1, MAX_K, value=settings0.k, step=1, label="Passages K", elem_id="rag-k")
                            beams = gr.Slider(1, MAX_BEAMS, value=settings0.num_beams, step=1,
                                              label="Beam size (1 = greedy)", elem_id="rag-beams")
                            max_new = gr.Slider(1, MAX_NEW_TOKENS, value=settings0.max_new_tokens, step=1,
                                                label="Max new tokens", elem_id="rag-max-new")
                            decoding = gr.Radio(list(SEQUENCE_DECODINGS), value=settings0.sequence_decoding,
                                                label="RAG-Sequence decoding",
                                                info="thorough: rescore every candidate under every passage; "
                                                "fast: skip those passes (paper §2.5)", elem_id="rag-decoding")
                with gr.Row(equal_height=True):
                    cards = [gr.HTML(render_answer(None, mode=m), elem_id=f"rag-answer-{m}") for m in MODES]
                passages = gr.HTML(render_passages({}), elem_id="rag-passages")
                with gr.Accordion("Edit a retrieved passage, then ask again", open=False, elem_id="rag-edit-acc"):
                    gr.Markdown(
                        "Change what a passage says (e.g. swap the painter's name) and ask the same question: "
                        "the answer follows the document, the models are unchanged. The edit lives in your "
                        "session's copy of the index only."
                    )
                    edit_pick = gr.Dropdown(choices=[], label="Passage", elem_id="rag-edit-pick")
                    edit_text = gr.Textbox(lines=4, label="Passage text", elem_id="rag-edit-text")
                    with gr.Row():
                        edit_btn = gr.Button("Save edit and ask again", variant="primary", elem_id="rag-edit")
                        reset_btn = gr.Button("Undo my edits", elem_id="rag-reset")
                with gr.Accordion("Raw answers (JSON, as the /ask API returns them)", open=False):
                    raw = gr.JSON(elem_id="rag-json")
            with gr.Tab("How it works", id="how"):
                gr.HTML(_diagram())
                gr.Markdown(
                    HOW_IT_WORKS,
                    latex_delimiters=[{"left": "$$", "right": "$$", "display": True},
                                      {"left": "$", "right": "$", "display": False}],
                )

        # ------------------------------------------------------------ events
        settings_in = [k, beams, max_new, decoding]
        answer_out = [*cards, passages, raw, edit_pick, edit_text, session]
        model = {"concurrency_id": "model"}
        demo.load(
            h["on_load"], inputs=[session], outputs=[status, examples, corpus_dd, stack_dd, session],
            api_name="status", concurrency_limit=None, show_progress="hidden",
        )
        gr.on(
            [ask_btn.click, question.submit], h["ask_session"], inputs=[question, *settings_in, session],
            outputs=[status, *answer_out], api_name="ask_session", validator=validate_ask, **model,
        )
        examples.click(lambda x: x[0], inputs=[examples], outputs=[question], api_visibility="private",
                       queue=False).then(
            h["ask_session"], inputs=[question, *settings_in, session], outputs=[status, *answer_out],
            api_visibility="private", **model,
        )
        upload_btn.click(
            h["upload"], inputs=[files, session], outputs=[status, corpus_dd, examples, *answer_out],
            api_name="upload", show_progress_on=status, **model,
        )
        corpus_dd.input(
            h["choose_corpus"], inputs=[corpus_dd, session], outputs=[status, corpus_dd, examples, *answer_out],
            api_name="choose_corpus", show_progress_on=status, **model,
        )
        stack_dd.input(  # not in the model group: a first load takes minutes and must not block questions
            h["choose_stack"], inputs=[stack_dd, session], outputs=[status, stack_dd, examples, *answer_out],
            api_name="choose_stack", show_progress_on=status, concurrency_limit=None,
        )
        edit_pick.input(h["pick_passage"], inputs=[edit_pick, session], outputs=[edit_text],
                        api_visibility="private", queue=False)
        edit_btn.click(
            h["edit_passage"], inputs=[edit_pick, edit_text, question, *settings_in, session],
            outputs=[status, *answer_out], api_name="edit_passage", validator=validate_edit, **model,
        )
        reset_btn.click(h["reset_edits"], inputs=[session], outputs=[status, *answer_out], api_name="reset_edits",
                        show_progress_on=status)
        gr.api(h["ask"], api_name="ask", **model)

    demo.queue(default_concurrency_limit=QUEUE_CONCURRENCY, max_size=QUEUE_MAX_SIZE)
    demo.rag_pool = pool  # for app.py (start loading) and tests
    return demo


def theme() -> gr.themes.Base:
    """gradio's default theme in indigo, with the system's sans-serif font (gradio's bundled
    web fonts are subsets: bold text falls back glyph by glyph and looks broken)."""
    return gr.themes.Default(
        primary_hue="indigo",
        font=["Segoe UI", "Roboto", "Helvetica Neue", "Arial", "Liberation Sans", "DejaVu Sans", "sans-serif"],
    )


def launch(demo: gr.Blocks, **kwargs) -> Any:
    """demo.launch with the app's CSS and theme (launch() arguments in gradio 6)."""
    kwargs.setdefault("css_paths", [CSS_PATH])
    kwargs.setdefault("theme", theme())
    kwargs.setdefault("show_error", True)
    return demo.launch(**kwargs)
