"""A class's decoding step against its bound: `bench --batched` times one batched decoding step
(`Generator.advance_many`, serving/scheduler.py's one call for every waiting visitor) over 1, 5 and
20 visitors' RAG-Token states at the page's defaults, and divides it by the least time the step
could take on this CPU (measure/bound.py): one read of the weights for every row, and the FLOPs of
every row,

    body:  max(Σ_i (2·P·R_i + 4·layers·(heads·d)·R_i·S_i) / rate, P·b / read rate)
    head:  max(2·V·H·Σ_i R_i / rate, V·H·b / read rate)

(R_i a visitor's rows, S_i the positions its rows attend to). The multiple is how far the batched
step is from what batching can reach; a visitor's share of the step is the step / visitors.
"""
from __future__ import annotations

import statistics
import time

import torch

from rag_demo.config import RagSettings
from rag_demo.measure.bound import Call, Dims, Rates
from rag_demo.reader.reading import prompt, question_read

VISITORS = (1, 5, 20)


def step_bound(d: Dims, r: Rates, rows_keys: list[tuple[int, int]]) -> float:
    """The least seconds of one batched decoding step over states of (rows R_i, positions S_i). Its
    FLOPs are priced at the best rate the kernels reach at the generator's shapes (a prefill's):
    between a step's ~10 rows and a prefill's ~1,000 no measured rate would be a floor."""
    rows = sum(n for n, _ in rows_keys)
    keys = round(sum(n * s for n, s in rows_keys) / rows)  # Σ R_i S_i = rows · keys
    best = Rates(max(r.prefill_flops, r.decode_flops), max(r.prefill_flops, r.decode_flops), r.read_bytes)
    return Call("body", rows, 1, keys).seconds(d, best) + Call("head", 1, rows).seconds(d, best)


@torch.inference_mode()
def visitor_states(pipe, questions: list[str], settings: RagSettings) -> list[tuple]:
    """Each question's RAG-Token state after its prefill at `settings` (retrieval, the aids' reading,
    the prompts the page builds) and its first tokens: [(generator, state, tokens (R, 1))]."""
    gen = pipe.stack.modes["token"].generator
    out = []
    for q in questions:
        ret = pipe.retrieve(q, "token", settings.decoding.k)
        qg = question_read(settings.aids, q, ret.passages)
        prompts = [prompt(gen, qg, p, settings.decoding, settings.aids) for p in ret.passages]
        lp, state = gen.prefill(prompts)  # (R, V)
        out.append((gen, state, lp.argmax(-1, keepdim=True)))  # (R, 1)
    return out


@torch.inference_mode()
def batched_steps(pipe, questions: list[str], settings: RagSettings, rate: Rates,
                  visitors: tuple[int, ...] = VISITORS, steps: int = 5, say=lambda m: None) -> dict:
    """{visitors: {"step_s", "bound_s", "multiple", "rows", "per_visitor_s"}}: the median of `steps`
    batched steps over that many visitors' states (each step from fresh copies of the states), and
    its bound (`step_bound`). Needs max(visitors) questions; states are made once."""
    n = max(visitors)
    if len(questions) < n:
        raise ValueError(f"--batched needs {n} questions for {n} visitors; --qa gives {len(questions)}: use --n {n} "
                         "or more, from a file with that many.")
    say(f"Prefilling {n} visitors' RAG-Token states ...")
    gen = pipe.stack.modes["token"].generator
    kept = gen.hidden_cache.max_bytes
    gen.hidden_cache.max_bytes = 0  # every step runs the model: a class's steps are new tokens, never kept ones
    try:
        return _timed(gen, visitor_states(pipe, questions[:n], settings), rate, visitors, steps, say)
    finally:
        gen.hidden_cache.max_bytes = kept


def _timed(gen, states: list[tuple], rate: Rates, visitors: tuple[int, ...], steps: int, say) -> dict:
    d = Dims.of(gen.model)
    out = {}
    for v in visitors:
        group = states[:v]
        times = []
        for _ in range(steps + 1):  # the first warms this shape's kernels
            items = [(gen.select(st, torch.arange(st.rows)), tok) for _, st, tok in group]
            t0 = time.perf_counter()
            gen.advance_many(items)
            times.append(time.perf_counter() - t0)
        step = statistics.median(times[1:])
        rows_keys = [(st.rows, int(st.mask.shape[1]) + 1) for _, st, _ in group]
        bound = step_bound(d, rate, rows_keys)
        out[v] = {"step_s": step, "bound_s": bound, "multiple": step / bound,
                  "rows": sum(r for r, _ in rows_keys), "per_visitor_s": step / v}
        say(f"{v} visitors ({out[v]['rows']} rows): a step {1e3 * step:.0f} ms, bound {1e3 * bound:.1f} ms, "
            f"{step / bound:.1f}x; {1e3 * step / v:.0f} ms a visitor")
    return out
