"""The translation pipeline: what it prints is what generate + batch_decode give for the same settings."""

import ast
import functools
import random
import sys

import pytest
import torch
from conftest import tiny_model
from transformers.dynamic_module_utils import check_imports

import vanilla_transformer.pipeline_vanilla_transformer as pipeline_module
from vanilla_transformer.pipeline_vanilla_transformer import VanillaTranslationPipeline, translation_pipeline
from vanilla_transformer.data.tokenization import train_shared_tokenizer

WORDS = "the a one two cat dog bird sees chases likes big small red green house tree river car".split()
SOURCES = ["the cat sees a dog", "two red birds", "a small green house by the river", "dog"]



@functools.lru_cache
def toy_tokenizer():
    """A BPE tokenizer (vocabulary of about 70) trained on a few hundred generated sentences."""
    rng = random.Random(0)
    texts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 9))) for _ in range(400)]
    return train_shared_tokenizer(texts, vocab_size=80, show_progress=False)


def toy_translator(seed=0, **overrides):
    """An untrained tiny model whose vocabulary is the toy tokenizer's, and that tokenizer."""
    tokenizer = toy_tokenizer()
    return tiny_model(seed=seed, vocab_size=len(tokenizer), **overrides), tokenizer


def generate_and_decode(model, tokenizer, sources, batch_size, **generate_kwargs):
    texts = []
    for start in range(0, len(sources), batch_size):
        inputs = tokenizer(sources[start:start + batch_size], return_tensors="pt", padding=True)
        with torch.no_grad():
            outputs = model.generate(**inputs, **generate_kwargs)
        texts += tokenizer.batch_decode(outputs, skip_special_tokens=True)
    return texts


SETTINGS = {
    "greedy": dict(num_beams=1, max_new_tokens=7),
    "beam": dict(num_beams=3, length_penalty=0.6, max_new_tokens=9),
    "beam_long_penalty": dict(num_beams=4, length_penalty=2.0, max_new_tokens=6, early_stopping=True),
    "model_defaults": dict(),  # beam 4, length penalty 0.6, source length + 50 tokens (§6.1)
}


@pytest.mark.parametrize("settings", SETTINGS.values(), ids=SETTINGS.keys())
@pytest.mark.parametrize("batch_size", [1, 3])
def test_pipeline_text_equals_generate_and_batch_decode(settings, batch_size):
    model, tokenizer = toy_translator()
    expected = generate_and_decode(model, tokenizer, SOURCES, batch_size, **settings)
    translator = translation_pipeline(model, tokenizer)
    outputs = translator(SOURCES, batch_size=batch_size, **settings)
    assert outputs == [{"translation_text": text} for text in expected]


def test_generation_kwargs_given_at_construction_apply_to_every_call():
    model, tokenizer = toy_translator(seed=1)
    translator = translation_pipeline(model, tokenizer, num_beams=3, length_penalty=1.5)
    expected = generate_and_decode(model, tokenizer, SOURCES, 2, num_beams=3, length_penalty=1.5, max_new_tokens=5)
    assert [o["translation_text"] for o in translator(SOURCES, batch_size=2, max_new_tokens=5)] == expected


def test_one_string_gives_a_list_with_one_translation():
    model, tokenizer = toy_translator()
    expected = generate_and_decode(model, tokenizer, SOURCES[:1], 1, max_new_tokens=6)
    assert translation_pipeline(model, tokenizer)(SOURCES[0], max_new_tokens=6) == [{"translation_text": expected[0]}]


def test_several_return_sequences_give_one_list_per_input():
    model, tokenizer = toy_translator()
    settings = dict(num_beams=3, num_return_sequences=2, max_new_tokens=6)
    expected = generate_and_decode(model, tokenizer, SOURCES, 2, **settings)
    outputs = translation_pipeline(model, tokenizer)(SOURCES, batch_size=2, **settings)
    assert [[o["translation_text"] for o in per_input] for per_input in outputs] == [
        expected[i:i + 2] for i in range(0, len(expected), 2)
    ]


def test_return_tensors_gives_the_generated_ids():
    model, tokenizer = toy_translator()
    inputs = tokenizer(SOURCES[:1], return_tensors="pt")
    expected = model.generate(**inputs, num_beams=2, max_new_tokens=6)[0]
    (output,) = translation_pipeline(model, tokenizer)(SOURCES[0], return_tensors=True, num_beams=2, max_new_tokens=6)
    assert torch.equal(output["translation_token_ids"], expected)


def test_pipeline_keeps_the_model_on_its_device_and_its_config_untouched():
    model, tokenizer = toy_translator()
    before = model.config.to_dict()
    translator = translation_pipeline(model, tokenizer)
    assert isinstance(translator, VanillaTranslationPipeline) and translator.device == model.device
    translator(SOURCES[:2], max_new_tokens=3)
    assert model.config.to_dict() == before


def test_non_string_input_fails_with_its_type():
    model, tokenizer = toy_translator()
    with pytest.raises(TypeError, match="translates strings, got int"):
        translation_pipeline(model, tokenizer)(7)


def test_pipeline_file_imports_only_torch_transformers_and_the_standard_library():
    # The Hub serves this file as remote code: any other import breaks loading without the package.
    path = pipeline_module.__file__
    tree = ast.parse(open(path, encoding="utf-8").read())
    roots = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            assert node.level == 0, "relative imports would need their files saved beside the pipeline"
            roots.add(node.module.split(".")[0])
        elif isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
    assert roots - sys.stdlib_module_names <= {"torch", "transformers"}
    check_imports(path)  # what transformers runs before importing remote code
