"""The named API endpoints `/ask` and `/ask_stream` (and, through gradio's MCP server, the tools
of the same names): one question over a built-in corpus, no per-visitor state.
"""
from __future__ import annotations

import inspect
from typing import Any


from rag_demo.config import KNOBS, PRESET_OF_STACK, STACKS, RagSettings
from rag_demo.serving.session import Session, session_pipeline
from rag_demo.web.answering import answer_all, answering
from rag_demo.web.api import API_ARGUMENTS, api_endpoint, api_signature
from rag_demo.web.render import json_safe
from rag_demo.web.validation import checked_settings, logs_refusals, refusal, user_errors
from rag_demo.web.turns import Part


class ApiEvents(Part):
    """/ask and /ask_stream."""

    @api_endpoint(dict)
    @logs_refusals
    def ask(self, *args, **kwargs) -> dict:
        """Answer one question with RAG-Sequence, RAG-Token and closed-book over a built-in corpus
        (no per-visitor state). Every knob is optional (None: the preset's value). Returns a dict:
        {"question", "stack", "corpus", "settings", "answers": {"sequence", "token", "closed-book"}},
        each answer an Answer.to_dict() (its "settings" say which preset ran and which aids were on,
        "stopped" why it ended, "confidence" how likely it is right). A question over the server's
        budget gets an error naming its cost and what to change, and nothing runs."""
        call = self._bind(args, kwargs)
        pipe, settings = self._api_request(call.arguments)
        return answer_all(pipe, call.arguments["question"], settings, serving=self.serving,
                           request=call.arguments["request"])[0]

    def _bind(self, args: tuple, kwargs: dict) -> inspect.BoundArguments:
        """A call's arguments bound to /ask's signature, defaults applied; an argument /ask does not
        take is refused, naming it and the ones it takes."""
        try:
            call = api_signature(dict).bind(self, *args, **kwargs)
        except TypeError as e:
            raise refusal(f"{e}: /ask takes question, {', '.join(API_ARGUMENTS)}.") from None
        call.apply_defaults()
        return call

    def _api_request(self, args: dict) -> tuple[Any, RagSettings]:
        """/ask's and /ask_stream's arguments -> (the pipeline of the stack and corpus asked for, the
        validated settings)."""
        if args["stack"] not in STACKS:
            raise refusal(f"stack={args['stack']!r} is unknown: use one of {', '.join(STACKS)}.")
        corpus = args.get("corpus") or "builtin"
        if corpus not in ("builtin", *self.pool.corpora()):
            raise refusal(f"corpus={corpus!r} is unknown: use one of {', '.join(['builtin', *self.pool.corpora()])}.")
        settings = checked_settings(preset=args["preset"] or PRESET_OF_STACK[args["stack"]],
                             **{n: args[n] for n in KNOBS})
        with user_errors():
            pipe, _ = session_pipeline(self.pool, Session(stack=args["stack"], corpus=corpus))
            return pipe, settings

    @api_endpoint(dict)
    @logs_refusals
    def ask_stream(self, *args, **kwargs) -> dict:  # each value it yields (gr.api counts the outputs from this hint)
        """/ask, streamed: yields {"question", "stack", "corpus", "answers": {mode: dict}, "done":
        false} while the answers are decoded (each answer so far: RagPipeline.partial_answer's dict,
        with "partial": true; an answer already finished: its Answer.to_dict() with "final": true),
        then /ask's final dict with "done": true. Same arguments and budget as /ask."""
        call = self._bind(args, kwargs)
        question, request = call.arguments["question"], call.arguments["request"]
        pipe, settings = self._api_request(call.arguments)

        for kind, value in answering(pipe, question, settings, serving=self.serving, request=request):
            if kind == "partial":
                yield {"question": question, "stack": pipe.stack.name, "corpus": pipe.index.corpus.name,
                       "answers": json_safe(value), "done": False}
            else:
                yield {**value[0], "done": True}
