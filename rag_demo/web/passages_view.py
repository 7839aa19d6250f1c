"""The passages' side of the page: the retrieved passages with each mode's p(z|x) and posterior,
the words each answer copied marked in its passage, the sentences the generator read, the
passages just missed, why the two RAG answers agree or differ, and a passage taken away.
Pure functions of the answer dicts, like render.py.
"""

from __future__ import annotations

import re

from rag_demo.config import MODE_TITLES
from rag_demo.knowledge.chunking import split_sentences
from rag_demo.web.render import (
    POSTERIOR_HEADS,
    badge,
    can_continue,
    esc,
    fmt_lp,
    fmt_p,
    link_target,
    plural,
    show_token,
)


def doc_groups(answers: dict[str, dict]) -> list[tuple[str, list[str]]]:
    """[(group name, modes)]: modes that retrieved the same passages share one table ("all");
    the paper stack's two question encoders may retrieve different ones."""
    groups: dict[tuple, list[str]] = {}
    for mode, a in answers.items():
        if a and a["docs"]:  # same passages, and the same sentences read (two question encoders may differ)
            key = tuple((d["id"], _read(d)) for d in a["docs"])
            groups.setdefault(key, []).append(mode)
    if len(groups) == 1:
        return [("all", next(iter(groups.values())))]
    return [(modes[0], modes) for modes in groups.values()]


def _read(d: dict) -> tuple[int, ...] | None:
    read = d.get("read_sentences")
    return None if read is None else tuple(read)


_WORD = re.compile(r"[^\W_]+")  # a run of letters or digits: eval's match_tokens split punctuation off the same way
_ARTICLES = {"a", "an", "the"}


def _words(text: str) -> list[tuple[str, int, int]]:
    """(lowercased word, start, end) of each word of `text`, articles left out (as eval compares)."""
    return [(m.group().lower(), m.start(), m.end()) for m in _WORD.finditer(text) if m.group().lower() not in _ARTICLES]


def answer_spans(text: str, answers: dict[str, str]) -> list[tuple[int, int, list[str]]]:
    """Where each answer's words occur in `text` as a run (the first place): [(start, end, modes)],
    sorted, one entry per distinct place (modes whose answers copied the same words share it);
    overlapping places are merged."""
    words = _words(text)
    found: dict[tuple[int, int], list[str]] = {}
    for mode, answer in answers.items():
        want = [w for w, _, _ in _words(answer)]
        n = len(want)
        if not n:
            continue
        for i in range(len(words) - n + 1):
            if [w for w, _, _ in words[i:i + n]] == want:
                found.setdefault((words[i][1], words[i + n - 1][2]), []).append(mode)
                break
    merged: list[tuple[int, int, list[str]]] = []
    for (a, b), modes in sorted(found.items()):
        if merged and a < merged[-1][1]:
            pa, pb, pm = merged[-1]
            merged[-1] = (pa, max(pb, b), pm + [m for m in modes if m not in pm])
        else:
            merged.append((a, b, modes))
    return merged


def _marked(text: str, base: int, spans: list[tuple[int, int, list[str]]]) -> str:
    """`text` (which starts at offset `base` of the passage) escaped, the answers' spans in it marked."""
    out, at = [], 0
    for a, b, modes in spans:
        a, b = max(a - base, 0), min(b - base, len(text))
        if a >= b or b <= at:
            continue
        who = " and ".join(MODE_TITLES[m] for m in modes)
        out.append(esc(text[at:a]))
        out.append(f'<mark class="rag-span" data-modes="{" ".join(modes)}" title="{esc(who)} answered with these '
                   f'words">{esc(text[a:b])}</mark>')
        at = b
    return "".join(out) + esc(text[at:])


def render_passage_text(d: dict, answers: dict[str, str] | None = None) -> str:
    """A retrieved passage's text, the words each RAG answer copied from it marked (`answers`:
    mode -> answer text), so a copy from the wrong part of the right passage shows. When the
    generator read only some of its sentences (RagSettings.passage_sentences > 0:
    d["read_sentences"], indices into chunking.split_sentences of the text), the sentences it read
    are shown as they are and the others dimmed, with a note saying how many it read; None (it
    read the whole passage): the text as it is."""
    read = _read(d)
    if read is None:
        return f'<div class="rag-ptext">{_marked(d["text"], 0, answer_spans(d["text"], answers or {}))}</div>'
    sentences = split_sentences(d["text"])
    joined = " ".join(sentences)  # white space normalised, as the sentences are
    spans, base, parts = answer_spans(joined, answers or {}), 0, []
    kept = set(read) & set(range(len(sentences)))
    for j, sent in enumerate(sentences):
        parts.append(f'<span class="{"rag-read" if j in kept else "rag-unread"}">{_marked(sent, base, spans)}</span>')
        base += len(sent) + 1
    note = (f"the generator read the whole passage ({plural(len(sentences), 'sentence')})"
            if len(kept) == len(sentences) else f"the generator read the {plural(len(kept), 'highlighted sentence')}")
    return (f'<div class="rag-ptext" data-read="{",".join(map(str, sorted(kept)))}">{" ".join(parts)}</div>'
            f'<div class="rag-read-note">{esc(note)}</div>')


