import os

# Must precede the transformers import: huggingface_hub reads these once, at import time.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"

import random

import pytest
from transformers import AutoTokenizer

from vanilla_transformer.data.tokenization import train_shared_tokenizer

EN_WORDS = "the a small house green tree dog runs quickly we see garden street over old new city night".split()
DE_WORDS = "das ein Haus grüner Baum Hund läuft schnell wir sehen Straße über Bäume Größe Übung schön".split()


def make_sentences(words, n, seed):
    rng = random.Random(seed)
    sentences = []
    for _ in range(n):
        body = " ".join(rng.choice(words) for _ in range(rng.randint(3, 12)))
        extra = rng.choice(["", f" {rng.randint(0, 2024)}", ", oder?", ": „ja“", " (3,5 %)"])
        sentences.append(body[0].upper() + body[1:] + extra + rng.choice([".", "!", "?"]))
    return sentences


@pytest.fixture(scope="module")
def corpus():
    return make_sentences(EN_WORDS, 300, seed=1), make_sentences(DE_WORDS, 300, seed=2)


@pytest.fixture(scope="module")
def tokenizer(corpus):
    src, tgt = corpus
    return train_shared_tokenizer(src + tgt, vocab_size=400, show_progress=False)


def test_round_trip(tokenizer, corpus):
    src, tgt = corpus
    unseen_combinations = ["Über die Straße läuft ein Hund, 42 Bäume!", "Größe: 3,5 % (schön)?", "we  see   it"]
    for text in src + tgt + unseen_combinations:
        ids = tokenizer(text).input_ids
        assert tokenizer.unk_token_id not in ids, text
        assert tokenizer.decode(ids, skip_special_tokens=True) == text


def test_nfc_normalisation(tokenizer):
    decomposed = "Gro\u0308\u00dfe u\u0308ber"  # o/u followed by a combining diaeresis
    assert tokenizer(decomposed).input_ids == tokenizer("Größe über").input_ids


def test_special_tokens_and_eos(tokenizer, corpus):
    assert (tokenizer.pad_token, tokenizer.bos_token, tokenizer.eos_token, tokenizer.unk_token) == (
        "<pad>",
        "<s>",
        "</s>",
        "<unk>",
    )
    assert (tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.unk_token_id) == (
        0,
        1,
        2,
        3,
    )
    assert tokenizer.convert_ids_to_tokens([0, 1, 2, 3]) == ["<pad>", "<s>", "</s>", "<unk>"]
    ids = tokenizer(corpus[0][0]).input_ids
    assert ids[-1] == 2 and ids.count(2) == 1
    assert ids[0] != 1, "no bos: the model prepends the decoder start token itself"
    assert len(tokenizer) <= 400
    assert tokenizer.model_max_length == 1024
    assert tokenizer("Hund \u2603").input_ids[-2] == 3  # unseen character


def test_text_target_gives_labels(tokenizer, corpus):
    src, tgt = corpus[0][:4], corpus[1][:4]
    batch = tokenizer(src, text_target=tgt)
    assert set(batch) == {"input_ids", "attention_mask", "labels"}
    assert batch["input_ids"] == tokenizer(src).input_ids
    assert batch["labels"] == tokenizer(tgt).input_ids
    assert all(labels[-1] == 2 for labels in batch["labels"])

    truncated = tokenizer(src, text_target=tgt, truncation=True, max_length=5)
    for ids, labels in zip(truncated["input_ids"], truncated["labels"]):
        assert len(ids) <= 5 and len(labels) <= 5
        assert ids[-1] == 2 and labels[-1] == 2

    padded = tokenizer(["Hund", "Der alte Hund läuft schnell"], padding=True)
    assert padded["input_ids"][0][-1] == 0 and padded["attention_mask"][0][-1] == 0


def test_save_and_reload_with_auto_tokenizer(tokenizer, corpus, tmp_path):
    tokenizer.save_pretrained(tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    texts = corpus[0] + corpus[1] + ["Hund \u2603 Straße"]
    assert reloaded(texts).input_ids == tokenizer(texts).input_ids
    assert reloaded.all_special_tokens == tokenizer.all_special_tokens
    assert (reloaded.pad_token_id, reloaded.bos_token_id, reloaded.eos_token_id, reloaded.unk_token_id) == (0, 1, 2, 3)
    assert reloaded.model_max_length == tokenizer.model_max_length
    assert reloaded.get_vocab() == tokenizer.get_vocab()
    assert reloaded.decode(reloaded(texts[0]).input_ids, skip_special_tokens=True) == texts[0]


def test_a_lowercasing_vocabulary_is_learnt_lowercased_and_lowercases_what_it_encodes(corpus, tmp_path):
    src, tgt = corpus
    lowercasing = train_shared_tokenizer(src + tgt, vocab_size=400, show_progress=False, lowercase=True)
    assert not any(any(c.isupper() for c in token) for token in lowercasing.get_vocab())
    lowercasing.save_pretrained(tmp_path)  # the normalizer travels in tokenizer.json, to every engine that reads it
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    text = "Über die Straße läuft ein Hund, 42 Bäume!"
    assert reloaded(text).input_ids == reloaded(text.lower()).input_ids == lowercasing(text).input_ids
    assert reloaded.decode(reloaded(text).input_ids, skip_special_tokens=True) == text.lower()
    assert reloaded.convert_ids_to_tokens([0, 1, 2, 3]) == ["<pad>", "<s>", "</s>", "<unk>"]


def test_a_vocabulary_with_punctuation_split_off_has_no_token_joining_it_to_a_word(corpus, tmp_path):
    src, tgt = corpus
    text = "The dog's ball, (red) t-shirt... \"quoted\"; 5.5% & a/b!"
    texts = src + tgt + ["Der Hund, der Ball.", "The dog's ball, the cat's (red) hat.", text] * 50
    joined = train_shared_tokenizer(texts, vocab_size=400, show_progress=False)
    splitting = train_shared_tokenizer(texts, vocab_size=400, show_progress=False, split_punctuation=True)
    def joins(vocabulary):
        return [t for t in vocabulary if any(c in ",.'()" for c in t) and any(c.isalnum() for c in t)]
    assert joins(joined.get_vocab()) and not joins(splitting.get_vocab())
    splitting.save_pretrained(tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    assert reloaded.tokenize("The dog's ball.") == splitting.tokenize("The dog's ball.")
    assert {",", ".", "'", "("} <= set(reloaded.tokenize(text))
    assert reloaded.decode(reloaded(text).input_ids, skip_special_tokens=True) == text


def test_accepts_a_generator(corpus):
    tokenizer = train_shared_tokenizer((s for s in corpus[1]), vocab_size=300, show_progress=False)
    assert tokenizer.decode(tokenizer(corpus[1][0]).input_ids, skip_special_tokens=True) == corpus[1][0]


@pytest.mark.parametrize("vocab_size", [3, 4, 20])
def test_vocab_size_too_small(corpus, vocab_size):
    with pytest.raises(ValueError, match=rf"vocab_size={vocab_size}\b"):
        train_shared_tokenizer(corpus[0] + corpus[1], vocab_size=vocab_size, show_progress=False)


@pytest.mark.parametrize("texts", [[], iter([]), (s for s in []), ["", ""]])
def test_empty_texts(texts):
    with pytest.raises(ValueError, match="empty"):
        train_shared_tokenizer(texts, show_progress=False)


def test_single_string_is_rejected():
    with pytest.raises(TypeError):
        train_shared_tokenizer("not a list of sentences", show_progress=False)
