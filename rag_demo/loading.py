"""Loading a pipeline: the stack's models, then its corpus's index (from the disk cache, built, or
built in the background while BM25 answers), or a knowledge dataset's vectors as they are."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

from rag_demo.config import RagSettings
from rag_demo.models.stack_spec import StackSpec
from rag_demo.indexes import Progress
from rag_demo.knowledge.corpus import Corpus, load_vital_articles
from rag_demo.knowledge.hf_format import Knowledge
from rag_demo.models.stacks import load_stack

# A corpus this small embeds in seconds: its index is built before answering (the demo's uploads
# and fixture corpora); larger ones answer with BM25 while it is built.
BACKGROUND_MIN_PASSAGES = 1000


def load_pipeline(cls, spec: StackSpec | None = None, corpus: Corpus | None = None,
                  settings: RagSettings | None = None, progress: Progress | None = None, rebuild_index: bool = False,
                  knowledge: Knowledge | None = None, background_index: bool = False,
                  build_gate: str | None = None) -> Any:
    """A `cls` (RagPipeline) for this stack and corpus: load the stack's models, then the index for
    `corpus` (Vital Articles by default), or
    use `knowledge` (a loaded knowledge dataset: its vectors and FAISS index as they are).
    `background_index`: a corpus of BACKGROUND_MIN_PASSAGES or more whose index is not
    cached is answered from at once, with BM25, while its dense index is built
    (`indexes.Indexes.in_background`); `build_gate`: a file that build waits for before it completes
    (tests only).

    progress(fraction or None, message) is called before each slow step and while passages
    are embedded (models 0-0.5, index 0.5-1.0): what the CLI prints and the app's status shows.
    """
    spec = spec or StackSpec()
    say = progress or (lambda frac, msg: None)
    if knowledge is not None and corpus is not None:
        raise ValueError("both a corpus and a knowledge dataset were given: pass one of them.")
    with ThreadPoolExecutor(1, thread_name_prefix="load-corpus") as beside:
        # the default corpus's pages are read while the models load (a cold start waits for the longer)
        vital = beside.submit(load_vital_articles, cache_dir=spec.cache_dir) if corpus is None and knowledge is None else None
        say(0.02, f"Loading the {spec.name} stack's models ...")
        steps = iter((0.05, 0.2, 0.3, 0.4))  # load_stack says what it loads before each model
        stack = load_stack(spec, lambda msg: say(next(steps, 0.45), msg))
        say(0.5, f"Models loaded in {stack.load_seconds:.1f} s")
        if knowledge is not None:
            knowledge.check_encoder(stack.ctx_encoder, spec.name)
            say(1.0, f"Using the knowledge dataset {knowledge.dataset_path} ({len(knowledge.index):,} passages)")
            return cls(stack, knowledge.index, settings, knowledge.info())
        if vital is not None:
            say(0.5, "Loading the Wikipedia Vital Articles passages ...")
            corpus = vital.result()
    pipe = cls(stack, None, settings)
    if background_index and (len(corpus) >= BACKGROUND_MIN_PASSAGES or build_gate):
        pipe.indexes.in_background(corpus, progress, rebuild_index, build_gate)
    else:
        pipe.index, pipe.index_info = pipe.indexes.build_index(corpus, progress, rebuild_index, span=(0.5, 1.0))
    return pipe