def anchors(answers: dict[str, dict]) -> dict[str, str]:
    return {m: f"rag-p-{g}-" for g, modes in doc_groups(answers) for m in modes}


def _same(a: str, b: str) -> bool:
    return a.strip().rstrip(".").casefold() == b.strip().rstrip(".").casefold()


def explain_modes(answers: dict[str, dict]) -> str:
    """One sentence, from this question's own numbers, on why RAG-Sequence and RAG-Token agree or
    differ (and what closed-book said without passages)."""
    seq, tok, cb = answers.get("sequence"), answers.get("token"), answers.get("closed-book")
    if not seq or not tok or not tok.get("docs"):
        return ""
    cut = [MODE_TITLES[m] for m, a in (("sequence", seq), ("token", tok)) if can_continue(a)]
    if cut:  # a cut answer, or one another algorithm gave, is not the mode's answer: nothing to compare yet
        which = " and ".join(cut)
        return (f'<div class="rag-why"><b>Compare the modes once both have finished:</b> {esc(which)} stopped '
                "early; “Answer this mode in full” on the card finishes it.</div>")
    docs = tok["docs"]
    order = sorted(range(len(docs)), key=lambda i: -docs[i]["prior"])
    top = docs[order[0]]
    name = lambda d: f"[{d['rank']}] {d['title']}"  # noqa: E731
    pz = prior_name(docs)  # the name the passages table gives the p(z|x) the modes used
    src = _read_from(seq, docs)  # the passage RAG-Sequence's answer leans on, by its posterior p(z|x,y)
    second = docs[order[1]] if len(order) > 1 else None
    also = f", {second['prior']:.2f} on {name(second)}" if second else ""
    if not _same(seq["text"], tok["text"]):  # the reason is in the scores, not the prior: say the prior plainly
        prior = f"{pz} puts {top['prior']:.2f} on {name(top)}"
    elif src is not None and src != order[0]:  # the answer came from another passage than the one retrieval trusted
        s_post = seq["doc_posterior"][src]
        held = " whose text holds the answer's words" if _holds(docs[src], seq["text"]) else ""
        prior = (f"{pz} puts {top['prior']:.2f} on {name(top)}, yet the answer comes from {name(docs[src])}"
                 f"{held}: once the answer is read, RAG-Sequence's posterior p(z|x,y) puts {s_post:.2f} on it")
    elif top["prior"] >= 0.9:
        prior = (f"{pz} puts {top['prior']:.2f} on {name(top)}, so both models read that passage almost alone: "
                 "RAG-Token's mixture is then its next-token distribution, RAG-Sequence's best answer its favourite")
    elif top["prior"] >= SPREAD_BELOW:
        prior = f"{pz} leans on {name(top)} ({top['prior']:.2f}{also})"
    else:
        prior = f"{pz} is spread over the passages ({top['prior']:.2f} on {name(top)}{also})"
    if _same(seq["text"], tok["text"]):
        verdict = (", and the two modes agree." if top["prior"] >= 0.9 else
                   ", yet both modes ranked the same answer first.")
    else:
        verdict = ". " + _why_differ(seq, tok)
    closed = ""
    if cb and cb.get("text", "").strip():
        closed = (" Closed-book, from its weights alone, says the same." if _same(cb["text"], tok["text"]) or
                  _same(cb["text"], seq["text"]) else
                  f" Closed-book, from its weights alone, said “{cb['text'].strip()}”.")
    return (f'<div class="rag-why"><b>Why the two RAG answers {"agree" if _same(seq["text"], tok["text"]) else "differ"}'
            f":</b> {esc(prior + verdict + closed)}</div>")


# p(z|x) is "spread" only when no passage holds half of it; from there up to 0.9 it "leans on" one.
SPREAD_BELOW = 0.5


