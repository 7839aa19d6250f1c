"""Measurement: eval (retrieval and answer quality), bench (speed, memory), scale, parity with transformers."""
