"""rag-demo: Retrieval-Augmented Generation (Lewis et al., 2020) as a teaching demo.

Pipeline: encode -> retrieve -> generate -> attribute (see pipeline.py).
"""