def prior_name(docs: list[dict]) -> str:
    """What the passages table calls the p(z|x) every formula used: "p(z|x) with the vote" where a
    reader aid added the generator's vote (beside it the table shows the retriever's own), else "p(z|x)"."""
    return "p(z|x) with the vote" if any(d.get("question_logprob") is not None for d in docs) else "p(z|x)"


def _read_from(a: dict, docs: list[dict]) -> int | None:
    """The passage an answer leans on most: the argmax of its posterior p(z|x,y) (None without one)."""
    post = a.get("doc_posterior") or []
    if len(post) != len(docs) or not post:
        return None
    return max(range(len(post)), key=post.__getitem__)


def _holds(d: dict, answer: str) -> bool:
    """Whether a passage's title or text holds the answer's words (case aside)."""
    words = answer.strip().rstrip(".").casefold()
    return bool(words) and words in f"{d.get('title', '')} {d.get('text', '')}".casefold()


def _score_of(text: str, candidates: list[dict]) -> str | None:
    """How a mode's own candidates list scored an answer of this text ("−1.52", or "at most −1.52"
    where the number is a branch-and-bound's upper bound); None when the mode never weighed it."""
    for c in candidates or []:
        if _same(c["text"], text) and c.get("logprob") is not None:
            return ("at most " if c.get("upper_bound") else "at least " if c.get("lower_bound") else "") + fmt_lp(c["logprob"])
    return None


def _parting(seq: dict, tok: dict) -> str:
    """Where the two answers part, from RAG-Token's inspector: the mixture's top next tokens there."""
    a, b = tok.get("tokens") or [], seq.get("tokens") or []
    i = next((j for j in range(min(len(a), len(b))) if a[j] != b[j]), min(len(a), len(b)))
    ins = tok.get("inspector") or []
    if i >= len(ins) or not ins[i].get("mix"):
        return ""
    mix = ins[i]["mix"]
    want = b[i] if i < len(b) else None
    theirs = next((p for t, p in mix if t == want), None)
    said = ", ".join(f"“{show_token(t.strip() or t)}” {fmt_p(p)}" for t, p in mix)
    other = ("" if want is None else f"; RAG-Sequence's “{show_token(want.strip() or want)}” "
             + (f"got {fmt_p(theirs)}" if theirs is not None else "was not in its top 3"))
    where = "At the first token" if i == 0 else f"At token {i + 1}, where the answers part,"
    return f" {where} the passages' mixture put {said}{other}."


def _why_differ(seq: dict, tok: dict) -> str:
    """Why RAG-Sequence and RAG-Token chose different answers, from the numbers on their cards: each
    mode's score of its own answer and of the other's (its candidates list), and where the
    answers part in RAG-Token's mixture (its inspector)."""
    ys, yt = seq["text"].strip().rstrip("."), tok["text"].strip().rstrip(".")
    t_own, s_own = fmt_lp(tok["sequence_logprob"]), fmt_lp(seq["sequence_logprob"])
    t_other, s_other = _score_of(ys, tok.get("candidates")), _score_of(yt, seq.get("candidates"))
    token = (f"RAG-Token's whole answer “{yt}” scored log p(y|x) = {t_own} under its mixture"
             + (f" against {t_other} for “{ys}”." if t_other else
                f"; its search never weighed “{ys}”." if tok.get("candidates") else
                f"; its search (greedy or its beams) never reached “{ys}”."))
    post = seq.get("doc_posterior") or []
    carried = ""
    if post and len(post) == len(seq.get("docs") or []):
        z = max(range(len(post)), key=post.__getitem__)
        lean = sorted({seq["docs"][j]["rank"] for j in seq.get("top_docs") or [] if j != z})
        tokens = (f"; token by token, some of its words lean on {', '.join(f'[{r}]' for r in lean)}, as its colours show"
                  if lean else "")
        carried = (f" (as a whole from [{seq['docs'][z]['rank']}] {seq['docs'][z]['title']}, p(z|x,y) = {post[z]:.2f}"
                   f"{tokens})")
    sequence = (f" RAG-Sequence's “{ys}”{carried} scored {s_own}"
                + (f" against {s_other} for “{yt}”" if s_other else f"; no passage's own search wrote “{yt}”")
                + ", each passage's answer weighed whole.")
    return token + sequence + _parting(seq, tok)


