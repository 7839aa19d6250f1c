"""BART (or any seq2seq LM) as in the paper's RAG checkpoints: `title / text // question`, as
transformers' RagRetriever builds it, with the passage cut to its token budget first so that
truncation never cuts the question (the `Generator` interface: models/generators.py).
"""
from __future__ import annotations

from typing import Sequence

import torch
from transformers.cache_utils import DynamicCache, EncoderDecoderCache
from transformers.masking_utils import create_bidirectional_mask

from rag_demo.models import Doc
from rag_demo.models.generators import ENCODER_DECODER, GenState, Generator, pad_rows
from rag_demo.models.kv_cache import GrowingCache, select_cache


class EncoderDecoderGenerator(Generator):
    """BART (or any seq2seq LM) as in the paper's RAG checkpoints."""

    kind = ENCODER_DECODER

    def __init__(self, model, tokenizer, name: str = "bart", max_input_tokens: int = 300):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.name = name
        cfg = model.config
        self.decoder_start_token_id = cfg.decoder_start_token_id
        self.pad_token_id = cfg.pad_token_id
        self.eos_token_ids = [cfg.eos_token_id]
        self.max_input_tokens = max_input_tokens  # the reference's max_combined_length

    def start_tokens(self) -> list[int]:
        return [self.decoder_start_token_id]

    def prompt(self, question: str, doc: Doc | None, max_doc_tokens: int, style: str = "sentence",
               question_position: str = "after", examples: Sequence[tuple] = ()) -> list[int]:
        # `style`, `question_position` and `examples` are ignored: BART-NQ was fine-tuned to answer in spans,
        # with this input format, and its encoder reads the whole input at once.
        tok = self.tokenizer
        if doc is None:
            return tok(question, truncation=True, max_length=self.max_input_tokens)["input_ids"]
        q_ids = tok(" // " + question, add_special_tokens=False)["input_ids"]
        budget = max(8, min(max_doc_tokens, self.max_input_tokens - len(q_ids) - 2))
        doc_ids = tok(f"{doc.title} / {doc.text}", add_special_tokens=False)["input_ids"]
        if len(doc_ids) > budget:  # cut the passage, never the question
            doc_ids = doc_ids[:budget]
        text = (tok.decode(doc_ids) + " // " + question).replace("  ", " ")
        return tok(text)["input_ids"]

    @torch.inference_mode()
    def prefill(self, prompts, keep_prompt_logprobs: int = 0):
        if keep_prompt_logprobs:
            raise ValueError(
                f"keep_prompt_logprobs={keep_prompt_logprobs!r}: an encoder-decoder generator reads its input, "
                "it does not predict it; "
                "use keep_prompt_logprobs=0 (question_tail is None for this generator)."
            )
        ids, mask = pad_rows(prompts, self.pad_token_id)  # (R, S) right-padded
        return self.prefill_ids(ids, mask)

    @torch.inference_mode()
    def prefill_ids(self, ids: torch.Tensor, mask: torch.Tensor):
        """Prefill from already-built input ids (R, S) and mask (R, S)."""
        hidden = self.model.get_encoder()(input_ids=ids, attention_mask=mask).last_hidden_state  # (R, S, H)
        state = GenState(
            cache=EncoderDecoderCache(GrowingCache(), DynamicCache()), mask=mask, encoder_hidden=hidden,
            cross_mask=self._cross_mask(mask, hidden),
        )
        start = torch.full((ids.shape[0], 1), self.decoder_start_token_id, dtype=torch.long)  # (R, 1)
        return self.advance(state, start)[:, -1], state  # (R, V)

    def _cross_mask(self, mask: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor | None:
        """The encoder padding mask (R, S) as the 4D mask the decoder's cross-attention takes, in
        the form the model's attention implementation wants (None when nothing is padded).
        Built once per prefill: given the 2D mask, transformers rebuilds it at every decoding
        step, a noticeable share of a step of the tiny test models (docs/DESIGN.md §5)."""
        return create_bidirectional_mask(
            config=self.model.config, inputs_embeds=hidden[:, :1], attention_mask=mask, encoder_hidden_states=hidden
        )  # (R, 1, 1, S) or None

    @torch.inference_mode()
    def _hidden(self, state, tokens):
        out = self.model.model(
            encoder_outputs=(state.encoder_hidden,),
            attention_mask=state.cross_mask,  # 4D, or None: the decoder uses it as given
            decoder_input_ids=tokens,
            past_key_values=state.cache,
            use_cache=True,
        )
        state.cache = out.past_key_values
        return out.last_hidden_state  # (R, L, H)

    def _logits(self, hidden):
        return self.model.lm_head(hidden) + self.model.final_logits_bias  # (..., V) as BartForConditionalGeneration

    def select(self, state, rows):
        return GenState(
            cache=select_cache(state.cache, rows),
            mask=state.mask.index_select(0, rows),
            encoder_hidden=state.encoder_hidden.index_select(0, rows),
            cross_mask=None if state.cross_mask is None else state.cross_mask.index_select(0, rows),
        )
