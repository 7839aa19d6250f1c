"""The paper: RAG-Sequence and RAG-Token (Lewis et al. 2020, arXiv 2005.11401), their marginals, decoding and attribution."""
