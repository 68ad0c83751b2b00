"""Batch translation, one loop for every engine: tokenize, sort by length so batches hold little padding, give each
batch its length budget, decode, and return the translations in the input order. The engines behind it are
`generate()` (`GenerateTranslator`, this module), CTranslate2 (`tools.ctranslate2.CTranslate2Translator`) and
onnxruntime (`tools.onnx.OnnxTranslator`); they import the loop, which imports none of them (`tools.engines` picks
one by name)."""

import numpy as np
import torch
from tqdm.auto import tqdm

from ..support_vanilla_transformer import check_int


class InputTooLong(ValueError):
    """`texts[index]` has more tokens than the engine (or the caller's `max_source_length`) takes; `describe`
    names the input the caller's way (a line of a file, say)."""

    def __init__(self, index: int, tokens: int, limit: int, text: str, what: str, remedy: str):
        self.index, self.tokens, self.limit, self.text, self.what, self.remedy = index, tokens, limit, text, what, remedy
        super().__init__(self.describe(f"`texts[{index}]`"))

    def describe(self, name: str) -> str:
        return f"{name} has {self.tokens} tokens, more than {self.what}: {self.text[:80]!r}. {self.remedy}"


class Translator:
    """The loop. An engine sets `tokenizer`, `decoding` (the model's saved settings: num_beams, max_new_tokens,
    max_new_tokens_over_input, max_length), optionally `max_positions` (the longest input it takes), and
    implements `generate(input_ids, attention_mask, num_beams, max_new_tokens, num_hypotheses)` on one right-padded
    numpy batch, returning the `num_hypotheses` best sequences of token ids of each row, best first, row after row."""

    tokenizer = None
    decoding: dict = {}
    max_positions: int | None = None

    def generate(self, input_ids: np.ndarray, attention_mask: np.ndarray, num_beams: int, max_new_tokens: int,
                 num_hypotheses: int = 1):
        raise NotImplementedError

    def budget(self, source_length: int, max_new_tokens: int | None) -> int | None:
        """New tokens a batch may decode: the caller's, else the saved one, else its longest source plus the
        saved offset (§6.1: input length + 50), else what `max_length` leaves after the decoder's start token."""
        if max_new_tokens is not None:
            return max_new_tokens
        if self.decoding.get("max_new_tokens") is not None:
            return self.decoding["max_new_tokens"]
        offset = self.decoding.get("max_new_tokens_over_input")
        return source_length + offset if offset is not None else self.decoding["max_length"] - 1

    def translate(self, texts: list[str], batch_size: int = 64, num_beams: int | None = None,
                  max_new_tokens: int | None = None, max_source_length: int | None = None,
                  progress: bool = False) -> list[str]:
        """Translate `texts`, returned in their order; `num_beams` / `max_new_tokens` override the saved settings.
        An input longer than `max_source_length` (or than the engine takes) raises `InputTooLong` before any
        decoding."""
        return [best for best, in self.hypotheses(texts, 1, batch_size, num_beams, max_new_tokens, max_source_length,
                                                  progress)]

    def hypotheses(self, texts: list[str], num_hypotheses: int, batch_size: int = 64, num_beams: int | None = None,
                   max_new_tokens: int | None = None, max_source_length: int | None = None,
                   progress: bool = False) -> list[list[str]]:
        """The `num_hypotheses` best translations of each of `texts`, best first, from a beam of at least that many
        (the saved beam size, or `num_beams`, where it is larger)."""
        if isinstance(texts, str):
            raise TypeError("`texts` must be a list of strings, not one string.")
        for name, value in (("batch_size", batch_size), ("num_beams", num_beams), ("max_new_tokens", max_new_tokens),
                            ("num_hypotheses", num_hypotheses)):
            if value is not None:
                check_int(f"`{name}`", value)
        texts = list(texts)
        ids = self.tokenizer(texts)["input_ids"] if texts else []
        self._check_lengths(texts, ids, max_source_length)
        order = sorted(range(len(texts)), key=lambda i: -len(ids[i]))
        results: list[list[str] | None] = [None] * len(texts)
        beams = max(num_beams or self.decoding.get("num_beams") or 1, num_hypotheses)
        for start in tqdm(range(0, len(order), batch_size), desc="translating", disable=not progress, unit="batch"):
            indices = order[start:start + batch_size]
            batch = self.tokenizer.pad({"input_ids": [ids[i] for i in indices]}, return_tensors="np")
            output = self.generate(batch["input_ids"], batch["attention_mask"], beams,
                                   self.budget(batch["input_ids"].shape[1], max_new_tokens), num_hypotheses)
            decoded = [text.strip() for text in self.tokenizer.batch_decode(output, skip_special_tokens=True)]
            for row, i in enumerate(indices):
                results[i] = decoded[row * num_hypotheses:(row + 1) * num_hypotheses]
        return results

    def _check_lengths(self, texts, ids, max_source_length):
        limits = [(max_source_length, f"max_source_length={max_source_length}",
                   "Raise the limit rather than have it cut silently."),
                  (self.max_positions, f"the export's {self.max_positions} positions",
                   "Export again with a larger max_positions.")]
        for limit, what, remedy in limits:
            if limit is None:
                continue
            for i, sentence in enumerate(ids):
                if len(sentence) > limit:
                    raise InputTooLong(i, len(sentence), limit, texts[i], what, remedy)


