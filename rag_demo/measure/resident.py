"""`bench` 3: where a warm pipeline's resident memory goes, by part.

The kernel's page map (`/proc/self/smaps`) says what each resident page backs: a shared library
(code and data of torch, the interpreter, ...), another mapped file (weights files, the corpus's
Arrow pages) or anonymous memory (every heap). Anonymous memory is split by measuring: what the
process held before loading anything (interpreter and imported libraries' heaps), the tensors the
pipeline holds (weights, index, kept states, each counted once), and what is left over, reported as
"not attributed" so that the parts always say how much of the resident set they explain.
"""
from __future__ import annotations

from pathlib import Path

SMAPS = Path("/proc/self/smaps")
LIBRARIES, FILES, ANONYMOUS = "libraries (mapped code and data)", "mapped files (weights, corpus pages)", "anonymous"


def mapped(smaps: Path = SMAPS) -> dict[str, int]:
    """Resident bytes by what backs them: LIBRARIES (.so files), FILES (any other file), ANONYMOUS
    (heaps, anonymous maps, stacks). Empty where the kernel has no smaps (not Linux)."""
    out = {LIBRARIES: 0, FILES: 0, ANONYMOUS: 0}
    try:
        lines = smaps.read_text().splitlines()
    except OSError:
        return {}
    kind = ANONYMOUS
    for line in lines:
        fields = line.split()
        if not fields:
            continue
        if "-" in fields[0] and not fields[0].endswith(":"):  # a mapping's header: range perms offset dev inode [path]
            path = fields[5] if len(fields) > 5 else ""
            if path.startswith("/") and (path.endswith(".so") or ".so." in path):
                kind = LIBRARIES
            elif path.startswith("/"):
                kind = FILES
            else:
                kind = ANONYMOUS  # [heap], [stack], [anon:...] and unnamed maps
        elif fields[0] == "Rss:":
            out[kind] += int(fields[1]) * 1024
    return out


def tensor_parts(pipe) -> dict[str, int]:
    """Bytes of the tensors a pipeline holds: each generator's and encoder's weights (tensors shared
    between models counted once), the index (its vectors and the FAISS copy of them), and the states
    generators keep for later questions (passages' keys and values, hidden states)."""
    import numpy as np

    seen: set[int] = set()

    def weights(module) -> int:
        n = 0
        for t in [*module.parameters(), *module.buffers()]:
            if t.data_ptr() not in seen:
                seen.add(t.data_ptr())
                n += t.numel() * t.element_size()
        return n

    stacks = [pipe.stack.modes] + ([pipe.stack._trained] if getattr(pipe.stack, "_trained", None) else [])
    gens = {id(mm.generator): mm.generator for modes in stacks for mm in modes.values()}
    encoders = {id(pipe.stack.ctx_encoder): pipe.stack.ctx_encoder}
    parts = {"generators": sum(weights(g.model) for g in gens.values()),
             "encoders": sum(weights(e.model) for e in encoders.values() if hasattr(e, "model"))}
    index = pipe.index
    vectors = getattr(index, "embeddings", None)
    parts["index"] = (int(np.asarray(vectors).nbytes) if vectors is not None else 0) + (
        int(index.index.ntotal * index.index.d * 4) if hasattr(index, "index") else 0)
    kept = 0
    for g in gens.values():
        kept += sum(c.stats().bytes for c in g.kept_caches().values())
        kept += sum(sum(layer.keys.numel() * layer.keys.element_size() * 2 for layer in kv.layers)
                    for _, kv in getattr(getattr(g, "openings", None), "kept", []))
    parts["kept states"] = kept
    return parts


def memory_parts(pipe, before: dict[str, int], rss: int) -> dict[str, int]:
    """The resident set `rss` by part, in bytes: mapped libraries and files as the page map has them
    now; the anonymous memory held before loading (`before`, `mapped()` then); the pipeline's tensors
    (`tensor_parts`); and "not attributed", what is left of `rss` (library heaps grown since, the
    modules imported while loading, the allocator's free lists)."""
    now = mapped()
    parts = {LIBRARIES: now.get(LIBRARIES, 0), FILES: now.get(FILES, 0),
             "interpreter and libraries' heaps before loading": before.get(ANONYMOUS, 0), **tensor_parts(pipe)}
    parts["not attributed"] = rss - sum(parts.values())
    return parts
