"""The trained weights: a question tower on top of the frozen retriever, and the generator's change
in peft's LoRA format (a full fine-tune's rank-32 approximation today: docs/results.md §7), as
`python -m rag_demo train` writes them (docs/DESIGN.md §12).

What ships is small: the generator's change as a rank-32 LoRA adapter (peft's two files; a
question map, one D x D matrix, when the retriever stage was trained: none ships today), with
`meta.json` naming how they were made and each file's sha256. The passage encoder
and the index are never trained (paper §2.4), so every index stays valid:

    q'(x) = normalize(q(x) + A q(x))        the question tower; A = 0 is the frozen retriever

The adapter is merged into a copy of the generator's weights at load (`merged_generator`), so the
trained generator answers at the same speed as the base one; the weights it does not change (the
embeddings, the norms) are shared with the base model, not copied.
"""
from __future__ import annotations

import hashlib
import json
import warnings
from pathlib import Path

import numpy as np
import torch

from rag_demo.models import Doc
from rag_demo.models.encoders import Encoder

TRAINED_DIR = Path(__file__).resolve().parent.parent.parent / "assets" / "trained"
MAP_FILE = "question_map.safetensors"
ADAPTER_DIR = "adapter"
META_FILE = "meta.json"


class QuestionMap(torch.nn.Module):
    """q' = normalize(q + A q): a residual linear map on unit question vectors (D,), A (D, D) zero at
    the start, so an untrained map is the frozen retriever exactly."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.A = torch.nn.Parameter(torch.zeros(dim, dim))  # (D, D)

    def forward(self, q: torch.Tensor) -> torch.Tensor:
        """q (..., D) float32 -> (..., D), unit length."""
        return torch.nn.functional.normalize(q + q @ self.A.T, dim=-1)  # (..., D)

    def save(self, path: Path) -> None:
        from safetensors.torch import save_file

        save_file({"A": self.A.detach().float().contiguous()}, str(path))

    @classmethod
    def load(cls, path: Path) -> "QuestionMap":
        from safetensors.torch import load_file

        A = load_file(str(path))["A"]  # (D, D)
        m = cls(A.shape[0])
        with torch.no_grad():
            m.A.copy_(A)
        return m.eval()


class MappedQuestionEncoder(Encoder):
    """The base encoder with the trained question map on its question vectors; passages are the
    base encoder's, unchanged (the index built with it stays valid)."""

    def __init__(self, base: Encoder, qmap: QuestionMap, tag: str) -> None:
        self.base, self.qmap = base, qmap
        self.name = f"{base.name} + trained question map"
        self.dim = base.dim
        self.passage_dtype = base.passage_dtype
        self._tag = tag

    def fingerprint(self) -> str:
        return hashlib.sha256(f"{self.base.fingerprint()}|question-map={self._tag}".encode()).hexdigest()

    def _questions_batch(self, questions: list[str]) -> torch.Tensor:
        return self.qmap(self.base._questions_batch(questions).float())  # (B, D)

    def _passages_batch(self, passages: list[Doc]) -> torch.Tensor:
        return self.base._passages_batch(passages)

    def passage_lengths(self, passages: list[Doc]) -> list[int]:
        return self.base.passage_lengths(passages)

    def encode_passages(self, *args, **kwargs) -> np.ndarray:
        return self.base.encode_passages(*args, **kwargs)


def sha256_file(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def shipped_files(folder: Path) -> list[Path]:
    """The files a trained folder ships besides meta.json (question map, adapter), sorted."""
    return sorted(p for p in Path(folder).rglob("*") if p.is_file() and p.name != META_FILE
                  and p.suffix in (".safetensors", ".json"))


def read_meta(folder: Path = TRAINED_DIR) -> dict:
    """The trained folder's meta.json, its files checked against the sha256 it records: a
    ValueError names the file whose hash differs, or the folder that holds no trained weights."""
    folder = Path(folder)
    meta_path = folder / META_FILE
    if not meta_path.is_file():
        raise ValueError(f"{folder} holds no trained weights ({META_FILE} missing): run `python -m rag_demo train` "
                         "first, or choose weights='base'.")
    meta = json.loads(meta_path.read_text(encoding="utf-8"))
    for rel, want in meta.get("files", {}).items():
        path = folder / rel
        if not path.is_file():
            raise ValueError(f"trained file {path} is missing: train again, or restore it from git.")
        got = sha256_file(path)
        if got != want:
            raise ValueError(f"trained file {path} has sha256 {got[:12]}..., not the {want[:12]}... {META_FILE} "
                             "records: it was changed after training; restore it or train again.")
    return meta


def trained_available(folder: Path = TRAINED_DIR) -> str | None:
    """None when the trained weights are there and intact, else why not (one sentence)."""
    try:
        read_meta(folder)
    except ValueError as e:
        return str(e)
    return None


def adapter_targets(folder: Path) -> set[str]:
    """The module names (q_proj, ...) the adapter in `folder/adapter` changes."""
    cfg = json.loads((Path(folder) / ADAPTER_DIR / "adapter_config.json").read_text(encoding="utf-8"))
    return set(cfg["target_modules"])


def merge_adapter(model32: torch.nn.Module, folder: Path) -> torch.nn.Module:
    """`model32` (float32, consumed) with the LoRA adapter in `folder/adapter` merged into its
    weights: W' = W + (alpha / r) B A on every target module (peft's merge_and_unload), in float32
    so that a later cast to bfloat16 rounds once, as the base weights are rounded."""
    from peft import PeftModel

    with warnings.catch_warnings():  # peft asks transformers a question transformers has renamed: noise in the log
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        return PeftModel.from_pretrained(model32, str(Path(folder) / ADAPTER_DIR)).merge_and_unload().eval()


def share_untouched(merged: torch.nn.Module, base: torch.nn.Module, targets: set[str]) -> int:
    """Point every parameter of `merged` outside the adapter's target modules at `base`'s own (same
    names, shapes and dtype): the embeddings (tied to the output layer) and the norms are then held
    once. -> how many tensors are shared."""
    base_mods = dict(base.named_modules())
    n = 0
    for name, mod in merged.named_modules():
        if name.rsplit(".", 1)[-1] in targets or name not in base_mods:
            continue
        other = base_mods[name]
        for pname, p in list(mod.named_parameters(recurse=False)):
            q = getattr(other, pname, None)
            if isinstance(q, torch.nn.Parameter) and q.shape == p.shape and q.dtype == p.dtype:
                setattr(mod, pname, q)
                n += 1
    return n
