"""The ONNX export computes the model's function at every decoding step, decodes as generate() does on
onnxruntime, loads in transformers.js, and refuses what it cannot do before anything is written."""

import http.server
import json
import random
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from conftest import assert_exporter_cli_refuses, confident_model, hide_package, snapshot, tiny_model, tiny_tokenizer
from vanilla_transformer.tools.translation import translate

onnxruntime = pytest.importorskip("onnxruntime", reason="the ONNX export is an optional extra (.[onnx])")
pytest.importorskip("onnxscript", reason="the ONNX export is an optional extra (.[onnx])")
from vanilla_transformer.tools.exports import EXPORT_RECORD  # noqa: E402
from vanilla_transformer.tools.onnx import OnnxSeq2Seq, OnnxTranslator, export_onnx, verify_onnx  # noqa: E402
from vanilla_transformer.tools.onnx.runtime import past_names  # noqa: E402


def translate_onnx(folder, texts, quantized=None, threads=1, **kwargs):
    return OnnxTranslator(folder, quantized, threads).translate(texts, **kwargs)

ROOT = Path(__file__).resolve().parents[1]
CLIENT = ROOT / "scripts" / "transformers_js"
_rng = random.Random(0)
SOURCES = [" ".join(f"w{_rng.randrange(4, 48)}" for _ in range(_rng.randrange(1, 12))) for _ in range(24)]
ENV = {"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}


def peaky_model(seed=0, normalize_before=False):
    """Confident translations of lengths from 0 to the budget (seed 0), so that a search that ranks or stops
    differently from generate() shows."""
    return confident_model(normalize_before, seed, weight_scale=0.25, embedding_scale=0.5, quiet_eos=False)


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    """The peaky model and its export, with the int8 graphs."""
    model = peaky_model()
    folder = export_onnx(model, tmp_path_factory.mktemp("onnx") / "export", quantize="int8", tokenizer=tiny_tokenizer())
    return model, folder


def test_the_folder_has_the_layout_and_names_transformers_js_reads(export):
    model, folder = export
    assert sorted(p.name for p in (folder / "onnx").iterdir()) == [
        "decoder_model_merged.onnx", "decoder_model_merged_quantized.onnx", "encoder_model.onnx",
        "encoder_model_quantized.onnx"]
    assert {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", EXPORT_RECORD,
            "README.md"} <= {p.name for p in folder.iterdir()}
    config = json.loads((folder / "config.json").read_text())
    assert (config["model_type"], config["is_encoder_decoder"], config["decoder_layers"], config["d_model"]) == (
        "marian", True, 2, 32)
    sessions = OnnxSeq2Seq(folder, threads=1).sessions
    encoder, decoder = sessions["encoder_model"], sessions["decoder_model_merged"]
    assert [i.name for i in encoder.get_inputs()] == ["input_ids", "attention_mask"]
    assert [o.name for o in encoder.get_outputs()] == ["last_hidden_state"]
    assert [i.name for i in decoder.get_inputs()] == ["input_ids", "encoder_attention_mask", "encoder_hidden_states",
                                                      *past_names(2, "past_key_values")]
    assert [o.name for o in decoder.get_outputs()] == ["logits", *past_names(2, "present")]
    # transformers.js makes the first step's empty past from these shapes: batch_size, fixed heads and head size.
    for past in decoder.get_inputs()[3:]:
        assert past.shape[0] == "batch_size" and past.shape[1:2] == [4] and past.shape[3] == 8
        assert isinstance(past.shape[2], str)


def test_every_step_gives_the_models_logits_first_step_and_with_past(tmp_path, normalize_before):
    model = peaky_model(normalize_before=normalize_before)
    folder = export_onnx(model, tmp_path / "export", tokenizer=tiny_tokenizer(), verify=False)
    assert verify_onnx(model, folder) <= 1e-4  # the whole target, then token by token with the returned past
    engine = OnnxSeq2Seq(folder, threads=1)
    input_ids = torch.tensor([[5, 9, 7, 30, 2], [11, 12, 2, 0, 0]])
    mask = (input_ids != 0).long()
    target = torch.tensor([[0, 17, 18, 19], [0, 20, 21, 22]])
    with torch.no_grad():
        expected = model(input_ids=input_ids, attention_mask=mask, decoder_input_ids=target).logits.numpy()
    states = engine.encode(input_ids.numpy(), mask.numpy())
    logits, past = engine.step(target[:, :2].numpy(), mask.numpy(), states, engine.empty_past(2))  # two at once
    torch.testing.assert_close(torch.from_numpy(logits), torch.from_numpy(expected[:, :2]), atol=1e-4, rtol=0)
    for position in (2, 3):
        logits, past = engine.step(target[:, position:position + 1].numpy(), mask.numpy(), states, past)
        torch.testing.assert_close(torch.from_numpy(logits[:, 0]), torch.from_numpy(expected[:, position]),
                                   atol=1e-4, rtol=0)
    assert past[0].shape == (2, 4, 4, 8) and past[2].shape == (2, 4, 5, 8)  # self past grew, encoder past did not


SEARCHES = {
    "greedy": dict(num_beams=1),
    "beam 4, GNMT penalty": dict(num_beams=4, length_penalty=0.6, length_penalty_type="gnmt"),
    "beam 4, |Y|^alpha": dict(num_beams=4, length_penalty=1.0, length_penalty_type="hf"),
    "beam 4, early stopping": dict(num_beams=4, length_penalty=0.6, length_penalty_type="gnmt", early_stopping=True),
    "beam 3, never stop early, negative alpha": dict(num_beams=3, length_penalty=-0.5, length_penalty_type="hf",
                                                     early_stopping="never"),
}


@pytest.mark.parametrize("search", SEARCHES)
def test_translate_onnx_decodes_exactly_like_generate(export, search, tmp_path):
    model, folder = export
    settings = SEARCHES[search]
    ours = translate(model, tiny_tokenizer(), SOURCES, batch_size=8, max_new_tokens=12, **settings)
    copy = Path(shutil.copytree(folder, tmp_path / "export"))
    record = json.loads((copy / EXPORT_RECORD).read_text())
    record["decoding"].update(length_penalty=settings.get("length_penalty", 1.0),
                              length_penalty_type=settings.get("length_penalty_type", "hf"),
                              early_stopping=settings.get("early_stopping", False))
    (copy / EXPORT_RECORD).write_text(json.dumps(record))
    exported = translate_onnx(copy, SOURCES, batch_size=8, num_beams=settings["num_beams"], max_new_tokens=12,
                              threads=1)
    assert exported == ours
    lengths = {len(text.split()) for text in ours}
    assert min(lengths) < 6 and 12 in lengths  # hypotheses end early and run to the budget: both paths are used


def test_the_saved_decoding_settings_are_the_models(tmp_path):
    from vanilla_transformer import paper_generation_config

    model = peaky_model()
    model.generation_config = paper_generation_config(model.config)
    folder = export_onnx(model, tmp_path / "export", tokenizer=tiny_tokenizer())
    record = json.loads((folder / EXPORT_RECORD).read_text())
    assert (record["engine"], record["quantization"]) == ("onnxruntime", ["float32"])
    decoding = record["decoding"]
    assert (decoding["num_beams"], decoding["length_penalty"], decoding["length_penalty_type"],
            decoding["max_new_tokens_over_input"]) == (4, 0.6, "gnmt", 50)
    ours = translate(model, tiny_tokenizer(), SOURCES[:8], batch_size=8)  # beam 4, GNMT, source + 50
    assert translate_onnx(folder, SOURCES[:8], batch_size=8, threads=1) == ours
    assert "GNMT" in (folder / "README.md").read_text()


def test_the_int8_graphs_are_smaller_and_translate(export):
    model, folder = export
    for name in ("encoder_model", "decoder_model_merged"):
        assert (folder / "onnx" / f"{name}_quantized.onnx").stat().st_size < (folder / "onnx" / f"{name}.onnx").stat().st_size
    int8 = translate_onnx(folder, SOURCES, num_beams=1, max_new_tokens=12, quantized="int8", threads=1)
    fp32 = translate_onnx(folder, SOURCES, num_beams=1, max_new_tokens=12, threads=1)
    assert len(int8) == len(SOURCES) and int8 != [""] * len(SOURCES)
    assert sum(a == b for a, b in zip(int8, fp32)) >= len(SOURCES) // 2  # quantization changes some, not all


def test_a_wrong_export_is_refused_by_its_own_verification_before_the_folder_appears(tmp_path, monkeypatch):
    import vanilla_transformer.tools.onnx.export as onnx_export
    from vanilla_transformer.tools.verification import VerificationError

    correct = onnx_export.DecoderGraph.forward

    def scaled_logits(self, input_ids, encoder_attention_mask, encoder_hidden_states, *past):  # the output layer scaled
        logits, *present = correct(self, input_ids, encoder_attention_mask, encoder_hidden_states, *past)
        return (logits * 1.5, *present)

    monkeypatch.setattr(onnx_export.DecoderGraph, "forward", scaled_logits)
    with pytest.raises(VerificationError, match=r"ONNX decoder's logits .*differ from the model's by up to .*nothing "
                                                r"was written.*--no_verify"):
        export_onnx(peaky_model(), tmp_path / "export", quantize="int8", tokenizer=tiny_tokenizer())
    assert list(tmp_path.iterdir()) == []  # neither the folder nor its staging copy is left
    export_onnx(peaky_model(), tmp_path / "unchecked", tokenizer=tiny_tokenizer(), verify=False)
    assert (tmp_path / "unchecked" / "onnx" / "decoder_model_merged.onnx").is_file()


def test_what_the_export_cannot_express_is_refused_by_name_before_anything_is_written(tmp_path):
    from transformers import MarianConfig, MarianMTModel

    with pytest.raises(ValueError, match=r"quantize='fp16' is not a quantization this export writes"):
        export_onnx(peaky_model(), tmp_path / "a", quantize="fp16", tokenizer=tiny_tokenizer())
    marian = MarianMTModel(MarianConfig(vocab_size=48, d_model=16, encoder_layers=1, decoder_layers=1,
                                        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
                                        decoder_ffn_dim=32, pad_token_id=0, decoder_start_token_id=0))
    with pytest.raises(ValueError, match=r"got a MarianMTModel.*convert_marian_to_vanilla"):
        export_onnx(marian, tmp_path / "b", tokenizer=tiny_tokenizer())
    with pytest.raises(ValueError, match=r"The tokenizer has 48 tokens, more than the model's vocab_size 40"):
        export_onnx(tiny_model(vocab_size=40), tmp_path / "c", tokenizer=tiny_tokenizer())
    existing = tmp_path / "d"
    existing.mkdir()
    (existing / "model.onnx").write_bytes(b"an earlier export")
    with pytest.raises(ValueError, match="not empty"):
        export_onnx(peaky_model(), existing, tokenizer=tiny_tokenizer())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"] and snapshot(existing) == {"model.onnx": b"an earlier export"}


def test_the_command_line_exports_a_saved_model_and_translates_with_it(tmp_path):
    model, tokenizer = peaky_model(), tiny_tokenizer()
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    subprocess.run([sys.executable, str(ROOT / "scripts" / "export_onnx.py"), "--model", str(tmp_path / "model"),
                    "--output_dir", str(tmp_path / "onnx"), "--quantize", "int8"], check=True, env=ENV,
                   capture_output=True, timeout=300)
    lines = f"{SOURCES[0]}\n\n{SOURCES[1]}\n"  # a blank line stays blank, the order stays
    for quantized in ([], ["--quantized", "int8"]):
        run = subprocess.run([sys.executable, str(ROOT / "scripts" / "translate.py"), "--engine", "onnxruntime",
                              "--model", str(tmp_path / "onnx"), "--max_new_tokens", "6", *quantized], input=lines,
                             text=True, check=True, env=ENV, capture_output=True, timeout=300)
        output = run.stdout.split("\n")
        assert len(output) == 4 and output[1] == "" and output[0] and output[2]
        assert output[0] == translate_onnx(tmp_path / "onnx", SOURCES[:1], max_new_tokens=6,
                                           quantized=quantized[-1] if quantized else None)[0]


@pytest.mark.parametrize("case, flags, message", [
    ("existing output", [], "--output_dir {output} exists and is not empty"),
    ("no model", ["--model", "{missing}"], "--model {missing}: not a saved model folder"),
    ("quantization", ["--quantize", "int4"], "--quantize int4: choose int8"),
])
def test_the_command_line_refuses_by_flag_and_leaves_an_existing_folder_as_it_was(tmp_path, case, flags, message):
    assert_exporter_cli_refuses(ROOT / "scripts" / "export_onnx.py", tmp_path, peaky_model(), tiny_tokenizer(), case,
                                flags, message, earlier_export="model.onnx")


def test_without_onnxruntime_the_engine_and_the_exporter_say_how_to_install_it(monkeypatch, export, tmp_path):
    hide_package(monkeypatch, "onnxruntime")
    with pytest.raises(ImportError, match=r"needs onnxruntime: pip install 'vanilla-transformer\[onnx\]'"):
        translate_onnx(export[1], SOURCES[:1])
    hide_package(monkeypatch, "onnxscript")
    with pytest.raises(ImportError, match=r"needs onnxscript: pip install 'vanilla-transformer\[onnx\]'"):
        export_onnx(peaky_model(), tmp_path / "export", tokenizer=tiny_tokenizer())
    assert not (tmp_path / "export").exists()


def transformers_js_missing() -> str | None:
    if shutil.which("node") is None:
        return "node is not installed"
    if not (CLIENT / "node_modules" / "@huggingface" / "transformers").is_dir():
        return f"transformers.js is not installed: npm ci --ignore-scripts --prefix {CLIENT}"
    return None


@pytest.mark.skipif(transformers_js_missing() is not None, reason=str(transformers_js_missing()))
@pytest.mark.parametrize("dtype", ["fp32", "q8"])
def test_transformers_js_loads_the_export_and_translates_like_our_greedy_search(export, tmp_path, dtype):
    model, folder = export
    (tmp_path / "sources.txt").write_text("\n".join(SOURCES) + "\n")
    run = subprocess.run(["node", str(CLIENT / "translate.mjs"), str(folder), str(tmp_path / "sources.txt"),
                          "--dtype", dtype, "--max_new_tokens", "12"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    theirs = [json.loads(line) for line in run.stdout.splitlines()]
    if dtype == "fp32":
        assert theirs == translate(model, tiny_tokenizer(), SOURCES, batch_size=8, max_new_tokens=12, num_beams=1)
    else:  # transformers.js's default in browsers, our int8 graphs: activations are quantized per call, so one
        # sentence a call as transformers.js runs them; its onnxruntime build may still round differently.
        ours = translate_onnx(folder, SOURCES, batch_size=1, num_beams=1, max_new_tokens=12, quantized="int8", threads=1)
        assert sum(a == b for a, b in zip(theirs, ours)) >= 0.9 * len(SOURCES)


def chromium():
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(transformers_js_missing() is not None, reason=str(transformers_js_missing()))
@pytest.mark.skipif(chromium() is None, reason="no chromium: apt-get update && apt-get install -y chromium")
def test_transformers_js_translates_like_our_greedy_search_in_a_browser(export, tmp_path):
    # onnxruntime-web's WebAssembly build in headless Chromium: the client's page, served from localhost, translates
    # and posts its translations back.
    model, folder = export
    site, posted = tmp_path / "site", {}
    site.mkdir()
    (site / "model").symlink_to(Path(folder).resolve())
    (site / "node_modules").symlink_to(CLIENT / "node_modules")
    shutil.copy(CLIENT / "browser.html", site / "index.html")
    (site / "sources.json").write_text(json.dumps(SOURCES[:8]))

    class Site(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(site), **kwargs)

        def do_POST(self):
            posted.update(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Site)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    # No background networking: a closed network refuses Chromium's own connections.
    page = subprocess.Popen([chromium(), "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic",
                             "--no-first-run", "--disable-background-networking", "--disable-component-update",
                             "--disable-sync", f"--user-data-dir={tmp_path / 'profile'}", "--remote-debugging-port=0",
                             f"http://127.0.0.1:{server.server_port}/index.html?max_new_tokens=12"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 240
        while not posted and page.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
    finally:
        page.kill()
        page.wait(timeout=30)
        server.shutdown()
        server.server_close()
    assert "error" not in posted and posted, posted.get("error", "the page posted nothing before Chromium exited or "
                                                                 "240 s passed")
    ours = translate(model, tiny_tokenizer(), SOURCES[:8], batch_size=8, max_new_tokens=12, num_beams=1)
    assert posted["translations"] == ours



def test_the_n_best_of_the_onnx_search_are_generates(export):
    """`alternatives` of the server: the beam's best hypotheses, best first, as generate() returns them."""
    from vanilla_transformer.tools.translation import GenerateTranslator

    model, folder = export
    ours = GenerateTranslator(model, tiny_tokenizer()).hypotheses(SOURCES, 3, batch_size=8, num_beams=4,
                                                                   max_new_tokens=12)
    exported = OnnxTranslator(folder, threads=1).hypotheses(SOURCES, 3, batch_size=8, num_beams=4, max_new_tokens=12)
    assert exported == ours
    assert all(len(hypotheses) == 3 for hypotheses in ours) and any(len(set(h)) > 1 for h in ours)
