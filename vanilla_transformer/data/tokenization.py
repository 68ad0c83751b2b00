"""Shared source/target BPE vocabulary, as in the paper (section 5.1)."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, UNK_TOKEN = "<pad>", "<s>", "</s>", "<unk>"
# Order fixes the ids the model config relies on: pad 0, bos 1, eos 2, unk 3.
SPECIAL_TOKENS = [PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, UNK_TOKEN]
METASPACE = "\u2581"


def _build_backend(lowercase: bool = False, split_punctuation: bool = False) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE(unk_token=UNK_TOKEN, fuse_unk=True))
    # NFC, not NFKC: NFKC would rewrite e.g. "½" or ligatures and break decode(encode(x)) == x.
    tokenizer.normalizer = normalizers.Sequence([normalizers.NFC(), normalizers.Lowercase()]) if lowercase \
        else normalizers.NFC()
    words = pre_tokenizers.Metaspace(replacement=METASPACE, prepend_scheme="always")
    # Punctuation is split off after the words are marked, so it carries no space marker of its own and
    # decoding still restores the text exactly: "▁dog." becomes "▁dog" "." rather than a token of its own.
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([words, pre_tokenizers.Punctuation("isolated")]) \
        if split_punctuation else words
    tokenizer.decoder = decoders.Metaspace(replacement=METASPACE, prepend_scheme="always")
    return tokenizer


def _eos_post_processor(eos_id: int) -> processors.TemplateProcessing:
    # Marian style: no bos on either side; the model shifts labels right and inserts the
    # decoder start token itself, so the target must end in eos but not start with bos.
    return processors.TemplateProcessing(
        single=f"$A:0 {EOS_TOKEN}:0",
        pair=f"$A:0 {EOS_TOKEN}:0 $B:1 {EOS_TOKEN}:1",
        special_tokens=[(EOS_TOKEN, eos_id)],
    )


def _non_empty(texts: Iterable[str]) -> Iterator[str]:
    if isinstance(texts, str):
        # A bare string would silently be trained on character by character.
        raise TypeError("texts must be an iterable of strings, not a single string")
    iterator = iter(texts)
    try:
        first = next(iterator)
    except StopIteration:
        raise ValueError("texts is empty: cannot train a tokenizer without any text") from None
    return itertools.chain([first], iterator)


def train_shared_tokenizer(
    texts: Iterable[str],
    vocab_size: int = 8000,
    min_frequency: int = 2,
    model_max_length: int = 1024,
    show_progress: bool = True,
    num_texts: int | None = None,
    lowercase: bool = False,
    split_punctuation: bool = False,
) -> PreTrainedTokenizerFast:
    """A shared BPE vocabulary of `vocab_size` tokens learnt from `texts`: strings, or batches (lists) of strings
    such as `corpora.sentence_batches` reads from a dataset's Arrow column; `num_texts` sizes the progress bar.
    With `lowercase` it is learnt from the lowercased text and lowercases all it encodes (a normalizer saved in
    tokenizer.json), so a model trained with it reads and writes lowercase, as the Multi30k literature trains.
    With `split_punctuation` no token joins punctuation to a word ("street." is "street" and "."), as BPE learnt on
    Moses-tokenized text has it; decoding still gives back the text exactly."""
    if vocab_size <= len(SPECIAL_TOKENS):
        raise ValueError(
            f"vocab_size={vocab_size} is too small: the {len(SPECIAL_TOKENS)} special tokens "
            f"{SPECIAL_TOKENS} alone need {len(SPECIAL_TOKENS)} ids, plus one per character of the alphabet"
        )
    length = num_texts or (len(texts) if hasattr(texts, "__len__") else None)  # only feeds the progress bar
    iterator = _non_empty(texts)

    backend = _build_backend(lowercase, split_punctuation)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=SPECIAL_TOKENS,
        show_progress=show_progress,
    )
    backend.train_from_iterator(iterator, trainer=trainer, length=length)

    trained_size = backend.get_vocab_size()
    if trained_size <= len(SPECIAL_TOKENS):
        raise ValueError("texts contain no characters to learn a vocabulary from (all strings are empty)")
    # The trainer never drops alphabet characters to honour vocab_size, it overshoots instead;
    # a vocabulary larger than requested would not fit the model's embedding matrix.
    if trained_size > vocab_size:
        raise ValueError(
            f"vocab_size={vocab_size} is too small to hold the {len(SPECIAL_TOKENS)} special tokens and the "
            f"alphabet of the training texts; at least {trained_size} is needed"
        )
    ids = [backend.token_to_id(token) for token in SPECIAL_TOKENS]
    if ids != list(range(len(SPECIAL_TOKENS))):  # the model config hard-codes these ids
        raise RuntimeError(f"special tokens {SPECIAL_TOKENS} got ids {ids}, expected 0..{len(SPECIAL_TOKENS) - 1}")
    backend.post_processor = _eos_post_processor(backend.token_to_id(EOS_TOKEN))

    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD_TOKEN,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        unk_token=UNK_TOKEN,
        model_max_length=model_max_length,
        # The transformers cleanup would glue " ." back to "." and break round-trips.
        clean_up_tokenization_spaces=False,
    )
