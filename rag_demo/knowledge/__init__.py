"""The non-parametric memory: corpora, passage splitting, FAISS indexes, BM25, the transformers RAG format."""
