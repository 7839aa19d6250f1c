"""What a visitor's settings cost: the settings' cost line, how far the budget-bound sliders reach
now, and the budget's refusal of a question before it runs (the validators of Ask and of an edit).
"""
from __future__ import annotations


import gradio as gr

from rag_demo.config import KNOBS, MODES, RagSettings, check_question
from rag_demo.serving.session import Session, active_index
from rag_demo.web.answering import TYPICAL_QUESTION, fit_k
from rag_demo.web.cost_view import render_cost
from rag_demo.web.render import esc
from rag_demo.web.validation import logs_refusals, settings_from_inputs, validate_ask, validate_edit
from rag_demo.web.turns import Part


class PricingEvents(Part):
    """The cost line, the sliders' reach and the budget's refusals: the cost model only, no model runs."""

    def refuse(self, question: str, settings: RagSettings, s: Session) -> str | None:
        """The budget's refusal of this question (None: allowed, or the models are not loaded
        yet: the handler checks again once they are). Never raises: it runs in a validator."""
        pipe = self.pool.loaded(self.fresh(s).stack)
        if self.serving is None or pipe is None:
            return None
        try:
            settings, _ = fit_k(pipe, active_index(self.fresh(s), pipe), settings)
            cost = self.serving.check(pipe, check_question(question), settings)
            busy = self.serving.heavy_busy() if cost is not None and cost.heavy else None
            if busy:
                return f"This question is expensive ({cost.describe()}): {busy}"
        except ValueError as e:
            return str(e)
        except Exception:  # noqa: BLE001 - the handler checks again and reports
            return None
        return None

    def validate_ask(self, question, s, **settings):
        return validate_ask(question, s, self.refuse, **settings)

    def validate_edit(self, pid, new_text, question, s, **fields):
        return validate_edit(pid, new_text, question, s, self.refuse, **fields)

    def estimate(self, s=None, **settings):
        """The settings accordion's cost line: the estimated time and memory of one question (a
        typical one) with these settings (by RagSettings field name; left out: the default), and
        whether the server would refuse it. Cheap: the library's cost model, no model runs."""
        s = self.fresh(s)
        pipe = self.pool.loaded(s.stack)
        if pipe is None or not hasattr(pipe, "estimate"):
            return ('<div class="rag-cost rag-placeholder">The estimated cost of these settings shows here once '
                    "the models are ready.</div>")
        try:
            settings = settings_from_inputs(**settings)
            settings, _ = fit_k(pipe, active_index(s, pipe), settings)
            cost = pipe.estimate(TYPICAL_QUESTION, list(MODES), settings)
            expected = pipe.expect(TYPICAL_QUESTION, list(MODES), settings) if hasattr(pipe, "expect") else {}
        except ValueError as e:
            return f'<div class="rag-cost rag-over">{esc(e)}</div>'
        refusal = None
        if self.serving is not None and self.serving.budget is not None:
            try:
                cost = self.serving.check(pipe, TYPICAL_QUESTION, settings) or cost  # sets cost.heavy
            except ValueError as e:
                refusal = str(e)
        return render_cost(cost, refusal, self.serving.budget if self.serving else None, expected)

    @logs_refusals
    def settle(self, s=None, **settings):
        """(the cost line, then each REACHED slider's reach) for these settings: one response, so
        the page settles in one update and a slider is re-rendered at most once per change (a
        re-render puts back the slider's value over what is being typed into its box)."""
        return (self.estimate(s, **settings), *self.reach(s, **settings))

    REACHED = ("k", "num_beams", "max_new_tokens")  # the knobs the server's budget bounds hardest

    def reach(self, s=None, **settings):
        """The K, beams and max-new-tokens sliders say how far this server admits them now with the
        other settings as they are (the budget at the machine's current speed); their ranges stay
        the knobs' own. Nothing changes while the models load, without a budget, or when the
        settings are invalid (the cost line says why)."""
        s = self.fresh(s)
        pipe = self.pool.loaded(s.stack)
        skip = tuple(gr.skip() for _ in self.REACHED)
        if pipe is None or not hasattr(pipe, "estimate") or self.serving is None or self.serving.budget is None:
            return skip
        try:
            settings = settings_from_inputs(**settings)
        except ValueError:
            return skip
        out = []
        for name in self.REACHED:
            spec, lo, hi = KNOBS[name], int(KNOBS[name].lo), int(KNOBS[name].hi)
            if name == "k":
                hi = min(hi, len(active_index(s, pipe)))

            def admitted(v: int) -> bool:
                try:
                    self.serving.check(pipe, TYPICAL_QUESTION, settings.merged(**{name: v}))
                    return True
                except ValueError:
                    return False

            top = lo
            if admitted(hi):
                top = hi
            else:  # the largest admitted value, by bisection (the cost grows with each of these knobs)
                a, b = lo, hi
                while a < b:
                    mid = (a + b + 1) // 2
                    a, b = (mid, b) if admitted(mid) else (a, mid - 1)
                top = a
            note = "" if top == int(KNOBS[name].hi) else (
                f" This server admits up to {top} with your other settings: more is refused, saying what to lower.")
            # the range itself never moves: a slider whose maximum fell under the value it held
            # made gradio refuse every later Ask until the page was reloaded
            out.append(gr.Slider(info=spec.help + note))
        return tuple(out)
