"""Whether SmolLM2 in PyTorch's dynamic int8 could be the generator of a CPU without native bfloat16
(docs/results.md §3.11): how far each variant moves the next-token distributions from float32, and
how fast it prefills and decodes.

    python experiments/int8_generator.py              # 16 dev questions x 3 passages, aided prompts
    python experiments/int8_generator.py --tiny       # smoke run

Variants: float32 (the reference), bfloat16 (the native path's drift, for scale), and
`torch.ao.quantization.quantize_dynamic` (int8 weights per output channel, activations quantised
per call) over every linear layer or over some of them. Prompts: the aided preset's prompts for the
question and each of its top 3 passages, each followed by the float32 model's own 6 greedy tokens;
over their last 40 positions, the mean KL(float32 || variant) of the next-token distribution and
how often the top token is the same. Speed: a prefill of 5 rows x 160 tokens and a decoding step of
10 rows after 200 tokens, best of a few. Numbers, not a test.
"""
from __future__ import annotations

import argparse
import copy
import json
import time
import warnings

import _shared  # noqa: F401 - puts the repository root on sys.path

# which linear layers each int8 variant quantises (a module name -> True)
VARIANTS = {
    "int8, every linear layer": lambda name: True,
    "int8, all but lm_head": lambda name: name != "lm_head",
    "int8, all but lm_head and down_proj": lambda name: name != "lm_head" and "down_proj" not in name,
    "int8, gate_proj and up_proj only": lambda name: "gate_proj" in name or "up_proj" in name,
    "int8, attention projections only": lambda name: "self_attn" in name,
}


def quantised(model, which):
    """A copy of `model` whose linear layers named by `which` are dynamically quantised to int8."""
    import torch

    m = copy.deepcopy(model)
    for mod in m.modules():  # back to plain nn.Linear (the generator's run on oneDNN): what quantize_dynamic swaps
        if isinstance(mod, torch.nn.Linear):
            mod.__class__ = torch.nn.Linear
    spec = {n: torch.ao.quantization.default_dynamic_qconfig for n, mod in m.named_modules()
            if isinstance(mod, torch.nn.Linear) and which(n)}
    with warnings.catch_warnings():  # torch.ao.quantization is deprecated in favour of torchao
        warnings.simplefilter("ignore")
        return torch.ao.quantization.quantize_dynamic(m, spec, dtype=torch.qint8)


def drift(model, sequences, reference, last: int):
    """(mean KL(reference || model) per position, top-1 agreement) over each sequence's last positions."""
    kl, same, n = 0.0, 0, 0
    for ids, ref in zip(sequences, reference):
        lp = next_token_lp(model, ids, last)  # (last, V)
        kl += float((ref.exp() * (ref - lp)).sum(-1).mean())
        same += int((lp.argmax(-1) == ref.argmax(-1)).sum())
        n += lp.shape[0]
    return kl / len(sequences), same / n


def next_token_lp(model, ids: list[int], last: int):
    """float32 log-probs (last, V) of the next token at each of the sequence's last positions."""
    import torch

    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([ids])).logits[0, -last:].float()  # (last, V)
    return torch.log_softmax(logits, -1)


def speed(model, vocab: int, rows: int = 5, tokens: int = 160, reps: int = 2) -> tuple[float, float]:
    """(seconds of a prefill of rows x tokens, seconds of a decoding step of 2*rows rows after 200 tokens), best of reps."""
    import torch

    ids = torch.randint(100, vocab, (rows, tokens))
    best_pre = best_step = float("inf")
    with torch.inference_mode():
        model(input_ids=ids)
        for _ in range(reps):
            t0 = time.perf_counter()
            model(input_ids=ids)
            best_pre = min(best_pre, time.perf_counter() - t0)
        past = model(input_ids=torch.randint(100, vocab, (2 * rows, 200)), use_cache=True).past_key_values
        step = torch.randint(100, vocab, (2 * rows, 1))
        for _ in range(reps + 2):
            t0 = time.perf_counter()
            past = model(input_ids=step, past_key_values=past, use_cache=True).past_key_values
            best_step = min(best_step, time.perf_counter() - t0)
    return best_pre, best_step


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=16, help="dev questions (default 16), 3 passages each")
    ap.add_argument("--tiny", action="store_true", help=_shared.TINY_HELP)
    args = ap.parse_args(argv)
    import torch

    from rag_demo.config import RagSettings
    from rag_demo.models.stack_spec import StackSpec
    from rag_demo.reader.aided import prompt

    torch.set_num_threads(2)
    if args.tiny:
        pipe = _shared.tiny_pipeline()
        questions = [q for q, _ in _shared.TINY_QA][: args.n]
    else:
        from rag_demo.pipeline import RagPipeline

        pipe = RagPipeline.load(StackSpec(generator_dtype="float32"))
        questions = [json.loads(line)["question"] for line in _shared.DEV_QA.open(encoding="utf-8")][: args.n]
    gen = pipe.stack.modes["token"].generator
    model, s = gen.model.float(), RagSettings(preset="aided")
    sequences = []
    for q in questions:
        for p in pipe.retrieve(q, k=3).passages:
            ids = list(prompt(gen, q, p, s.decoding, s.aids))
            for _ in range(6):  # the float32 model's own answer, so positions inside answers count too
                ids.append(int(next_token_lp(model, ids, 1)[-1].argmax()))
            sequences.append(ids)
    last = min(40, min(len(x) for x in sequences) - 1)
    reference = [next_token_lp(model, ids, last) for ids in sequences]
    vocab = model.config.vocab_size
    print(f"{len(sequences)} prompts ({len(questions)} questions x 3 passages), last {last} positions each; "
          f"{'tiny random model' if args.tiny else gen.name}, 2 threads\n")
    print("| generator | KL to float32, mean per position | top token as float32's | prefill 5 x 160, ms "
          "| decoding step, 10 rows, ms |")
    print("|---|---:|---:|---:|---:|")
    makes = {"float32": lambda: model, "bfloat16": lambda: copy.deepcopy(model).to(torch.bfloat16),
             "float32, BLAS linear layers (not oneDNN)": lambda: quantised(model, lambda name: False),
             **{name: (lambda w=which: quantised(model, w)) for name, which in VARIANTS.items()}}
    for name, make in makes.items():
        m = make()
        kl, agree = drift(m, sequences, reference, last)
        pre, step = speed(m, vocab)
        print(f"| {name} | {kl:.3g} | {100 * agree:.1f}% | {1000 * pre:.0f} | {1000 * step:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
