"""What the page says beside the answers, from their own numbers (pure rendering, hand-made dicts):
the copied span marked in its passage, why the two RAG answers differ, what K just missed, and the
code that reproduces the answers."""
from __future__ import annotations

import html
import shlex
import subprocess
from pathlib import Path

from rag_demo.web import passages_view, render, reproduce

ROOT = Path(__file__).resolve().parents[1]


def test_answer_spans_find_the_copied_words_as_eval_compares_them():
    text = "The Phantom of the Opera, with music by Andrew Lloyd Webber and lyrics by Charles Hart."
    spans = passages_view.answer_spans(text, {"token": "Charles Hart.", "sequence": "Andrew Lloyd Webber"})
    assert [(text[a:b], modes) for a, b, modes in spans] == [("Andrew Lloyd Webber", ["sequence"]),
                                                              ("Charles Hart", ["token"])]
    # the same words in both answers: one place, both modes; articles and case do not matter
    spans = passages_view.answer_spans(text, {"token": "the phantom of opera", "sequence": "Phantom of the Opera"})
    assert [(text[a:b], modes) for a, b, modes in spans] == [("Phantom of the Opera", ["token", "sequence"])]
    assert passages_view.answer_spans(text, {"token": "Charles Hartley"}) == []  # whole words only
    assert passages_view.answer_spans(text, {"token": ""}) == []


def test_the_span_is_marked_in_the_passage_and_dimmed_sentences_keep_it():
    d = {"text": "Lyrics by Charles Hart. Music by Andrew Lloyd Webber.", "read_sentences": None}
    html = passages_view.render_passage_text(d, {"token": "Charles Hart"})
    assert '<mark class="rag-span" data-modes="token"' in html and ">Charles Hart</mark>" in html
    assert "Lyrics by " in html and "Music by Andrew" in html  # the rest as it was
    dimmed = passages_view.render_passage_text({**d, "read_sentences": [1]}, {"sequence": "Charles Hart"})
    assert '<span class="rag-unread">Lyrics by <mark' in dimmed and ">Charles Hart</mark>." in dimmed
    assert passages_view.render_passage_text(d) == f'<div class="rag-ptext">{render.esc(d["text"])}</div>'


def _answers():
    docs = [{"rank": 1, "id": "a", "title": "Brazil", "text": "Its capital is Brasília; its largest city is São Paulo.",
             "url": None, "score": 0.7, "prior": 0.96},
            {"rank": 2, "id": "b", "title": "Rio", "text": "Rio de Janeiro was the capital until 1960.", "url": None,
             "score": 0.5, "prior": 0.04}]
    tok = {"mode": "token", "corpus": "Vital", "text": "São Paulo.", "tokens": [" São", " Paulo", "."], "docs": docs,
           "sequence_logprob": -1.376, "stopped": "eos",
           "candidates": [{"text": "São Paulo.", "logprob": -1.376}, {"text": "Brasília.", "logprob": -1.521}],
           "inspector": [{"mix": [[" São", 0.55], [" Bras", 0.41], [" Rio", 0.02]]}, {"mix": None}, {"mix": None}]}
    seq = {"mode": "sequence", "corpus": "Vital", "text": "Brasília.", "tokens": [" Bras", "ília", "."], "docs": docs,
           "sequence_logprob": -0.9, "doc_posterior": [0.97, 0.03], "stopped": "eos",
           "candidates": [{"text": "Brasília.", "logprob": -0.9}]}
    return {"sequence": seq, "token": tok}


def test_why_the_answers_differ_names_the_scores_the_cards_show():
    why = passages_view.explain_modes(_answers())
    said = html.unescape(why)
    assert "Why the two RAG answers differ" in said
    # RAG-Token's own number for each answer, RAG-Sequence's for its own, and that it never weighed the other
    assert "RAG-Token's whole answer “São Paulo” scored log p(y|x) = -1.376 under its mixture against -1.521 " \
           "for “Brasília”." in said
    assert "RAG-Sequence's “Brasília” (as a whole from [1] Brazil, p(z|x,y) = 0.97) scored -0.900; no passage's " \
           "own search wrote “São Paulo”" in said
    # where they part: the mixture's top tokens at the first token, and RAG-Sequence's token among them
    assert "At the first token the passages' mixture put “São” 0.55, “Bras” 0.41, “Rio” 0.02; RAG-Sequence's " \
           "“Bras” got 0.41." in said
    assert "spread" not in said  # the prior is not blamed: 0.96 on one passage
    # an upper bound is said to be one
    a = _answers()
    a["token"]["candidates"][1]["upper_bound"] = True
    assert "against at most -1.521" in passages_view.explain_modes(a)


