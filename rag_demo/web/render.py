"""The page's HTML, rendered from the library's answer dicts (pure: dicts in, HTML out).

Owns how an answer looks: the answer cards (text, score, timings, each token coloured by the
passage it leans on, the tokens x passages heatmap of the paper's Fig. 2, the token inspector),
the cards while they stream, the retrieved passages table and the "answer without it"
comparison. Takes `Answer.to_dict()`-shaped dicts and recomputes no math; imports neither torch
nor gradio, so every renderer is testable on a hand-made dict.
"""
from __future__ import annotations

import html
import json
import math
from functools import lru_cache
from pathlib import Path
from typing import Any

from rag_demo.config import CUT_STOPS, MODE_COLOURS, MODE_TITLES

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
# Passage colours by rank: mid-tone, so dark text on them reads in light and dark mode alike.
PALETTE = (
    "#7fb3ff", "#ffb366", "#7dd87d", "#ff8a8a", "#c9a6ff", "#d9b38c", "#ff9ed8", "#bdbdbd", "#e0e060", "#6fdbe8",
    "#b3d1ff", "#ffd1a3", "#b5ebb5", "#ffbdbd", "#e0ccff", "#ead2bb", "#ffcbeb", "#e0e0e0", "#f0f09a", "#a8edf5",
)
# Why an answer stopped before its end-of-sequence token (Answer.stopped), as shown on the card.
CUT_REASONS = {
    "max_new_tokens": "max new tokens reached",
    "time_limit": "time limit reached",
    "cancelled": "stopped",
}


def esc(x: Any) -> str:
    return html.escape(str(x), quote=True)


def colour(rank: int) -> str:
    return PALETTE[(rank - 1) % len(PALETTE)]


def _mix(c: str, p: float, floor: float = 0.0) -> tuple[str, bool]:
    """(CSS background for colour c at strength p, whether text on it must be dark)."""
    pct = round(100 * max(floor, min(1.0, p)))
    return f"color-mix(in srgb, {c} {pct}%, transparent)", pct >= 55


def link_target(url: object) -> bool:
    """Whether a passage's url may become a link: http(s) only (an uploaded file's url column could
    say javascript:... or data:...)."""
    return isinstance(url, str) and url.strip().lower().startswith(("http://", "https://"))


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


