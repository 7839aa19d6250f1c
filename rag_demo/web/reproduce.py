""""Show the code": the command line and the gradio_client call that reproduce the answers on screen.

From an /ask result dict (the question, the stack, the settings that ran), the CLI command
`python -m rag_demo ask ...` and a Python snippet calling the app's /ask endpoint, each naming the
preset and every knob that differs from it, so that a learner can rerun exactly what they saw.
Pure: dicts in, text out (no torch, no gradio).
"""
from __future__ import annotations

import shlex
from typing import Any

from rag_demo.config import KNOBS


def _changed(result: dict) -> dict[str, Any]:
    s = result.get("settings") or {}
    return {n: v for n, v in (s.get("changed") or {}).items() if n in KNOBS}


def _cli_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def cli_command(result: dict, corpus_flags: list[str] = ()) -> str:
    """`python -m rag_demo ask QUESTION --preset P [--stack paper] [corpus flags] [--knob value ...]`:
    the three answers of `result` on the command line (`corpus_flags`: how the server got its corpus,
    e.g. ["--corpus", "factbook"] or ["--corpus-file", "notes.md"])."""
    s = result.get("settings") or {}
    args = ["python", "-m", "rag_demo", "ask", result["question"], "--preset", s.get("preset", "aided")]
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


def caveat(corpus: str, edited: bool) -> str:
    """What the code cannot reproduce of the visitor's own changes (an edit, an upload), said beside
    it ("" when it reproduces all)."""
    if edited:
        return ("Your edited passage lives in your browser session only: this code answers from the corpus as it was "
                "before your edit.")
    if corpus == "upload":
        return ("Your uploaded documents live in your browser session only: on the command line pass the same files "
                "with --corpus-file; the API answers from the server's built-in corpus.")
    return ""
