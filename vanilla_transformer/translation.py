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
            f"Input {i} has {lengths[i]} tokens, more than max_source_length={max_source_length}: "
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
