"""Reader aids: what helps a small generator read its passages, attached to the paper's algorithm as hooks."""
