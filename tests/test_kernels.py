"""A float32 generator's linear layers run on oneDNN (`models/kernels.onednn_linear`): the same
products in another summation order, so the same log-probs within float tolerance, the same
weights (tied ones stay tied), and bfloat16 layers left as they are."""
from __future__ import annotations

import copy
import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach the Hub

from rag_demo.models.kernels import OneDNNLinear, onednn_linear  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="this PyTorch build has no oneDNN")


def test_a_linear_layer_computes_what_it_did():
    torch.manual_seed(0)
    lin = torch.nn.Linear(48, 40)
    x = torch.randn(3, 7, 48)  # (R, L, H): the shape a decoder's projections see
    want = lin(x)
    assert onednn_linear(lin) == 1 and type(lin) is OneDNNLinear
    torch.testing.assert_close(lin(x), want, rtol=0, atol=1e-5)
    no_bias = torch.nn.Linear(48, 40, bias=False)
    want = no_bias(x)
    onednn_linear(no_bias)
    torch.testing.assert_close(no_bias(x), want, rtol=0, atol=1e-5)


def test_a_whole_model_keeps_its_log_probs_and_its_ties(smollm_tokenizer_folder):
    """The tiny random Llama with SmolLM2's tokenizer, its embeddings tied to its output layer as
    SmolLM2's are: every linear layer switched, log-probs within 1e-4 (float32 sums in another
    order over its layers), the tie kept. A bfloat16 copy is left alone."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(smollm_tokenizer_folder)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    torch.manual_seed(1)
    model = LlamaForCausalLM(cfg).eval()
    ids = torch.randint(0, len(tok), (2, 9))
    with torch.inference_mode():
        want = torch.log_softmax(model(input_ids=ids).logits, -1)
    half = copy.deepcopy(model).to(torch.bfloat16)
    n_linear = sum(type(m) is torch.nn.Linear for m in model.modules())
    assert onednn_linear(model) == n_linear > 0
    assert model.lm_head.weight is model.model.embed_tokens.weight
    with torch.inference_mode():
        got = torch.log_softmax(model(input_ids=ids).logits, -1)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-4)
    assert onednn_linear(half) == 0 and not any(isinstance(m, OneDNNLinear) for m in half.modules())