class GenerateTranslator(Translator):
    """The model itself through `generate()`, which applies its own length budget (`max_new_tokens_over_input`,
    the same rule as `Translator.budget`) and any `generate_kwargs` (length_penalty_type, generation_config, ...)."""

    def __init__(self, model, tokenizer, **generate_kwargs):
        self.model, self.tokenizer, self.generate_kwargs = model, tokenizer, generate_kwargs
        config = generate_kwargs.get("generation_config") or model.generation_config
        self.decoding = {"num_beams": config.num_beams}

    def budget(self, source_length, max_new_tokens):
        return max_new_tokens

    def generate(self, input_ids, attention_mask, num_beams, max_new_tokens, num_hypotheses=1):
        device = next(self.model.parameters()).device
        kwargs = {**self.generate_kwargs, "num_beams": num_beams, "num_return_sequences": num_hypotheses}
        if max_new_tokens is not None:
            kwargs["max_new_tokens"] = max_new_tokens
        self.model.eval()
        with torch.inference_mode():
            return self.model.generate(input_ids=torch.from_numpy(input_ids).to(device),
                                       attention_mask=torch.from_numpy(attention_mask).to(device), **kwargs)


def translate(model, tokenizer, texts: list[str], batch_size: int = 64, max_source_length: int | None = None,
              progress: bool = False, **generate_kwargs) -> list[str]:
    """Translate `texts` with the model's `generate()`; generate kwargs (num_beams, max_new_tokens, ...) override
    the generation config."""
    num_beams, max_new_tokens = generate_kwargs.pop("num_beams", None), generate_kwargs.pop("max_new_tokens", None)
    return GenerateTranslator(model, tokenizer, **generate_kwargs).translate(
        texts, batch_size, num_beams, max_new_tokens, max_source_length, progress)


def cross_attention(model, tokenizer, text: str, **generate_kwargs) -> dict:
    """Translate `text`, then read back the model's encoder-decoder attention over it (the paper's Figures 3-5):
    {"translation", "source_tokens", "target_tokens", "weights": (layers, target, source), averaged over heads}.

    The weights are the model's own, returned by a teacher-forced forward over its translation with eager
    attention (the implementation that returns them); row t is the attention while predicting target token t.
    """
    device = next(model.parameters()).device
    model.eval()
    inputs = tokenizer([text], return_tensors="pt").to(device)
    with torch.inference_mode():
        generated = model.generate(**inputs, **generate_kwargs)
        implementation = model.config._attn_implementation
        model.set_attn_implementation("eager")
        try:
            out = model(**inputs, decoder_input_ids=generated[:, :-1], output_attentions=True, use_cache=False)
        finally:
            model.set_attn_implementation(implementation)
    weights = torch.stack([layer[0].float().mean(0) for layer in out.cross_attentions]).cpu()
    return {"translation": tokenizer.decode(generated[0], skip_special_tokens=True).strip(),
            "source_tokens": tokenizer.convert_ids_to_tokens(inputs["input_ids"][0].tolist()),
            "target_tokens": tokenizer.convert_ids_to_tokens(generated[0, 1:].tolist()), "weights": weights}


__all__ = ["Translator", "GenerateTranslator", "InputTooLong", "translate", "cross_attention"]
