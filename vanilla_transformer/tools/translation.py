"""Batch translation with beam search: sorted by length so batches hold little padding, returned in input order."""

import torch
from tqdm.auto import tqdm


def translate(model, tokenizer, texts: list[str], batch_size: int = 64, max_source_length: int | None = None,
              progress: bool = False, **generate_kwargs) -> list[str]:
    """Translate `texts`; generate kwargs (num_beams, max_new_tokens, ...) override the generation config."""
    if isinstance(texts, str):
        raise TypeError("`texts` must be a list of strings, not one string.")
    if batch_size < 1:
        raise ValueError(f"`batch_size` must be at least 1, got {batch_size}.")
    texts = list(texts)
    lengths = [len(ids) for ids in tokenizer(texts)["input_ids"]] if texts else []
    too_long = [i for i, n in enumerate(lengths) if max_source_length is not None and n > max_source_length]
    if too_long:
        i = too_long[0]
        raise ValueError(
            f"`texts[{i}]` has {lengths[i]} tokens, more than max_source_length={max_source_length}: "
            f"{texts[i][:80]!r}. Raise the limit rather than have it cut silently."
        )
    order = sorted(range(len(texts)), key=lambda i: -lengths[i])
    results: list[str | None] = [None] * len(texts)
    device = next(model.parameters()).device
    model.eval()
    batches = range(0, len(order), batch_size)
    for start in tqdm(batches, desc="translating", disable=not progress, unit="batch"):
        indices = order[start:start + batch_size]
        inputs = tokenizer([texts[i] for i in indices], return_tensors="pt", padding=True).to(device)
        with torch.inference_mode():
            output = model.generate(**inputs, **generate_kwargs)
        for i, text in zip(indices, tokenizer.batch_decode(output, skip_special_tokens=True)):
            results[i] = text.strip()
    return results


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
