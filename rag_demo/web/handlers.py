"""The page's event handlers: every button and API endpoint of the app calls a method of one
part of `Handlers`, each part a job of its own.

The handlers call the library and render its dicts (render.py); they recompute no math and import
no torch.
"""
from __future__ import annotations

from rag_demo.serving.admission import Serving
from rag_demo.serving.pool import PipelinePool
from rag_demo.web.api_events import ApiEvents
from rag_demo.web.ask_events import AskEvents
from rag_demo.web.corpus_events import CorpusEvents
from rag_demo.web.pricing_events import PricingEvents
from rag_demo.web.turns import Turns


class Handlers:
    """The event handlers behind every button and endpoint, by job; `build_app` wires each part's
    methods to their events, and tests call them directly:

        turns     each visitor's runs and Stop (turns.py)
        pricing   the cost line, the sliders' reach, the budget's refusals (pricing_events.py)
        corpus    the first load, uploads, the corpus and stack switches, edits undone (corpus_events.py)
        answers   a visitor's questions, edits, a passage taken away, a cut card finished (ask_events.py)
        api       /ask and /ask_stream (api_events.py)

    They share the stack pool, the serving limits and the turns."""

    def __init__(self, pool: PipelinePool, default_stack: str = "offline", serving: Serving | None = None) -> None:
        self.pool, self.default_stack, self.serving = pool, default_stack, serving
        self.turns = Turns()
        shared = (pool, default_stack, serving, self.turns)
        self.pricing, self.corpus = PricingEvents(*shared), CorpusEvents(*shared)
        self.answers, self.api = AskEvents(*shared), ApiEvents(*shared)
