"""The app's API as clients see it: /ask's arguments (generated from the knob declarations, in a
positional order no earlier client's call changes meaning under), each with its knob's help text,
and the marks of an event that is the page's own rather than a public endpoint.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from typing import Any

import gradio as gr

from rag_demo.config import KNOBS, STACKS


# /ask's arguments after the question, in their positional order: the order earlier clients call
# with, then the preset, then every other knob in its declaration order (rag_demo/config.py), and
# last the arguments added since (so that no earlier positional call changes meaning)
_FIRST = ("k", "num_beams", "max_new_tokens", "sequence_decoding", "stack", "answer_style", "prior_temperature",
          "passage_sentences", "question_position", "extractive", "question_weight", "worked_examples", "echo_retries")
_LAST = ("retriever", "corpus")
API_ARGUMENTS = (*_FIRST, "preset", *(n for n in KNOBS if n not in _FIRST and n not in _LAST), *_LAST)
_TYPES = {"int": int, "float": float, "bool": bool, "choice": str}


def api_help(name: str) -> str:
    """One /ask argument's description in the API page and the MCP tool: a knob's own help, range
    and both presets' values (rag_demo/config.py); the others' here."""
    if name == "question":
        return "The question, in English, one or two sentences (up to 1,000 characters)."
    if name == "stack":
        return f"Which models answer: {' or '.join(STACKS)} (default offline: MiniLM and SmolLM2-135M, no download)."
    if name == "preset":
        return ("paper (the paper's algorithm, every reader aid off) or aided (the reader aids for a small model); "
                "default: the stack's (offline aided, paper paper). Every knob left out takes the preset's value.")
    if name == "corpus":
        return ("Which built-in corpus the passages come from: builtin (the stack's own: Wikipedia Vital Articles "
                "unless the server was started with other documents) or factbook (the CIA World Factbook).")
    spec = KNOBS[name]
    values = (", ".join(spec.choices) if spec.kind == "choice" else "true or false" if spec.kind == "bool"
              else f"{spec.lo:g} to {spec.hi:g}")
    default = spec.defaults_text()
    return f"{spec.label}: {spec.help} {values} (default {default})."


def api_signature(returns: Any) -> inspect.Signature:
    """/ask's signature, generated from the knobs: (self, question, ...API_ARGUMENTS, request); a knob
    left out (None) takes the preset's value, the preset the stack's (offline: aided, paper: paper)."""
    P = inspect.Parameter
    params = [P("self", P.POSITIONAL_OR_KEYWORD), P("question", P.POSITIONAL_OR_KEYWORD, annotation=str)]
    for name in API_ARGUMENTS:
        if name == "stack":
            params.append(P(name, P.POSITIONAL_OR_KEYWORD, default="offline", annotation=str))
        elif name == "corpus":
            params.append(P(name, P.POSITIONAL_OR_KEYWORD, default="builtin", annotation=str))
        elif name == "preset":
            params.append(P(name, P.POSITIONAL_OR_KEYWORD, default=None, annotation=str | None))
        else:
            params.append(P(name, P.POSITIONAL_OR_KEYWORD, default=None, annotation=_TYPES[KNOBS[name].kind] | None))
    params.append(P("request", P.POSITIONAL_OR_KEYWORD, default=None, annotation=gr.Request))
    return inspect.Signature(params, return_annotation=returns)


def describe_api(dependency: Any, blocks: Any) -> None:
    """Give each argument of an endpoint made by `gr.api` over an `_api` method its help text in the
    API page (gradio reads a parameter's description from its Api component's schema, key
    "additional_description"; checked by tests/test_ui.py). The MCP tool reads the docstring's
    "Args:" section, which `_api` writes."""
    fn = blocks.fns[dependency["id"]]
    names = ["question", *API_ARGUMENTS]
    for comp, name in zip(fn.inputs, names):
        comp._api_info = {**comp.api_info(), "additional_description": api_help(name)}


def base_url(request: Any) -> str:
    """The address this visitor reached the app at (a proxy's scheme and host when there is one)."""
    headers = getattr(request, "headers", None) or {}
    host = headers.get("x-forwarded-host") or headers.get("host") or "127.0.0.1:7860"
    scheme = headers.get("x-forwarded-proto") or "http"
    return f"{scheme}://{host}/"


def page_event(fn: Callable) -> Callable:
    """Mark a handler as the page's own event: callable through the API like any endpoint, but not
    an MCP tool. gradio's MCP server lists only the endpoints whose function has no `_mcp_type` or
    has "tool" (gradio.mcp; checked by tests/test_ui.py): agents get /ask and /ask_stream."""
    fn._mcp_type = "page"
    return fn


def json_tool(fn: Callable, name: str) -> Callable:
    """An MCP tool named `name` over the endpoint method `fn` (its parameters and docstring), whose
    result is JSON text: gradio's MCP server sends a tool's result as str(result), a Python literal
    no client's json.loads reads, so the tool returns json.dumps of the dict (each dict a streaming
    endpoint yields). The endpoint itself stays the API's own, a dict, and is not a tool."""
    sig = inspect.signature(fn).replace(return_annotation=str)
    if inspect.isgeneratorfunction(fn):
        def tool(*args, **kwargs):
            for value in fn(*args, **kwargs):
                yield json.dumps(value, ensure_ascii=False)
    else:
        def tool(*args, **kwargs):
            return json.dumps(fn(*args, **kwargs), ensure_ascii=False)
    tool.__name__ = tool.__qualname__ = name
    tool.__signature__ = sig
    tool.__annotations__ = {**getattr(fn, "__annotations__", {}), "return": str}
    tool.__doc__ = (fn.__doc__ or "").replace("Returns a dict:", "Returns JSON text of a dict:", 1)
    tool._mcp_type = "tool"
    fn.__func__._mcp_type = "page"  # the dict endpoint: for the API, not the MCP server
    return tool


def api_endpoint(returns: Any) -> Callable[[Callable], Callable]:
    """Give an endpoint method /ask's generated parameters (gr.api reads an endpoint's parameters,
    defaults and types from its signature and type hints) and an "Args:" section describing each
    (what gradio's MCP server reads); the method binds its *args / **kwargs with that signature itself."""
    def declare(fn: Callable) -> Callable:
        fn.__signature__ = api_signature(returns)
        fn.__annotations__ = {p.name: p.annotation for p in fn.__signature__.parameters.values()
                              if p.annotation is not inspect.Parameter.empty} | {"return": returns}
        fn.__doc__ = (inspect.cleandoc(fn.__doc__ or "") + "\n\nArgs:\n"
                      + "\n".join(f"    {n}: {api_help(n)}" for n in ("question", *API_ARGUMENTS)))
        return fn
    return declare

# The question the settings' cost estimate is computed for (a typical one-sentence question).