def _agreeing(p1: float, voted: bool = False):
    """Both modes answer "Brasília."; p(z|x) puts p1 on [1] and the rest on [2]."""
    a = _answers()
    for i, d in enumerate(a["token"]["docs"]):
        d["prior"] = p1 if i == 0 else 1 - p1
        d["retriever_prior"] = 0.8 if i == 0 else 0.2
        d["question_logprob"] = -3.0 if voted else None
    a["token"].update(text="Brasília.", tokens=[" Bras", "ília", "."])
    return a


def test_spread_is_said_only_when_no_passage_holds_half_of_p_z_given_x():
    leans = html.unescape(passages_view.explain_modes(_agreeing(0.87)))
    assert "spread" not in leans and "p(z|x) leans on [1] Brazil (0.87, 0.13 on [2] Rio)" in leans
    a = _agreeing(0.4)
    a["token"]["docs"].append({"rank": 3, "id": "c", "title": "Recife", "text": "Recife is a city.", "url": None,
                               "score": 0.4, "prior": 0.25, "retriever_prior": 0.1})
    a["token"]["docs"][1]["prior"] = 0.35
    a["sequence"]["doc_posterior"] = [0.9, 0.05, 0.05]
    spread = html.unescape(passages_view.explain_modes(a))
    assert "p(z|x) is spread over the passages (0.40 on [1] Brazil, 0.35 on [2] Rio)" in spread


def test_the_sentence_names_the_p_z_given_x_the_table_shows_beside_it():
    """With the generator's vote on, the table shows the retriever's p(z|x) and "p(z|x) with the
    vote"; the sentence quotes the second by that name, never the bare one."""
    a = _agreeing(0.57, voted=True)
    said = html.unescape(passages_view.explain_modes(a))
    assert "p(z|x) with the vote leans on [1] Brazil (0.57" in said
    table = html.unescape(passages_view.render_passages(a))
    assert "with the vote" in table and "0.570" in table


def test_a_sequence_answer_whose_words_lean_elsewhere_says_so():
    a = _answers()
    a["sequence"]["top_docs"] = [1, 1, 0]  # its first two tokens coloured by [2]
    said = html.unescape(passages_view.explain_modes(a))
    assert "as a whole from [1] Brazil, p(z|x,y) = 0.97; token by token, some of its words lean on [2]" in said


def test_just_missed_lists_the_passages_after_k_greyed():
    a = {**_answers()["token"], "near_misses": [
        {"rank": 3, "id": "c", "title": "São Paulo", "text": "São Paulo is the most populous city of Brazil.",
         "url": None, "score": 0.41}]}
    html = passages_view.render_near_misses(a)
    assert 'data-near="1"' in html and "ranked 3 to 3, which K = 2 cut off" in html and "0.410" in html
    assert "K = 3" in html and "0.090 above the first one left out" in html
    assert passages_view.render_near_misses({**a, "near_misses": []}) == ""
    assert 'class="rag-near"' in passages_view.render_passages({"token": a})


def test_the_code_names_the_preset_and_every_changed_knob():
    result = {"question": "Who wrote Hamlet?", "stack": "offline", "corpus": "Wikipedia Vital Articles (en)",
              "settings": {"preset": "paper", "changed": {"k": 3, "retriever": "hybrid", "extractive": True}},
              "answers": {}}
    cli = reproduce.cli_command(result, ["--corpus", "factbook"])
    assert shlex.split(cli) == [".venv/bin/python", "-m", "rag_demo", "ask", "Who wrote Hamlet?", "--preset", "paper",
                                "--corpus", "factbook", "--k", "3", "--retriever", "hybrid", "--extractive", "true"]
    # as printed, from the checkout: its interpreter is the one scripts/setup.sh made, with torch and the app
    ran = subprocess.run([shlex.split(cli)[0], "-c", "import torch, rag_demo.pipeline, rag_demo.cli as c; "
                          "c.build_parser().parse_args(__import__('sys').argv[1:])", *shlex.split(cli)[3:]],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr
    code = reproduce.client_code(result, "http://127.0.0.1:7860/", "factbook")
    assert ("client.predict('Who wrote Hamlet?', preset='paper', corpus='factbook', k=3, retriever='hybrid', "
            "extractive=True, api_name=\"/ask\")") in code
    compile(code, "show_the_code", "exec")  # valid Python as printed
    assert reproduce.caveat("upload", False).startswith("Your uploaded documents")
    assert reproduce.caveat("builtin", True).startswith("Your edited passage") and reproduce.caveat("builtin", False) == ""

