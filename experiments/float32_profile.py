"""Where a RAG-Token and a RAG-Sequence answer's time goes with the generator in float32, and the
least time this CPU could take for the same model calls (docs/results.md §3.4).

    python experiments/float32_profile.py                  # 8 dev questions, aided defaults, K=5, float32, 2 threads
    python experiments/float32_profile.py --dtype bfloat16 # the same on the native path
    python experiments/float32_profile.py --tiny           # smoke run

Each mode is asked on its own, as `bench` does, with no passage kept (the prompts' opening stays
kept, as on a live server), after one warm-up answer per mode. The engine's and the reader's
stages (prefill, each doc's drafts, the mixture search, echo retries, title scoring, the branch
and bound over the candidates, the winner's scoring and the inspector's pass) are timed by
wrapping them; nested stages are shown as paths, with their own time (exclusive of the stages
inside them). Every call of the model body and of its vocabulary projection is recorded with its
shape: its FLOPs (2 per weight per token, plus attention's 4 per context position per width) and
the bytes it must read (every weight once, plus the KV cache). With the GEMM rate and the memory
bandwidth measured here, max(FLOPs / rate, bytes / bandwidth) summed over the calls is a lower
bound of each mode's model time on this CPU. Numbers, not a test.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict

import _shared  # puts the repository root on sys.path

# ---------------------------------------------------------------- the CPU's own rates


def _layer(i: int, o: int, dtype):
    """A linear layer (o, i) as the generator runs it: float32 on oneDNN (rag_demo.models.kernels)."""
    import torch

    from rag_demo.models.kernels import onednn_linear

    lin = torch.nn.Linear(i, o, bias=False).to(dtype)
    onednn_linear(lin)
    return lin


def gemm_gflops(dtype, m: int = 512, k: int = 576, n: int = 1536, reps: int = 20) -> float:
    """Best achieved GFLOP/s of (m, k) through a (k -> n) linear layer run as the generator runs its
    own: by default a prefill-shaped MLP matmul."""
    import torch

    a, lin = torch.randn(m, k, dtype=dtype), _layer(k, n, dtype)  # (m, k), (n, k)
    with torch.inference_mode():
        best = _shared.best_of(lambda: lin(a), reps)
    return 2 * m * k * n / best / 1e9


def linear_gbps(dtype, rows: int = 10, hidden: int = 576, inter: int = 1536, layers: int = 30, reps: int = 5) -> float:
    """Best achieved GB/s of weight traffic in decoding-shaped linear layers (run as the generator
    runs its own): `rows` rows through `layers` layers of SmolLM2's three MLP matrices, each its own
    tensor (more than any cache)."""
    import torch

    ws = [_layer(i, o, dtype) for _ in range(layers) for o, i in ((inter, hidden), (inter, hidden), (hidden, inter))]
    x_in, x_mid = torch.randn(rows, hidden, dtype=dtype), torch.randn(rows, inter, dtype=dtype)  # (R, H), (R, I)
    nbytes = sum(w.weight.numel() * w.weight.element_size() for w in ws)

    def sweep() -> None:
        for w in ws:
            w(x_in if w.in_features == hidden else x_mid)  # (R, out)

    with torch.inference_mode():
        best = _shared.best_of(sweep, reps)
    return nbytes / best / 1e9


# ---------------------------------------------------------------- stage timer


class Profile:
    """Inclusive seconds and calls per stage path ("rag_token > drafts > search"), and every
    model call with its shape, under the path it ran in."""

    def __init__(self) -> None:
        self.path: list[str] = []
        self.seconds: dict[tuple, float] = defaultdict(float)
        self.calls: dict[tuple, int] = defaultdict(int)
        self.model_calls: list[tuple[tuple, str, int, int, int, float]] = []  # path, part, rows, tokens, ctx, s
        self.undo: list = []  # what puts back every wrapped function and removes every hook (`restore`)

    def reset(self) -> None:
        self.seconds.clear()
        self.calls.clear()
        self.model_calls.clear()

    def timed(self, label: str, fn):
        def run(*args, **kwargs):
            self.path.append(label)
            key = tuple(self.path)
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[key] += time.perf_counter() - t0
                self.calls[key] += 1
                self.path.pop()
        return run

    def patch(self, module, name: str, label: str) -> None:
        real = getattr(module, name)
        setattr(module, name, self.timed(label, real))
        self.undo.append(lambda: setattr(module, name, real))

    def restore(self) -> None:
        """Undo every patch and hook, newest first: the models and modules as they were."""
        while self.undo:
            self.undo.pop()()

    def hook_model(self, gen) -> None:
        """Record every call of the model body (LlamaModel) and of lm_head: rows, tokens a row,
        context length (the attention mask's width), seconds."""
        body, head = gen.model.model, gen.model.lm_head
        started: dict[str, float] = {}

        def pre(part):
            def f(module, args, kwargs):
                started[part] = time.perf_counter()
                self.path.append(part)
            return f

        def post(part):
            def f(module, args, kwargs, out):
                self.path.pop()
                x = kwargs.get("input_ids") if part == "model body" else args[0]
                rows, length = x.shape[0], x.shape[1]  # ids (R, L) or hidden (R, L, H)
                mask = kwargs.get("attention_mask")
                ctx = mask.shape[1] if mask is not None and mask.dim() == 2 else length
                dt = time.perf_counter() - started[part]
                self.model_calls.append((tuple(self.path), part, rows, length, ctx, dt))
                key = (*self.path, part)
                self.seconds[key] += dt
                self.calls[key] += 1
            return f

        for part, m in (("model body", body), ("lm_head", head)):
            self.undo.append(m.register_forward_pre_hook(pre(part), with_kwargs=True).remove)
            self.undo.append(m.register_forward_hook(post(part), with_kwargs=True).remove)


def instrument(prof: Profile, gen) -> None:
    """Wrap the engine's and the reader's stages where they are looked up, and the generator's copies."""
    from rag_demo.rag import decoding, engine, hooks
    from rag_demo.reader import drafts, retries

    prof.patch(engine, "prefill", "prefill")
    prof.patch(engine, "doc_searches", "drafts (each doc's search)")
    prof.patch(drafts, "doc_searches", "drafts (each doc's search)")
    prof.patch(engine, "search", "search")
    prof.patch(hooks, "search", "search")  # an echo retry's greedy search
    prof.patch(retries, "retry_rejected", "echo retries")
    prof.patch(drafts, "with_titles", "title scoring")
    prof.patch(drafts, "choose_among_drafts", "choose among drafts")
    prof.patch(drafts, "rank_by_rag_token", "branch and bound")
    prof.patch(engine, "inspect_answer", "inspector pass")
    if hasattr(engine, "inspect_and_score"):  # the inspector's pass scoring the winner too
        prof.patch(engine, "inspect_and_score", "inspector pass, scoring the winner")
    prof.patch(engine, "score_candidates", "score the winner")
    prof.patch(decoding, "score_candidates", "score candidates")
    prof.patch(drafts, "score_candidates", "score candidates")
    gen.select = prof.timed("cache copy (select)", gen.select)
    prof.undo.append(lambda: delattr(gen, "select"))  # the instance attribute hid the method
    prof.hook_model(gen)


# ---------------------------------------------------------------- FLOPs and bytes


def model_dims(gen) -> dict:
    import torch

    cfg = gen.model.config
    body = sum(p.numel() for n, p in gen.model.model.named_parameters() if "embed_tokens" not in n)
    return {"layers": cfg.num_hidden_layers, "width": cfg.num_attention_heads * (cfg.hidden_size // cfg.num_attention_heads),
            "kv_width": cfg.num_key_value_heads * (cfg.hidden_size // cfg.num_attention_heads),
            "body": body, "head": gen.model.lm_head.weight.numel(),
            "elem": torch.finfo(next(gen.model.parameters()).dtype).bits // 8}


def call_cost(dims: dict, part: str, rows: int, length: int, ctx: int) -> tuple[float, float]:
    """(FLOPs, bytes) of one model call: weights read once per call; attention's scores and
    weighted sum 4 FLOPs per query, context position and width; the KV cache read once."""
    if part == "lm_head":
        return 2.0 * dims["head"] * rows * length, float(dims["head"] * dims["elem"])
    flops = 2.0 * dims["body"] * rows * length + 4.0 * dims["layers"] * dims["width"] * rows * length * ctx
    kv = 2.0 * dims["layers"] * dims["kv_width"] * rows * ctx * dims["elem"]
    return flops, dims["body"] * dims["elem"] + kv


def kind_of(path: tuple, part: str, length: int) -> str:
    if "prefill" in path:
        return "prefill"
    return "decoding step" if length == 1 else "teacher-forced"


# ---------------------------------------------------------------- report


def per_answer(prof: Profile, n: int) -> list[tuple[tuple, float, float, float]]:
    """[(path, calls per answer, inclusive s, exclusive s per answer)], by path."""
    children: dict[tuple, float] = defaultdict(float)
    for key, s in prof.seconds.items():
        if len(key) > 1:
            children[key[:-1]] += s
    return [(key, prof.calls[key] / n, s / n, (s - children[key]) / n) for key, s in sorted(prof.seconds.items())]


def bound_table(prof: Profile, dims: dict, n: int, gflops: float, gbps: float) -> tuple[list[str], float, float]:
    rows: dict[str, list[float]] = defaultdict(lambda: [0, 0, 0, 0, 0, 0])  # calls, tokens, GFLOP, GB, s, bound s
    for path, part, r, length, ctx, dt in prof.model_calls:
        flops, nbytes = call_cost(dims, part, r, length, ctx)
        x = rows[f"{kind_of(path, part, length)}: {part}"]
        x[0] += 1
        x[1] += r * length
        x[2] += flops / 1e9
        x[3] += nbytes / 1e9
        x[4] += dt
        x[5] += max(flops / 1e9 / gflops, nbytes / 1e9 / gbps)
    lines = ["| model calls | calls | tokens | GFLOP | GB read | measured s | bound s |", "|---|---:|---:|---:|---:|---:|---:|"]
    for name, x in sorted(rows.items()):
        lines.append(f"| {name} | {x[0] / n:.1f} | {x[1] / n:.0f} | {x[2] / n:.1f} | {x[3] / n:.2f} | {x[4] / n:.3f} "
                     f"| {x[5] / n:.3f} |")
    measured = sum(x[4] for x in rows.values()) / n
    bound = sum(x[5] for x in rows.values()) / n
    return lines, measured, bound


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=8, help="dev questions per mode, after one warm-up (default 8)")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"), help="generator weights (default float32)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    ap.add_argument("--modes", default="token,sequence", help="comma-separated modes (default token,sequence)")
    ap.add_argument("--tiny", action="store_true", help=_shared.TINY_HELP)
    args = ap.parse_args(argv)

    import torch

    from rag_demo.measure.latency import load_avg
    from rag_demo.measure.evaluate import machine_info
    from rag_demo.questions import load_qa

    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    if args.tiny:
        pipe = _shared.tiny_pipeline()
        questions = [q for q, _ in _shared.TINY_QA][: args.n + 1]
    else:
        from rag_demo.models.stack_spec import StackSpec
        from rag_demo.pipeline import RagPipeline

        pipe = RagPipeline.load(StackSpec(generator_dtype=args.dtype))
        questions = [it.question for it in load_qa(_shared.DEV_QA)][: args.n + 1]
    gen = pipe.stack.modes["token"].generator
    if next(gen.model.parameters()).dtype != dtype:
        gen.model.to(dtype)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    mc = machine_info()
    print(f"Machine: {mc['processor']}, {mc['cpus']} CPUs, torch {mc['torch']}, {args.threads} threads; "
          f"generator {args.dtype}; settings {pipe.settings.to_dict()['preset']} preset, K={pipe.settings.decoding.k}, "
          f"{pipe.settings.decoding.num_beams} beams; load average {load_avg()}")
    gflops = gemm_gflops(dtype)
    big = gemm_gflops(dtype, 2048, 2048, 2048, reps=3)
    gbps = linear_gbps(dtype, rows=10)
    gbps1 = linear_gbps(dtype, rows=1)
    print(f"\nGEMM {args.dtype}: {gflops:.0f} GFLOP/s at (512, 576) @ (576, 1536), {big:.0f} at 2048^3; "
          f"decoding-shaped F.linear over SmolLM2's MLP shapes ({args.dtype}): {gbps:.1f} GB/s at 10 rows, "
          f"{gbps1:.1f} at 1 row")

    prof = Profile()
    instrument(prof, gen)
    try:
        return _profile(prof, pipe, gen, modes, questions, gflops, gbps)
    finally:
        prof.restore()  # the pipeline may be used again in this process (the tests share the tiny one)


def _profile(prof: Profile, pipe, gen, modes, questions, gflops: float, gbps: float) -> int:
    """Each mode's answers timed stage by stage and bounded (main's measurement)."""
    from rag_demo.measure.latency import forget_passages, load_avg

    dims = model_dims(gen)
    n = max(1, len(questions) - 1)
    for mode in modes:
        forget_passages(pipe)
        pipe.answer(questions[0], mode)  # warm-up
        prof.reset()
        totals, answers = [], []
        for q in questions[1:]:
            forget_passages(pipe)
            t0 = time.perf_counter()
            a = pipe.answer(q, mode)
            totals.append(time.perf_counter() - t0)
            answers.append(a.text)
        print(f"\n### {mode}: {n} questions, end to end p50 {statistics.median(totals):.2f} s, mean "
              f"{statistics.mean(totals):.2f} s (load {load_avg()})\n")
        print("| stage (path) | calls / answer | inclusive s | own s | own share |\n|---|---:|---:|---:|---:|")
        mean = statistics.mean(totals)
        for key, calls, inc, own in per_answer(prof, n):
            print(f"| {' > '.join(key)} | {calls:.1f} | {inc:.3f} | {own:.3f} | {100 * own / mean:.0f}% |")
        lines, measured, bound = bound_table(prof, dims, n, gflops, gbps)
        print("\n" + "\n".join(lines))
        print(f"\nmodel calls {measured:.2f} s of {mean:.2f} s an answer; lower bound of the same calls on this CPU "
              f"{bound:.2f} s (GEMM {gflops:.0f} GFLOP/s, {gbps:.1f} GB/s); answers: {answers}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