def render_passages(answers: dict[str, dict], edits: tuple[str, ...] = ()) -> str:
    """Why the modes agree or differ for this question (`explain_modes`), then the retrieved
    passages: rank, title (linked), text, retrieval score, p(z|x) (the retriever's own beside the
    reweighted one when the generator's vote is on), and each mode's posterior over the passage
    given the answer."""
    groups = doc_groups(answers)
    if not groups:
        return '<div class="rag-passages rag-placeholder">The retrieved passages appear here.</div>'
    out = [explain_modes(answers)]
    for g, modes in groups:
        docs = answers[modes[0]]["docs"]
        corpus = answers[modes[0]]["corpus"]
        who = "" if g == "all" else f" for {' and '.join(MODE_TITLES[m] for m in modes)}"
        post_heads = "".join(
            f'<th title="{esc(POSTERIOR_HEADS[m][1])}">{MODE_TITLES[m]}<br>{POSTERIOR_HEADS[m][0]}</th>' for m in modes
        )
        # with the generator's vote on, the retriever's own prior and the reweighted one differ: show both
        voted = any(d.get("question_logprob") is not None for d in docs)
        # each RAG answer's words where a passage holds them (a cut answer is not an answer yet)
        copied = {m: answers[m]["text"].strip().rstrip(".") for m in modes
                  if answers[m].get("text") and answers[m].get("stopped") not in ("time_limit", "cancelled")}
        rows = []
        for i, d in enumerate(docs):
            title = esc(d["title"])
            if link_target(d.get("url")):
                title = f'<a href="{esc(d["url"])}" target="_blank" rel="noopener">{title}</a>'
            tag = '<span class="rag-edited">edited by you</span>' if d["id"] in edits else ""
            posts = "".join(_prob_cell((answers[m].get("doc_posterior") or [None] * len(docs))[i],
                                       f"{MODE_TITLES[m]} {POSTERIOR_HEADS[m][0]}") for m in modes)
            drop = (f'<button class="rag-without-btn" type="button" data-id="{esc(d["id"])}" title="answer the same '
                    f'question again with this passage taken away">answer without it</button>') if len(docs) > 1 else ""
            own = _prob_cell(d.get("retriever_prior", d["prior"]), "retriever p(z|x)") if voted else ""
            rows.append(
                f'<tr id="rag-p-{g}-{d["rank"]}" data-id="{esc(d["id"])}"><td>{badge(d["rank"])}</td>'
                f'<td><div class="rag-ptitle">{title}{tag}</div>{render_passage_text(d, copied)}{drop}</td>'
                f'<td class="rag-num" data-label="score q(x)·d(z)">{d["score"]:.3f}{_question_lp_note(d)}</td>{own}'
                f'{_prob_cell(d["prior"], "p(z|x) with the vote" if voted else "prior p(z|x)")}{posts}</tr>'
            )
        prior_heads = (
            '<th title="the retriever\'s own prior: softmax of its scores over the K passages">retriever<br>p(z|x)</th>'
            '<th title="the prior every formula used: the retriever\'s scores plus the generator\'s vote log p(x|z), '
            'through the softmax (a reader aid)">p(z|x) with<br>the vote</th>' if voted else
            '<th title="softmax of the retriever\'s scores over the K passages">prior<br>p(z|x)</th>')
        out.append(
            f'<div class="rag-passages"><h3>Retrieved passages{who} '
            f'<small>(top {len(docs)} of {esc(corpus)})</small></h3>'
            f'<table class="rag-ptable"><thead><tr><th>#</th><th>passage</th><th title="retrieval inner product '
            f'q(x)·d(z)">score<br>q(x)·d(z)</th>{prior_heads}{post_heads}</tr></thead>'
            f"<tbody>{''.join(rows)}</tbody></table>{render_near_misses(answers[modes[0]])}</div>"
        )
    return "".join(out)