def json_safe(x: Any) -> Any:
    """JSON-safe copy: non-finite floats become None."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_safe(v) for v in x]
    return x


def render_timings(t: dict[str, float], expected: float | None = None) -> str:
    """A card's seconds per stage, its total, and beside it what it was expected to take
    (Answer.expected_seconds: priced before it ran, from its prompts and what was kept then)."""
    keys = [k for k in STAGES if k in t] + [k for k in t if k not in STAGES and k != "total"]
    chips = [f"<span>{esc(k)} {fmt_seconds(t[k])}</span>" for k in keys]
    if "total" in t:
        chips.append(f'<span class="rag-total">total {fmt_seconds(t["total"])}</span>')
    if expected is not None:
        chips.append(f'<span class="rag-expected" data-expected="{expected:.3f}" title="what the cost model expected '
                     f'this answer to take, priced before it ran (a typical answer length; kept states counted)">'
                     f'expected {fmt_seconds(expected)}</span>')
    return f'<div class="rag-timings" title="seconds per stage">{"".join(chips)}</div>'


def render_tokens(a: dict, anchor: str = "rag-p-") -> str:
    """Answer tokens coloured by their most responsible passage; a rank badge starts each run;
    hovering a token names the passage and its posterior; clicking opens its inspector. A piece
    that is only whitespace (a space the tokenizer kept apart) is shown with the token after it,
    so no clickable token is blank; its own row stays in the heatmap."""
    docs, rows = a["docs"], a["token_doc_posteriors"]
    if not a["tokens"] or not rows:
        return '<div class="rag-tokens rag-placeholder">no tokens</div>'
    spans, prev, lead = [], None, ""
    items = list(zip(a["tokens"], rows, a["top_docs"], strict=False))
    for i, (tok, row, j) in enumerate(items):
        if not tok.strip() and i + 1 < len(items):  # a bare space: it opens the next token's text
            lead += tok
            continue
        tok, lead = lead + tok, ""
        d = docs[j]
        bg, dark = _mix(colour(d["rank"]), row[j], floor=0.35)
        tip = f"{tok.strip()!r} ← [{d['rank']}] {d['title']}  p = {row[j]:.2f}"
        if a.get("inspector"):
            tip += "  (click: what each passage proposed here)"
        sup = f"<sup>{d['rank']}</sup>" if j != prev else ""
        cls = "rag-tok rag-dark" if dark else "rag-tok"
        spans.append(
            f'<a class="{cls}" href="#{anchor}{d["rank"]}" data-rank="{d["rank"]}" data-i="{i}" '
            f'style="background:{bg}" title="{esc(tip)}">{sup}{esc(tok)}</a>'
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


def fmt_p(p: float) -> str:
    """A probability in a few characters: 0.42, 0.003, 2e-05."""
    return f"{p:.2f}" if p >= 0.01 else (f"{p:.3f}" if p >= 0.001 else f"{p:.0e}")


def render_inspector(a: dict) -> str:
    """The token inspector of a RAG answer: one hidden panel per token (the page's script shows
    the one whose token was clicked). A row per passage z: p(z|x), p(y_i | x, z, y_<i), the
    heatmap's posterior for this token, and the tokens z alone would have put here next; for
    RAG-Token, the mixture's own top tokens under the table. Numbers from Answer.inspector."""
    ins, docs, rows = a.get("inspector") or [], a["docs"], a["token_doc_posteriors"]
    if not ins or len(ins) != len(rows):
        return ""
    post_head = {"token": "p(z | x, y_i, y_<i)", "sequence": "p(z | x, y_≤i)"}[a["mode"]]
    panels = []
    for i, (tok, info, row) in enumerate(zip(a["tokens"], ins, rows)):
        body = []
        for z, d in enumerate(docs):
            top = " · ".join(f"<code>{esc(show_token(t))}</code> {fmt_p(p)}" for t, p in info["top"][z])
            best = ' class="rag-max"' if z == a["top_docs"][i] else ""
            body.append(f'<tr{best}><td>{badge(d["rank"], d["title"])}</td><td>{fmt_p(d["prior"])}</td>'
                        f'<td>{fmt_p(info["p_token"][z])}</td><td class="rag-insp-post">{row[z]:.3f}</td>'
                        f"<td>{top}</td></tr>")
        mix = ""
        if info.get("mix"):
            mix = ('<div class="rag-note">The mixture Σ_z p(z|x) p(· | x, z, y_&lt;i) proposed: '
                   + " · ".join(f"<code>{esc(show_token(t))}</code> {fmt_p(p)}" for t, p in info["mix"]) + "</div>")
        panels.append(
            f'<div class="rag-insp" data-i="{i}" hidden><div class="rag-sub">Token {i + 1}: '
            f"<code>{esc(show_token(tok))}</code> <button class=\"rag-insp-close\" type=\"button\">close</button></div>"
            f'<div class="rag-heat-wrap"><table class="rag-insp-table"><thead><tr><th>passage z</th><th>p(z|x)</th>'
            f"<th>p(y_i | x, z, y_&lt;i)</th><th>{esc(post_head)}</th><th>z alone would say next</th></tr></thead>"
            f'<tbody>{"".join(body)}</tbody></table></div>{mix}</div>'
        )
    return f'<div class="rag-inspector">{"".join(panels)}</div>'


