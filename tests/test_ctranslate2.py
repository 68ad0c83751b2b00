"""The CTranslate2 export decodes as our model does, and says clearly what it cannot do."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import assert_exporter_cli_refuses, confident_model, hide_package, tiny_model, tiny_tokenizer
from vanilla_transformer.tools.translation import translate

ctranslate2 = pytest.importorskip("ctranslate2", reason="the CTranslate2 export is an optional extra")
from vanilla_transformer.tools.ctranslate2 import CTranslate2Translator, export_ctranslate2  # noqa: E402
from vanilla_transformer.tools.exports import EXPORT_RECORD  # noqa: E402
from vanilla_transformer.tools.translation import InputTooLong  # noqa: E402


def translate_ctranslate2(folder, texts, **kwargs):
    return CTranslate2Translator(folder).translate(texts, **kwargs)

ROOT = Path(__file__).resolve().parents[1]
# One batch, sentences of different lengths (the engine and generate() both pad them).
SOURCES = ["w5 w9 w7 w30", "w11 w12", "w40 w41 w42 w43 w44 w45 w6 w8 w20", "w33", "w7 w7 w8 w9 w10"]


@pytest.mark.parametrize("num_beams", [1, 4])
def test_the_fp32_export_translates_exactly_like_the_model(tmp_path, normalize_before, num_beams):
    model, tokenizer = confident_model(normalize_before), tiny_tokenizer()
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    export_ctranslate2(model, tmp_path / "ct2", tokenizer=tokenizer)
    # The converter works on copies: the model's own weights are untouched.
    assert all(torch.equal(before[name], tensor) for name, tensor in model.state_dict().items())
    settings = dict(num_beams=num_beams, max_new_tokens=10)
    ours = translate(model, tokenizer, SOURCES, batch_size=8, length_penalty_type="hf", **settings)
    exported = translate_ctranslate2(tmp_path / "ct2", SOURCES, batch_size=8, **settings)
    assert exported == ours
    assert num_beams > 1 or len(set(ours)) >= 2  # the translations depend on the source


def test_the_export_gives_every_target_token_the_models_log_probability(tmp_path, normalize_before):
    model, tokenizer = confident_model(normalize_before), tiny_tokenizer()
    folder = export_ctranslate2(model, tmp_path / "ct2", tokenizer=tokenizer)
    sources = [tokenizer.convert_ids_to_tokens(ids) for ids in tokenizer(SOURCES)["input_ids"]]
    targets = [list(reversed(tokens[:-1])) for tokens in sources]  # any target will do: it is scored, not searched
    scored = ctranslate2.Translator(str(folder)).score_batch(sources, targets)
    for text, target, result in zip(SOURCES, targets, scored):
        target_ids = tokenizer.convert_tokens_to_ids(target)
        with torch.no_grad():
            log_probs = model(**tokenizer([text], return_tensors="pt"),
                              decoder_input_ids=torch.tensor([[model.config.decoder_start_token_id, *target_ids]]),
                              ).logits[0].log_softmax(-1)
        expected = log_probs[torch.arange(len(target_ids) + 1), torch.tensor([*target_ids, model.config.eos_token_id])]
        torch.testing.assert_close(torch.tensor(result.log_probs), expected, atol=1e-4, rtol=0)


def test_an_export_refuses_inputs_longer_than_its_position_table(tmp_path):
    export_ctranslate2(confident_model(), tmp_path / "ct2", tokenizer=tiny_tokenizer(), max_positions=8)
    assert translate_ctranslate2(tmp_path / "ct2", ["w5 w6 w7"], max_new_tokens=4)
    with pytest.raises(InputTooLong, match=r"`texts\[1\]` has 10 tokens, more than the export's 8 positions") as error:
        translate_ctranslate2(tmp_path / "ct2", ["w5", "w5 w6 w7 w8 w9 w10 w11 w12 w13"])
    assert (error.value.index, error.value.tokens, error.value.limit) == (1, 10, 8)


def test_an_export_keeps_the_decoding_settings_and_never_overwrites(tmp_path):
    from vanilla_transformer import paper_generation_config

    model = confident_model()
    model.generation_config = paper_generation_config(model.config)
    folder = export_ctranslate2(model, tmp_path / "ct2", tokenizer=tiny_tokenizer())
    record = json.loads((folder / EXPORT_RECORD).read_text())
    assert (record["engine"], record["quantization"], record["max_positions"]) == ("ctranslate2", ["float32"], 1024)
    decoding = record["decoding"]
    assert (decoding["num_beams"], decoding["length_penalty"], decoding["length_penalty_type"],
            decoding["max_new_tokens_over_input"]) == (4, 0.6, "gnmt", 50)
    assert "GNMT" in (folder / "README.md").read_text() and (folder / "tokenizer.json").is_file()
    with pytest.raises(ValueError, match="not empty"):
        export_ctranslate2(model, folder, tokenizer=tiny_tokenizer())


def test_without_ctranslate2_the_exporter_says_how_to_install_it(monkeypatch, tmp_path):
    hide_package(monkeypatch, "ctranslate2")
    with pytest.raises(ImportError, match=r"pip install 'vanilla-transformer\[ctranslate2\]'"):
        export_ctranslate2(tiny_model(), tmp_path / "ct2", tokenizer=tiny_tokenizer())


def test_the_command_line_exports_a_saved_model_and_translates_with_it(tmp_path):
    model, tokenizer = confident_model(), tiny_tokenizer()
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    env = {"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
    subprocess.run([sys.executable, str(ROOT / "scripts" / "export_ctranslate2.py"), "--model", str(tmp_path / "model"),
                    "--output_dir", str(tmp_path / "ct2"), "--quantization", "int8"], check=True, env=env,
                   capture_output=True, timeout=300)
    lines = "w5 w9 w7\n\nw11 w12\n"  # a blank line stays blank, the order stays
    run = subprocess.run([sys.executable, str(ROOT / "scripts" / "translate.py"), "--engine", "ctranslate2",
                          "--model", str(tmp_path / "ct2"), "--max_new_tokens", "6"], input=lines, text=True,
                         check=True, env=env, capture_output=True, timeout=300)
    output = run.stdout.split("\n")
    assert len(output) == 4 and output[1] == "" and output[0] and output[2]
    assert output[0] == translate_ctranslate2(tmp_path / "ct2", ["w5 w9 w7"], max_new_tokens=6)[0]


@pytest.mark.parametrize("quantization", [None, "int8"])
def test_a_wrong_export_is_refused_by_its_own_verification_before_the_folder_appears(tmp_path, monkeypatch,
                                                                                    quantization):
    import vanilla_transformer.tools.ctranslate2 as export
    from vanilla_transformer.tools.verification import VerificationError

    correct = export.transformer_spec

    def misplaced_projection(*args, **kwargs):  # an exporter bug: the output layer's weights scaled
        spec = correct(*args, **kwargs)
        spec.decoder.projection.weight = spec.decoder.projection.weight * 1.5
        return spec

    monkeypatch.setattr(export, "transformer_spec", misplaced_projection)
    with pytest.raises(VerificationError, match=r"log-probabilities differ from the model's by up to .*nothing was "
                                                r"written.*--no_verify"):
        export_ctranslate2(confident_model(), tmp_path / "ct2", quantization=quantization, tokenizer=tiny_tokenizer())
    assert list(tmp_path.iterdir()) == []  # neither the folder nor its staging copy is left
    export_ctranslate2(confident_model(), tmp_path / "unchecked", tokenizer=tiny_tokenizer(), verify=False)
    assert (tmp_path / "unchecked" / "model.bin").is_file()


def test_the_verification_passes_a_correct_export_of_either_layer_norm_placement(tmp_path, normalize_before):
    from vanilla_transformer.tools.ctranslate2 import verify_ctranslate2

    model, tokenizer = confident_model(normalize_before), tiny_tokenizer()
    folder = export_ctranslate2(model, tmp_path / "ct2", tokenizer=tokenizer)
    assert 0 < verify_ctranslate2(model, tokenizer, folder, max_positions=1024) <= 1e-4


@pytest.mark.parametrize("case, flags, message", [
    ("existing output", [], "--output_dir {output} exists and is not empty"),
    ("no model", ["--model", "{missing}"], "--model {missing}: not a saved model folder"),
    ("max positions", ["--max_positions", "2"], "--max_positions must be at least 3, got 2"),
])
def test_the_command_line_refuses_by_flag_and_leaves_an_existing_folder_as_it_was(tmp_path, case, flags, message):
    assert_exporter_cli_refuses(ROOT / "scripts" / "export_ctranslate2.py", tmp_path, confident_model(),
                                tiny_tokenizer(), case, flags, message, earlier_export="model.bin")


def test_the_n_best_come_best_first_and_the_compute_type_is_measured_where_it_runs(tmp_path):
    model, tokenizer = confident_model(), tiny_tokenizer()
    export_ctranslate2(model, tmp_path / "ct2", tokenizer=tokenizer, max_positions=32)
    sources = ["w5 w9 w7", "w11 w12", "w13 w6 w8 w20"]
    translator = CTranslate2Translator(tmp_path / "ct2", threads=1)
    found = translator.hypotheses(sources, 3, num_beams=4, max_new_tokens=8)
    assert [hypotheses[0] for hypotheses in found] == translator.translate(sources, num_beams=4, max_new_tokens=8)
    assert all(len(hypotheses) == 3 for hypotheses in found) and any(len(set(h)) > 1 for h in found)
    from vanilla_transformer.tools.ctranslate2 import compute_type_speeds

    speeds = compute_type_speeds(tmp_path / "ct2", threads=1, sentences=4, length=4)
    assert {"float32", "int8"} <= set(speeds) and all(speed > 0 for speed in speeds.values())
    assert CTranslate2Translator(tmp_path / "ct2", threads=1, compute_type="fastest").compute_type in speeds
