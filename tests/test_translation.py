"""The one translation loop every engine runs behind: input order kept, batches sorted by length, each batch's
length budget, the saved decoding settings, and an input that is too long refused by index before any decoding."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import tiny_model, tiny_tokenizer
from vanilla_transformer.tools.engines import load_translator
from vanilla_transformer.tools.translation import InputTooLong, Translator, translate

ROOT = Path(__file__).resolve().parents[1]


class EchoTranslator(Translator):
    """An engine that 'translates' a source into itself and records what the loop asked of it."""

    def __init__(self, decoding, max_positions=None):
        self.tokenizer, self.decoding, self.max_positions = tiny_tokenizer(), decoding, max_positions
        self.calls = []

    def generate(self, input_ids, attention_mask, num_beams, max_new_tokens, num_hypotheses=1):
        self.calls.append({"lengths": attention_mask.sum(1).tolist(), "width": input_ids.shape[1],
                           "num_beams": num_beams, "max_new_tokens": max_new_tokens})
        return [np.concatenate([[1], ids[mask.astype(bool)]]) for ids, mask in zip(input_ids, attention_mask)]


SOURCES = ["w5 w6", "w7", "w8 w9 w10 w11", "w12 w13 w14"]
SAVED = {"num_beams": 4, "max_new_tokens": None, "max_new_tokens_over_input": 50, "max_length": 20}


def test_the_loop_returns_the_input_order_from_batches_sorted_longest_first():
    engine = EchoTranslator(SAVED)
    assert engine.translate(SOURCES, batch_size=2) == SOURCES
    # Token counts include eos; each batch is padded to its longest row only.
    assert [(call["lengths"], call["width"]) for call in engine.calls] == [([5, 4], 5), ([3, 2], 3)]


def test_each_batch_gets_its_own_budget_and_the_saved_beam_unless_told_otherwise():
    engine = EchoTranslator(SAVED)
    engine.translate(SOURCES, batch_size=2)
    assert [(c["num_beams"], c["max_new_tokens"]) for c in engine.calls] == [(4, 55), (4, 53)]  # longest source + 50
    engine.calls.clear()
    engine.translate(SOURCES, batch_size=4, num_beams=1, max_new_tokens=7)
    assert [(c["num_beams"], c["max_new_tokens"]) for c in engine.calls] == [(1, 7)]
    fixed = EchoTranslator({**SAVED, "max_new_tokens_over_input": None})
    fixed.translate(SOURCES[:1])
    assert fixed.calls[0]["max_new_tokens"] == 19  # max_length 20 less the decoder's start token, as generate()


def test_an_input_too_long_is_refused_by_index_before_anything_is_decoded():
    engine = EchoTranslator(SAVED, max_positions=4)
    with pytest.raises(InputTooLong, match=r"`texts\[2\]` has 5 tokens, more than the export's 4 positions") as error:
        engine.translate(SOURCES)
    assert (error.value.index, error.value.tokens, error.value.limit) == (2, 5, 4) and engine.calls == []
    assert error.value.describe("--input line 7").startswith("--input line 7 has 5 tokens")
    with pytest.raises(InputTooLong, match=r"`texts\[2\]` has 5 tokens, more than max_source_length=3"):
        EchoTranslator(SAVED).translate(SOURCES, max_source_length=3)


@pytest.mark.parametrize("argument, value, error", [("batch_size", 0, ValueError), ("num_beams", 0, ValueError),
                                                    ("max_new_tokens", -1, ValueError), ("batch_size", 2.5, TypeError)])
def test_bad_settings_are_named(argument, value, error):
    with pytest.raises(error, match=f"`{argument}` must be an int of at least 1, got {value}"):
        EchoTranslator(SAVED).translate(SOURCES, **{argument: value})
    with pytest.raises(TypeError, match="a list of strings, not one string"):
        EchoTranslator(SAVED).translate("w5 w6")


def test_generate_behind_the_loop_matches_generate_on_each_sentence_alone():
    model, tokenizer = tiny_model(), tiny_tokenizer()
    batched = translate(model, tokenizer, SOURCES, batch_size=3, num_beams=3, max_new_tokens=6)
    alone = [tokenizer.decode(model.generate(**tokenizer([s], return_tensors="pt"), num_beams=3, max_new_tokens=6)[0],
                              skip_special_tokens=True).strip() for s in SOURCES]
    assert batched == alone


def test_an_unknown_engine_or_a_quantization_it_lacks_is_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match="engine='tensorrt' is not one of"):
        load_translator("tensorrt", tmp_path)
    with pytest.raises(ValueError, match="quantized='int8' is for the onnxruntime engine"):
        load_translator("ctranslate2", tmp_path, quantized="int8")


def test_the_command_line_names_the_input_line_that_is_too_long(tmp_path):
    model, tokenizer = tiny_model(), tiny_tokenizer()
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    (tmp_path / "input.en").write_text("w5 w6\n\nw7 w8 w9 w10 w11\n")
    run = subprocess.run([sys.executable, str(ROOT / "scripts" / "translate.py"), "--model", str(tmp_path / "model"),
                          "--input", str(tmp_path / "input.en"), "--max_new_tokens", "3", "--num_beams", "1",
                          "--device", "cpu", "--max_source_length", "4"], capture_output=True, text=True,
                         env={"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}, timeout=300)
    assert run.returncode == 1 and run.stdout == ""
    assert "--input line 3 has 6 tokens, more than max_source_length=4" in run.stderr