# What the words of a card's decoding line mean (its tooltip), in the order they can appear.
DECODING_TERMS = (
    ("greedy", "greedy: the most likely next token at every step"),
    ("beam=", "beam=B: beam search keeping the B most likely answers so far at every step"),
    ("thorough", "thorough: every candidate answer rescored under every passage (the paper's exact RAG-Sequence)"),
    ("fast", "fast: a candidate counted only under the passages whose own search wrote it (paper §2.5)"),
    ("with each doc's drafts", "with each doc's drafts: RAG-Token also weighed each passage's own candidate answers "
     "and kept the one its exact log p(y|x) ranks first (a reader aid)"),
    ("drafts stopped", "drafts stopped: the time limit or a cancel came before the passages' drafts were weighed, "
     "so the mixture's own answer stands"),
    ("thorough stopped", "thorough stopped: the time limit came before the rescoring, so the fast ranking stands"),
)


def decoding_tip(decoding: str) -> str:
    """The tooltip of a card's decoding line: what each of its words means."""
    return "; ".join(tip for word, tip in DECODING_TERMS if word in decoding)


def fmt_lp(lp: float | None) -> str:
    return f"{lp:.3f}" if lp is not None and math.isfinite(lp) else "-inf"


# What a card's head says when a stop made its mode run something other than its settings name
# (Answer.fell_back): (the head's line, what happened, on hover).
FELL_BACK = {
    "fast_ranking": ("Stopped early: ranked the fast way, not as the paper does",
                     "The time limit (or Stop) came before every candidate was rescored under every passage "
                     "(thorough RAG-Sequence), so the candidates were ranked the fast way: each counted only under "
                     "the passages that wrote it. “Answer this mode in full” runs it again with the whole time limit."),
    "no_drafts": ("Stopped early: the passages' drafts were not weighed",
                  "The time limit (or Stop) came before RAG-Token weighed each passage's own drafts, so the "
                  "mixture's own answer stands. “Answer this mode in full” runs it again with the whole time limit."),
}


def card_head(mode: str, fell_back: str = "") -> str:
    """A card's head: the mode's name in its colour (config.MODE_COLOURS, the figures' colours too)
    and its formula; and, when a stop made the mode run something else (`fell_back`, Answer's),
    a line saying so."""
    line, why = FELL_BACK.get(fell_back, (f"Stopped early: ran {fell_back} instead", "")) if fell_back else ("", "")
    note = (f'<div class="rag-fell-back" data-fell-back="{esc(fell_back)}" role="status" title="{esc(why)}">'
            f"{esc(line)}</div>" if fell_back else "")
    return (f'<div class="rag-card-head" style="border-top: 4px solid {MODE_COLOURS[mode]}"><span class="rag-mode" '
            f'style="color: {MODE_COLOURS[mode]}">{esc(MODE_TITLES[mode])}</span>'
            f'<span class="rag-formula">{esc(MODE_FORMULAS[mode])}</span>{note}</div>')


def can_continue(a: dict) -> bool:
    """Whether a card offers "Answer this mode in full": cut before its end (time limit, Stop), or
    finished by something other than what its settings name (Answer.fell_back)."""
    return a.get("stopped") in ("time_limit", "cancelled") or bool(a.get("fell_back"))


