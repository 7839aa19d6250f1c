""""Show the code": the command line and the gradio_client call that reproduce the answers on screen.

From an /ask result dict (the question, the stack, the settings that ran), the CLI command
`.venv/bin/python -m rag_demo ask ...` (run in the checkout) and a Python snippet calling the app's
/ask endpoint, each naming the preset and every knob that differs from it, so that a learner can
rerun exactly what they saw.
Pure: dicts in, text out (no torch, no gradio).
"""
from __future__ import annotations

import shlex
from typing import Any

from rag_demo.config import KNOBS, MODE_TITLES


def _changed(result: dict) -> dict[str, Any]:
    """The knobs that differ from the preset, and the retriever that really chose the passages: BM25
    while the dense index was built in the background (Answer.retriever), whatever the setting said."""
    s = result.get("settings") or {}
    out = {n: v for n, v in (s.get("changed") or {}).items() if n in KNOBS}
    labels = [a.get("retriever") or "" for m, a in (result.get("answers") or {}).items() if m != "closed-book"]
    if any(label.startswith("bm25") for label in labels) and s.get("retriever", "dense") != "bm25":
        out["retriever"] = "bm25"
    return out


def _cli_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def cli_command(result: dict, corpus_flags: list[str] = ()) -> str:
    """`.venv/bin/python -m rag_demo ask QUESTION --preset P [--stack paper] [corpus flags] [--knob value ...]`:
    the three answers of `result` on the command line (`corpus_flags`: how the server got its corpus,
    e.g. ["--corpus", "factbook"] or ["--corpus-file", "notes.md"])."""
    s = result.get("settings") or {}
    # the checkout's own interpreter (scripts/setup.sh makes .venv): a plain `python` has no torch
    args = [".venv/bin/python", "-m", "rag_demo", "ask", result["question"], "--preset", s.get("preset", "aided")]
    if result.get("stack", "offline") != "offline":
        args += ["--stack", result["stack"]]
    args += list(corpus_flags)
    for name, v in _changed(result).items():
        args += [KNOBS[name].flag, _cli_value(v)]
    return " ".join(shlex.quote(a) for a in args)


def client_code(result: dict, url: str, corpus: str = "builtin") -> str:
    """The gradio_client call of /ask that gives `result`'s answers, and a loop printing them."""
    s = result.get("settings") or {}
    kwargs = [f"preset={s.get('preset', 'aided')!r}"]
    if result.get("stack", "offline") != "offline":
        kwargs.append(f"stack={result['stack']!r}")
    if corpus != "builtin":
        kwargs.append(f"corpus={corpus!r}")
    kwargs += [f"{name}={v!r}" for name, v in _changed(result).items()]
    return (
        "from gradio_client import Client\n\n"
        f"client = Client({url!r})\n"
        f"result = client.predict({result['question']!r}, {', '.join(kwargs)}, api_name=\"/ask\")\n"
        "for mode, answer in result[\"answers\"].items():\n"
        "    print(mode, answer[\"text\"])\n"
    )


def caveat(corpus: str, edited: bool, result: dict | None = None) -> str:
    """What the code cannot reproduce (said beside it; "" when it reproduces all): the visitor's own
    changes (an edit, an upload), a retrieval by BM25 while the dense index was built, and an answer
    the page cut short (the command runs it to its end)."""
    notes = [n for n in (_own_changes(corpus, edited), _bm25_note(result or {}), _cut_note(result or {})) if n]
    return " ".join(notes)


def _bm25_note(result: dict) -> str:
    labels = [a.get("retriever") or "" for m, a in (result.get("answers") or {}).items() if m != "closed-book"]
    label = next((x for x in labels if x.startswith("bm25")), None)
    if label is None or (result.get("settings") or {}).get("retriever") == "bm25":
        return ""
    return (f"These passages came from BM25 ({label}): the dense index was still being built, so the command "
            "retrieves with --retriever bm25 to give the same passages.")


def _cut_note(result: dict) -> str:
    cut = [(m, a.get("stopped")) for m, a in (result.get("answers") or {}).items()
           if a.get("stopped") in ("time_limit", "cancelled")]
    if not cut:
        return ""
    said = ", ".join(f"{MODE_TITLES.get(m, m)} ({'stopped' if why == 'cancelled' else 'time limit'})" for m, why in cut)
    return f"The page cut {said} short: the command runs every mode to its end, so those answers may differ."


def _own_changes(corpus: str, edited: bool) -> str:
    if edited:
        return ("Your edited passage lives in your browser session only: this code answers from the corpus as it was "
                "before your edit.")
    if corpus == "upload":
        return ("Your uploaded documents live in your browser session only: on the command line pass the same files "
                "with --corpus-file; the API answers from the server's built-in corpus.")
    return ""
