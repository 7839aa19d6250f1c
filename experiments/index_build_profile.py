"""Where an index build's time goes, and which batching wastes least (docs/results.md §3.2).

    python experiments/index_build_profile.py                     # 1,000 sampled passages, 1 thread, bfloat16 where native
    python experiments/index_build_profile.py --passage-dtype float32 --onnx   # also ONNX Runtime (pip install onnxruntime onnx)
    python experiments/index_build_profile.py --tiny              # smoke run

Prints, for the Vital Articles passages: how many tokens batches of 16 pad to when sorted by
characters (the old order) and by tokens (today's), over the whole corpus in resumable chunks;
then, on a seeded sample, the CPU seconds of each stage of a build (tokenising, the encoder's
forward and pooling, adding to FAISS), and both batchings in alternating rounds, with the largest
difference between their vectors. CPU time (process_time) rather than wall time: on a machine
shared with other jobs it counts this process's own work. Numbers, not a test.
"""
from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from pathlib import Path

import _shared  # noqa: F401 - puts the repository root on sys.path
import numpy as np


def padding(lengths: np.ndarray, key: np.ndarray, batch: int, chunk: int) -> float:
    """Padded tokens / real tokens when each chunk of `chunk` passages (corpus order) is sorted by
    `key`, longest first, and cut into batches of `batch`, each padded to its longest."""
    total = 0
    for c in range(0, len(lengths), chunk):
        rows = np.arange(c, min(c + chunk, len(lengths)))
        rows = rows[np.argsort(-key[rows], kind="stable")]
        total += sum(int(lengths[rows[s:s + batch]].max()) * len(rows[s:s + batch]) for s in range(0, len(rows), batch))
    return total / int(lengths.sum())