def render_answer(a: dict | None, anchor: str = "rag-p-", mode: str | None = None, continuable: bool = True) -> str:
    """One answer card: answer text, score and timings, then coloured tokens and the heatmap.
    `continuable`: a cut card gets its "answer in full" button (not while the run that cut it is still
    writing the page: the button reads the last answers, which are written at the run's end)."""
    mode = a["mode"] if a else mode
    head = card_head(mode, (a or {}).get("fell_back") or "")
    if a is None:
        wait = '<div class="rag-placeholder">Ask a question to see this answer.</div>'
        return f'<div class="rag-card rag-card-{mode}">{head}{wait}</div>'
    text = a["text"].strip()
    cut = CUT_REASONS.get(a.get("stopped") or "")
    if a.get("stopped") == "time_limit" and a.get("time_share_s"):  # the modes share the server's limit
        cut = f"this mode's share of the time limit ({a['time_share_s']:.0f} s) reached"
    mark = f'<span class="rag-cut" title="cut: {esc(cut)}">…</span>' if cut else ""
    # cut before it said anything (a busy server's time limit): say so, not "(empty answer)"
    empty = f"(no answer: {cut})" if cut else "(empty answer)"
    answer = f'<div class="rag-answer">{esc(text)}{mark}</div>' if text else (
        f'<div class="rag-answer rag-empty">{esc(empty)}</div>'
    )
    # RagSettings.recase_question: the generator read the question cased as the passages write it
    read = (f' <span class="rag-read-as" title="what the generator read: the question cased as the retrieved '
            f'passages write its words">(read as: {esc(a["read_question"])})</span>' if a.get("read_question") else "")
    asked = (f'<div class="rag-asked" title="the question this answer is for">Q: {esc(a["question"])}{read}</div>'
             if a.get("question") else "")
    lp_s = fmt_lp(a["sequence_logprob"])
    k = f" · K = {plural(len(a['docs']), 'passage')}" if a["docs"] else ""
    stop = f' · <span class="rag-cut-note">cut: {esc(cut)}</span>' if cut else ""
    meta = (
        f'<div class="rag-meta">score <code title="log p(y|x): the log-probability of this answer under this '
        f'mode\'s model (closer to 0 is more probable)">log p(y|x) = {lp_s}</code> · <span class="rag-decoding" '
        f'title="{esc(decoding_tip(a["decoding"]))}">{esc(a["decoding"])}</span>{k}{stop}</div>'
    )
    cues = "".join(f'<div class="rag-cue" data-cue="{esc(c["kind"])}">{esc(c["text"])}</div>' for c in a.get("cues") or [])
    parts = [head, render_preset(a.get("settings")), render_retriever(a), asked, answer, render_confidence(a), cues, meta,
             render_timings(a["timings"], a.get("expected_seconds"))]
    if continuable and can_continue(a):  # cut, or finished another way: it can be answered in full
        parts.append(f'<button class="rag-continue-btn" type="button" data-mode="{mode}" title="answer this mode '
                     f'again from the start over the same passages, with the whole time limit for it">'
                     f'Answer this mode in full</button>')
    if mode == "closed-book":
        parts.append(
            '<div class="rag-note">No passages: the generator answers from what its weights memorised '
            "(the paper's parametric-only baseline). Compare it with the two RAG answers.</div>"
        )
    else:
        parts.append('<div class="rag-sub">Where each token came from (click a token to inspect it)</div>')
        parts.append(render_tokens(a, anchor))
        parts.append(render_inspector(a))
        parts.append(
            f'<details class="rag-heat-details"><summary>Heatmap: tokens × passages</summary>{render_heatmap(a)}</details>'
        )
        if a.get("candidates"):
            cands = "".join(
                f"<li><code>{'≤ ' if c.get('upper_bound') else '≥ ' if c.get('lower_bound') else ''}"
                f"{fmt_lp(c['logprob'])}</code> "
                f"{esc(c['text'].strip() or '(empty)')}</li>"
                for c in a["candidates"]
            )
            how = ("Candidates, each scored by the passages that wrote it (≥: at least this; the chosen one's score "
                   "is the card's)"
                   if a["decoding"].startswith("fast") else
                   "Candidates: its beams and each passage's drafts, ranked by RAG-Token log p(y|x) (≤ marks an "
                   "upper bound: that candidate left the race once it could no longer win)" if mode == "token"
                   else "Candidates rescored under every passage")
            parts.append(
                f"<details><summary>{how} ({len(a['candidates'])}, {esc(a['decoding'])})</summary>"
                f'<ol class="rag-note">{cands}</ol></details>'
            )
    return f'<div class="rag-card rag-card-{mode}" data-mode="{mode}">{"".join(parts)}</div>'


