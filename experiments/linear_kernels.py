"""Does the float32 generator run faster on oneDNN than on PyTorch's own float32 linear (MKL) on
this CPU? (docs/results.md §3.12: `models/kernels.onednn_linear` is applied on every CPU.)

    python experiments/linear_kernels.py            # 2 threads, best of 10
    python experiments/linear_kernels.py --tiny     # smoke run

Two measures, each with SmolLM2's linear layers on MKL (`nn.Linear`) and on oneDNN
(`OneDNNLinear`), the same weights:
1. GEMM rates: GFLOP/s of SmolLM2's MLP matrices (576 -> 1536, 1536 -> 576) for a prefill-shaped
   input (800 rows: 5 prompts of 160 tokens) and a decoding-shaped one (10 rows).
2. SmolLM2-135M-Instruct itself, float32: a prefill of 5 x 160 tokens and one decoding step over
   10 rows with 170 positions of keys and values, and the largest log-prob difference between the two.
Numbers, not a test; the CPU is printed with them.
"""
from __future__ import annotations

import argparse

import _shared  # puts the repository root on sys.path


def use(model, kernel: str) -> None:
    """Every float32 linear layer of `model` on `kernel` ("mkl": nn.Linear, "onednn": OneDNNLinear)."""
    import torch

    from rag_demo.models.kernels import OneDNNLinear

    for mod in model.modules():
        if isinstance(mod, torch.nn.Linear):
            mod.__class__ = OneDNNLinear if kernel == "onednn" else torch.nn.Linear


def gemm_rates(reps: int) -> None:
    import torch

    print("| linear | rows | MKL GFLOP/s | oneDNN GFLOP/s | oneDNN / MKL |")
    print("|---|---:|---:|---:|---:|")
    for i, o in ((576, 1536), (1536, 576)):
        lin = torch.nn.Linear(i, o, bias=False)  # (o, i)
        for rows in (800, 10):
            x = torch.randn(rows, i)  # (R, i)
            rate = {}
            with torch.inference_mode():
                for kernel in ("mkl", "onednn"):
                    use(lin, kernel)
                    rate[kernel] = 2 * rows * i * o / _shared.best_of(lambda: lin(x), reps) / 1e9  # noqa: B023
            print(f"| {i} -> {o} | {rows} | {rate['mkl']:.0f} | {rate['onednn']:.0f} | "
                  f"{rate['onednn'] / rate['mkl']:.2f}x |", flush=True)


def model_times(reps: int, tiny: bool) -> None:
    import torch

    if tiny:
        model = _shared.tiny_generator().model.float()
    else:
        from rag_demo.models.stack_spec import StackSpec
        from rag_demo.models.stacks import load_smollm

        model = load_smollm(StackSpec(generator_dtype="float32")).model
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(100, 40000, (5, 160), generator=g)  # (5, 160)
    context = torch.randint(100, 40000, (10, 170), generator=g)  # (10, 170)
    step = torch.randint(100, 40000, (10, 1), generator=g)  # (10, 1)
    out = {}
    with torch.inference_mode():
        for kernel in ("mkl", "onednn"):
            use(model, kernel)
            past = model(context, use_cache=True).past_key_values  # 170 positions, 10 rows

            def decode(past=past):
                logits = model(step, past_key_values=past, use_cache=True).logits  # (10, 1, V)
                past.crop(-1)  # the step taken back: every timed step reads the same 170 positions
                return logits

            out[kernel] = {
                "prefill": _shared.best_of(lambda: model(prompts, use_cache=True), max(2, reps // 2)),
                "step": _shared.best_of(decode, reps),
                "logprobs": torch.log_softmax(model(prompts).logits.float(), -1),  # (5, 160, V)
            }
    diff = (out["mkl"]["logprobs"] - out["onednn"]["logprobs"]).abs().max().item()
    print()
    print("| SmolLM2-135M float32 | MKL | oneDNN | oneDNN / MKL time |")
    print("|---|---:|---:|---:|")
    for what, label in (("prefill", "prefill, 5 x 160 tokens"), ("step", "decoding step, 10 rows")):
        a, b = out["mkl"][what], out["onednn"][what]
        print(f"| {label} | {a * 1e3:.1f} ms | {b * 1e3:.1f} ms | {b / a:.2f} |")
    print(f"\nlargest log-prob difference, MKL against oneDNN: {diff:.2e}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    ap.add_argument("--reps", type=int, default=10, help="timed calls per measure, best taken (default 10)")
    ap.add_argument("--tiny", action="store_true", help="the tiny random generator, 1 timed call each: a smoke run")
    args = ap.parse_args(argv)
    import torch

    from rag_demo.measure.evaluate import machine_info

    torch.set_num_threads(args.threads)
    reps = 1 if args.tiny else args.reps
    mc = machine_info()
    print(f"CPU: {mc['processor']}; torch {mc['torch']}, {args.threads} threads\n")
    gemm_rates(reps)
    model_times(reps, args.tiny)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