def onnx_session(encoder, folder: Path, threads: int):
    """ONNX Runtime session of the encoder's float32 model, exported into `folder`."""
    import onnxruntime as ort
    import torch

    path = folder / "minilm.onnx"
    enc = encoder.tokenizer(["a b", "c"], padding=True, return_tensors="pt")
    names = ["input_ids", "attention_mask", "token_type_ids"]

    class Hidden(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask, token_type_ids):
            return self.model(input_ids=input_ids, attention_mask=attention_mask,
                              token_type_ids=token_type_ids).last_hidden_state

    from transformers import AutoModel  # a copy: exporting must not touch the encoder's own model

    model = AutoModel.from_pretrained(encoder.path, local_files_only=True, attn_implementation="eager").eval()
    torch.onnx.export(Hidden(model), tuple(enc[n] for n in names), str(path), dynamo=False, input_names=names,
                      output_names=["h"], dynamic_axes={n: {0: "b", 1: "t"} for n in [*names, "h"]}, opset_version=17)
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=1000, help="passages sampled for the timings (default 1000)")
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds of each batching (default 3)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    p.add_argument("--passage-dtype", default="auto", choices=["auto", "float32", "bfloat16"])
    p.add_argument("--onnx", action="store_true", help="also time ONNX Runtime (float32) on the same batches")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tiny", action="store_true", help="a smoke run: 48 passages, one round, 600 for the padding")
    args = p.parse_args(argv)

    import faiss
    import torch

    from rag_demo.knowledge.corpus import load_vital_articles
    from rag_demo.knowledge.index import RESUME_CHUNK
    from rag_demo.models.encoders import MAX_TOKENS, PASSAGE_BATCH, MiniLMEncoder
    from rag_demo.models.stacks import resolve_dtype

    torch.set_num_threads(args.threads)
    if args.tiny:
        args.n, args.rounds = 48, 1
    passages = load_vital_articles(limit=500 if args.tiny else None).passages
    enc = MiniLMEncoder(passage_dtype=resolve_dtype(args.passage_dtype))
    dtype = str(enc.passage_dtype).removeprefix("torch.")
    lengths = np.array(enc.passage_lengths(passages))
    chars = np.array([len(q.title) + len(q.text) for q in passages])
    print(f"{len(passages):,} passages, {int(lengths.sum()):,} tokens ({lengths.mean():.1f} a passage, at most "
          f"{lengths.max()}); padded / real tokens in batches of {PASSAGE_BATCH}, chunks of {RESUME_CHUNK}: "
          f"sorted by characters {padding(lengths, chars, PASSAGE_BATCH, RESUME_CHUNK):.3f}x, "
          f"by tokens {padding(lengths, lengths, PASSAGE_BATCH, RESUME_CHUNK):.3f}x, "
          f"unsorted {padding(lengths, np.zeros_like(lengths), PASSAGE_BATCH, RESUME_CHUNK):.3f}x")

    rows = sorted(random.Random(args.seed).sample(range(len(passages)), min(args.n, len(passages))))
    sample = [passages[i] for i in rows]
    texts = [f"{q.title}: {q.text}" for q in sample]
    n = len(sample)

    def batches(key) -> list[list[int]]:
        order = sorted(range(n), key=lambda i: -key[i])
        return [order[s:s + PASSAGE_BATCH] for s in range(0, n, PASSAGE_BATCH)]

    orders = {"characters": batches([chars[i] for i in rows]), "tokens": batches([lengths[i] for i in rows])}

    def torch_run(order) -> tuple[float, float, np.ndarray]:
        """(CPU s tokenising, CPU s forward + pooling, vectors) with the encoder's own code path."""
        out, tok_s, fwd_s = np.zeros((n, enc.dim), np.float32), 0.0, 0.0
        with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bfloat16"):
            for b in order:
                t0 = time.process_time()
                e = enc.tokenizer([texts[i] for i in b], truncation=True, max_length=MAX_TOKENS, padding=True,
                                  return_tensors="pt")
                t1 = time.process_time()
                h = enc.model(**e).last_hidden_state.float()  # (B, T, H)
                m = e["attention_mask"].unsqueeze(-1).to(h.dtype)
                out[b] = torch.nn.functional.normalize((h * m).sum(1) / m.sum(1), dim=-1).numpy()
                tok_s, fwd_s = tok_s + t1 - t0, fwd_s + time.process_time() - t1
        return tok_s, fwd_s, out

    runs = {name: torch_run for name in orders}
    with tempfile.TemporaryDirectory() as tmp:
        if args.onnx:
            sess = onnx_session(enc, Path(tmp), args.threads)

            def ort_run(order):
                out, tok_s, fwd_s = np.zeros((n, enc.dim), np.float32), 0.0, 0.0
                for b in order:
                    t0 = time.process_time()
                    e = enc.tokenizer([texts[i] for i in b], truncation=True, max_length=MAX_TOKENS, padding=True,
                                      return_tensors="np")
                    t1 = time.process_time()
                    h = sess.run(None, {k: e[k].astype(np.int64) for k in ("input_ids", "attention_mask", "token_type_ids")})[0]
                    m = e["attention_mask"][..., None].astype(np.float32)
                    v = (h * m).sum(1) / m.sum(1)
                    out[b] = v / np.linalg.norm(v, axis=1, keepdims=True)
                    tok_s, fwd_s = tok_s + t1 - t0, fwd_s + time.process_time() - t1
                return tok_s, fwd_s, out

            runs["tokens, ONNX Runtime float32"] = ort_run
            orders["tokens, ONNX Runtime float32"] = orders["tokens"]
        torch_run(orders["tokens"][:2])  # warm-up
        cpu: dict[str, list[float]] = {k: [] for k in runs}
        vecs, stage = {}, {}
        for r in range(args.rounds):
            for name in (list(runs) if r % 2 == 0 else list(runs)[::-1]):
                tok_s, fwd_s, v = runs[name](orders[name])
                cpu[name].append(tok_s + fwd_s)
                vecs[name], stage[name] = v, (tok_s, fwd_s)
    t0 = time.process_time()
    index = faiss.IndexFlatIP(enc.dim)
    index.add(vecs["tokens"])
    faiss_s = time.process_time() - t0
    tok_s, fwd_s = stage["tokens"]
    print(f"\n{n} sampled passages (seed {args.seed}), {args.threads} thread(s), passages in {dtype}, load average "
          f"{os.getloadavg()[0]:.1f}; CPU seconds of one build (batched by tokens): tokenising {tok_s:.2f}, "
          f"forward + pooling {fwd_s:.2f}, FAISS add {faiss_s:.4f}\n")
    print("| batches sorted by | passages per CPU-second (median) | CPU s per round | max abs difference of the vectors |")
    print("|---|---:|---:|---:|")
    for name, ts in cpu.items():
        diff = float(np.abs(vecs[name] - vecs["characters"]).max())
        print(f"| {name} | {n / float(np.median(ts)):.0f} | {', '.join(f'{t:.2f}' for t in ts)} | {diff:.1e} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