def render_confidence(a: dict) -> str:
    """The probability that this answer is right (Answer.confidence, rag_demo/confidence.py), or
    why there is none: a number only where a model was fitted for this stack, preset and mode."""
    p = a.get("confidence")
    if a.get("stopped") in CUT_STOPS:
        by = {"max_new_tokens": " by max new tokens", "time_limit": " by the time limit", "cancelled": " by Stop"}
        return ('<div class="rag-confidence" data-confidence="" title="a cut answer\'s numbers describe a half-made '
                f'answer: no confidence is given">Confidence: cut{by[a["stopped"]]}, not rated</div>')
    q = a.get("confidence_model") or {}
    why = ("the probability that this answer is right, from its own numbers"
           + (f" ({', '.join(q['features'])})" if q.get("features") else "")
           + (f", by a logistic regression fitted on {q['fitted_questions']} questions of this preset and mode "
              f"(the calibrate split of the two labelled question files), at K 5 over the built-in corpus with "
              f"the dense retriever; on {q['questions']} others it never saw (the report "
              f"split) its 'probably wrong' cue caught "
              f"{100 * q['recall']:.0f}% of the wrong answers at {100 * q['precision']:.0f}% precision, AUROC "
              f"{q['auroc']:.2f}" if q else ", by a logistic regression fitted on one split of the questions"))
    if p is None:
        return ('<div class="rag-confidence" data-confidence="" title="no confidence model was fitted for this '
                'stack, preset and mode">Confidence: not calibrated for these settings</div>')
    level = "low" if any(c.get("kind") == "probably_wrong" for c in a.get("cues") or []) else (
        "high" if p >= 0.7 else "mid")
    outside = q.get("outside") or []
    note = (f'<span class="rag-conf-outside"> (fitted elsewhere: this answer used {esc("; ".join(outside))}, so '
            'this number and its cue may not hold)</span>' if outside else "")
    return (f'<div class="rag-confidence rag-conf-{level}" data-confidence="{p:.3f}" '
            f'data-outside="{len(outside)}" title="{esc(why)}">'
            f'Confidence it is right: <b>{100 * p:.0f}%</b>{note}</div>')


def render_retriever(a: dict) -> str:
    """A card's note when its passages did not come from the dense index: while that index is
    built in the background, BM25 chose them (Answer.retriever says so, and how far the build was)."""
    label = a.get("retriever") or ""
    if not label.startswith("bm25"):
        return ""
    return (f'<div class="rag-cue rag-retriever" data-cue="retriever" data-retriever="{esc(label)}">Passages retrieved '
            f"by <b>BM25</b> (they share the question's words), not by the dense retriever: <code>{esc(label)}</code>. "
            "p(z|x) is still the dense encoders' softmax over them. Ask again once the status line says the dense "
            "index is complete, to see retrieval by meaning.</div>")


TRAINED_META = Path(__file__).resolve().parents[2] / "assets" / "trained" / "meta.json"


