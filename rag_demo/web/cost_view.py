"""The cost line under the settings: what a typical question is expected to take with them, the
worst case the server's budget counts, and the budget itself.
"""

from __future__ import annotations

from typing import Any


from rag_demo.config import MODE_TITLES
from rag_demo.web.render import (
    esc,
    fmt_seconds,
)


def render_budget(budget: Any) -> str:
    """What the server allows, in a sentence (under the cost estimate)."""
    if budget is None:
        return ""
    return (
        f'<div class="rag-note">This server refuses a question estimated above {budget.max_seconds:.0f} s or '
        f"{budget.max_request_bytes / 2**30:.1f} GB, stops any answer after {budget.time_limit_s:.0f} s, and runs "
        f"questions estimated above {budget.heavy_seconds:.0f} s at low priority (cheaper questions go first at "
        "every model step).</div>"
    )


def render_cost(cost: Any, refusal: str | None, budget: Any = None, expected: dict[str, float] | None = None) -> str:
    """The cost of one question with the current settings (all three answers): what it is expected
    to take (a typical answer, what is kept counted; each card shows it again beside the time its
    answer took) and the worst case the server's budget counts (every answer to max new tokens)."""
    per = " · ".join(f"{MODE_TITLES.get(m, m)} {fmt_seconds(t)}" for m, t in (cost.per_mode or {}).items())
    verdict = (f'<div class="rag-over">Over this server\'s limit, a question would be refused: {esc(refusal)}</div>'
               if refusal else '<div class="rag-note">Expensive: runs at low priority.</div>' if cost.heavy else "")
    typical = ""
    if expected:
        each = " · ".join(f"{MODE_TITLES.get(m, m)} {fmt_seconds(t)}" for m, t in expected.items())
        typical = (f'Expected for a typical question with these settings: <b data-expected="{sum(expected.values()):.3f}">'
                   f"{fmt_seconds(sum(expected.values()))}</b> ({esc(each)}). ")
    return (
        f'<div class="rag-cost" data-seconds="{cost.seconds:.3f}" data-heavy="{int(bool(cost.heavy))}" '
        f'data-refused="{int(bool(refusal))}">{typical}Worst case (every answer to max new tokens), what this '
        f"server's budget counts: <b>{esc(cost.describe())}</b>" + (f'<div class="rag-note">{esc(per)}</div>' if per else "")
        + verdict + render_budget(budget) + "</div>"
    )