def render_near_misses(a: dict) -> str:
    """The passages the retriever ranked just after the K the generator read (Answer.near_misses),
    greyed: what K cut off, with their scores, and the K that would have included each."""
    near = a.get("near_misses") or []
    if not near:
        return ""
    k = len(a["docs"])
    rows = "".join(
        f'<tr data-id="{esc(d["id"])}"><td class="rag-num">{d["rank"]}</td><td><div class="rag-ptitle">{esc(d["title"])}'
        f'</div><div class="rag-ptext">{esc(_snippet(d["text"]))}</div></td>'
        f'<td class="rag-num" data-label="score q(x)·d(z)">{d["score"]:.3f}</td>'
        f'<td class="rag-num" data-label="read with">K = {d["rank"]}</td></tr>' for d in near)
    gap = a["docs"][-1]["score"] - near[0]["score"] if a["docs"] else None
    said = (f" The last one read scored {a['docs'][-1]['score']:.3f}, {gap:.3f} above the first one left out."
            if gap is not None else "")
    return (f'<details class="rag-near" data-near="{len(near)}"><summary>Just missed: the passages ranked '
            f"{k + 1} to {k + len(near)}, which K = {k} cut off (not read by the generator)</summary>"
            f'<div class="rag-note">Retrieval ranks the whole corpus; the generator reads only the top K.{esc(said)}'
            "</div>"
            '<table class="rag-ptable rag-near-table"><thead><tr><th>#</th><th>passage</th><th>score<br>q(x)·d(z)'
            f"</th><th>read with</th></tr></thead><tbody>{rows}</tbody></table></details>")


def _snippet(text: str, n: int = 160) -> str:
    return text if len(text) <= n else text[:n].rsplit(" ", 1)[0] + " …"


def render_without(result: dict | None) -> str:
    """The answers with one passage taken away, beside the originals (`_answer_without`'s dict):
    per RAG mode the new answer, and how the original answer's log p(y|x) changed (exact, from
    Answer.passage_drop); then what that says about the attribution."""
    if not result:
        return ('<div class="rag-without rag-placeholder">"answer without it" beside a passage answers the '
                "question again without that passage.</div>")
    d, rows, notes = result["dropped"], [], []
    for m, x in result["modes"].items():
        drop = x["drop"]
        change = "-" if drop is None else f"{-drop:+.3f}"
        cut = " (stopped)" if x.get("stopped") in ("cancelled", "time_limit") else ""
        rows.append(f'<tr data-mode="{m}"><td>{esc(MODE_TITLES[m])}</td><td>{esc(x["before"].strip() or "(empty)")}</td>'
                    f'<td class="rag-without-new">{esc((x["after"].strip() or "(empty)") + cut)}</td>'
                    f'<td class="rag-num rag-without-delta">{change}</td></tr>')
        top, most = x["top"], x["most"]
        if top is None or most is None:  # the answers before are not ones this server computed for this visitor
            notes.append(f"<li>{esc(MODE_TITLES[m])}: no numbers: the answer before was not computed here for "
                         "this page (ask again, then take a passage away).</li>")
            continue
        said = (f"the attribution's top passage [{top['rank']}] {esc(top['title'])} is also the one whose removal "
                f"costs the answer most" if top["rank"] == most["rank"] else
                f"the attribution's top passage is [{top['rank']}] {esc(top['title'])}, but taking away "
                f"[{most['rank']}] {esc(most['title'])} would cost the answer most ({-most['drop']:+.2f})")
        notes.append(f"<li>{esc(MODE_TITLES[m])}: {said}.</li>")
    return (
        f'<div class="rag-without" data-without="{d["rank"]}"><h3>Without passage {badge(d["rank"])} '
        f'{esc(d["title"])} <small>(p(z|x) renormalised over the other {result["k"] - 1})</small></h3>'
        '<div class="rag-heat-wrap"><table class="rag-ptable"><thead><tr><th>mode</th><th>answer with all passages'
        '</th><th>answer without it</th><th title="log p(original answer | x) without the passage, minus with it">'
        "change in log p(original answer)</th></tr></thead>"
        f'<tbody>{"".join(rows)}</tbody></table></div>'
        '<div class="rag-note">How faithful are these attributions? A passage an answer really leans on should '
        "cost it probability when taken away; one it ignores should not. Here "
        f'<ul>{"".join(notes)}</ul></div></div>'
    )


def _question_lp_note(d: dict) -> str:
    """With the generator's vote on (question_weight > 0): log p(question | passage) under the score."""
    lp = d.get("question_logprob")
    if lp is None:
        return ""
    return (f'<div class="rag-qlp" title="the generator\'s log-likelihood of the question after this passage, '
            f'added to the score times the vote\'s weight before the softmax">log p(x|z) {lp:.1f}</div>')


def _prob_cell(p: float | None, label: str = "") -> str:
    """A probability with its bar; `label` names it where a phone shows the row as a block."""
    lab = f' data-label="{esc(label)}"' if label else ""
    if p is None:
        return f'<td class="rag-num"{lab}>–</td>'
    return f'<td class="rag-num"{lab}>{p:.3f}<div class="rag-bar"><div style="width:{100 * p:.0f}%"></div></div></td>'