@lru_cache(maxsize=1)
def trained_parts(meta_path: Path = TRAINED_META) -> str:
    """What the shipped trained weights changed, from their meta (models/trained.py writes it): "the
    generator", or "the question map and the generator" when a map ships too."""
    try:
        meta = json.loads(Path(meta_path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return "nothing yet: python -m rag_demo train"
    files = meta.get("files", {})
    parts = [name for name, there in (("the question map", any(f.startswith("question_map") for f in files)),
                                      ("the generator", any(f.startswith("adapter/") for f in files))) if there]
    stored = (meta.get("stages", {}).get("reader") or {}).get("stored") or {}
    lost = stored.get("heldout_loss") or {}
    shipped = next((v for k, v in lost.items() if "shipped" in k), None)
    if stored.get("tune") == "full" and stored.get("rank") and shipped is not None and "trained" in lost:
        # a full fine-tune ships as its best low-rank approximation: say what that costs
        parts = [p if p != "the generator" else
                 (f"the generator, as a rank-{stored['rank']} approximation of its full fine-tune (held-out loss "
                  f"{shipped:.3f} against {lost['trained']:.3f} as trained)") for p in parts]
    return " and ".join(parts) or "nothing yet: python -m rag_demo train"


def render_preset(settings: dict | None) -> str:
    """Which preset produced a card (the paper's algorithm alone, with the reader aids, or trained),
    which weights answered (base or trained: said on every card), and any knob changed from the
    preset, named on hover and after the preset."""
    if not settings:
        return ""
    changed = {k: v for k, v in (settings.get("changed") or {}).items() if k != "weights"}
    aids = settings.get("aids_on") or []
    weights = settings.get("weights", "base")
    tip = ("the paper's RAG: the retriever's own p(z|x), no reader aid" if settings["preset"] in ("paper", "trained")
           and not aids else f"reader aids on: {', '.join(aids)}" if aids else "no reader aid on")
    more = f" (changed: {', '.join(f'{k}={v}' for k, v in changed.items())})" if changed else ""
    said = (f"trained weights ({trained_parts()} fine-tuned: python -m rag_demo train)"
            if weights == "trained" else "base weights (as published)")
    return (f'<div class="rag-preset" data-preset="{esc(settings["preset"])}" data-weights="{esc(weights)}" '
            f'title="{esc(tip)}">{esc(settings["preset_title"])}{esc(more)} · <span class="rag-weights">{esc(said)}'
            '</span></div>')


def render_partial(a: dict | None, mode: str) -> str:
    """An answer card while it is decoded (streaming; RagPipeline.partial_answer's dict, or None
    before its mode starts): the answer so far with a caret, RAG-Token's tokens coloured and its
    heatmap growing row by row; RAG-Sequence's K drafts, one per passage, then the rescoring."""
    head = card_head(mode)
    if a is None:
        return (f'<div class="rag-card rag-card-{mode} rag-card-partial" data-mode="{mode}" data-partial="waiting">'
                f'{head}<div class="rag-placeholder">Waiting for its turn ...</div></div>')
    caret = '<span class="rag-caret" aria-hidden="true">▍</span>'
    parts = [head]
    if a.get("phase") == "reading":
        what = ("Reading the question (no passages) ..." if mode == "closed-book" else
                f"Reading the question with each of the {plural(a.get('k', 0), 'passage')} (one prompt per passage) ...")
        return (f'<div class="rag-card rag-card-{mode} rag-card-partial" data-mode="{mode}" data-partial="0">'
                f'{head}<div class="rag-placeholder">{esc(what)}</div></div>')
    if mode == "sequence":
        rescoring = a.get("phase") == "rescoring"
        what = ("Each passage has written its candidate; now every candidate is scored under every passage "
                "and the mixture picks: p(y|x) = Σ_z p(z|x) p(y|x,z).") if rescoring else (
                "Each passage writes its own candidate answer (one search per passage) ...")
        rows = "".join(
            f'<li>{badge(d["rank"], d["title"])} <span class="rag-draft">{esc(d["text"].strip())}</span>'
            f'{"" if d["done"] else caret}</li>' for d in a.get("drafts", [])
        )
        parts += [f'<div class="rag-sub">{esc(what)}</div>', f'<ol class="rag-drafts">{rows}</ol>']
    else:
        text = a["text"].strip()
        parts.append(f'<div class="rag-partial-answer">{esc(text)}{caret}</div>')
        if mode == "token" and a.get("token_doc_posteriors"):
            parts.append('<div class="rag-sub">Where each token came from (so far)</div>')
            parts.append(render_tokens(a))
            parts.append(f"<details open><summary>Heatmap: tokens × passages</summary>{render_heatmap(a)}</details>")
    n = len(a.get("token_ids", []))
    return (f'<div class="rag-card rag-card-{mode} rag-card-partial" data-mode="{mode}" data-partial="{n}">'
            f'{"".join(parts)}</div>')
