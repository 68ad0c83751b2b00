"""A saved folder loads and translates the same without this package, and push_to_hub never touches it."""

import hashlib
import importlib
import importlib.util
import json
import os
import shutil
from pathlib import Path

import huggingface_hub
import pytest
import torch
from huggingface_hub.errors import HfHubHTTPError
from transformers import AutoModelForSeq2SeqLM
from test_pipeline import SOURCES, toy_translator

from conftest import run_without_the_package
from vanilla_transformer.tools.hub import (
    add_translation_pipeline,
    check_hub_folder,
    missing_hub_files,
    resolve_token,
    save_for_hub,
    stage_for_hub,
)
from vanilla_transformer.training.metrics import bleu_signature
from vanilla_transformer.pipeline_vanilla_transformer import translation_pipeline

REPO_ROOT = Path(__file__).resolve().parents[1]
HUB_ID = "toy-org/vanilla-toy"
SNAPSHOT = "0123456789abcdef0123456789abcdef01234567"
SETTINGS = dict(num_beams=3, length_penalty=0.6, max_new_tokens=8)
SAVED_FILES = ["README.md", "config.json", "configuration_vanilla_transformer.py", "generation_config.json",
               "model.safetensors", "modeling_vanilla_transformer.py", "pipeline_vanilla_transformer.py",
               "support_vanilla_transformer.py", "tokenizer.json", "tokenizer_config.json"]

REMOTE_CHECK = r'''
import torch
torch.set_num_threads(1)
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, pipeline

args = json.loads(sys.argv[1])
results = {}
for source in (args["folder"], args["hub_id"]):
    model = AutoModelForSeq2SeqLM.from_pretrained(source, trust_remote_code=True)
    # Without trust_remote_code, AutoTokenizer's AutoConfig lookup would prompt (and fall back on "n").
    tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=True)
    with torch.no_grad():
        ids = model.generate(**tokenizer(args["sources"], return_tensors="pt", padding=True), **args["settings"])
    translator = pipeline("translation", model=source, trust_remote_code=True)
    texts = translator(args["sources"], batch_size=2, **args["settings"])
    results[source] = {"ids": ids.tolist(), "texts": [t["translation_text"] for t in texts],
                       "model_module": type(model).__module__, "pipeline_module": type(translator).__module__}
results["prompts"] = prompts
results["package_modules"] = sorted(m for m in sys.modules if m.split(".")[0] == "vanilla_transformer")
print("RESULT " + json.dumps(results))
'''



@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A model, its tokenizer, and the folder save_for_hub wrote for them."""
    model, tokenizer = toy_translator(seed=3)
    folder = tmp_path_factory.mktemp("hub") / "vanilla-toy"
    save_for_hub(model, tokenizer, folder)
    return model, tokenizer, folder


def fingerprint(folder):
    """Every file and folder under `folder` with its content hash: equal fingerprints, untouched folder."""
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(Path(folder).rglob("*"))}


def test_save_for_hub_writes_a_complete_folder(saved):
    model, _, folder = saved
    assert check_hub_folder(folder) == SAVED_FILES
    config = json.loads((folder / "config.json").read_text())
    assert config["auto_map"]["AutoModelForSeq2SeqLM"] == (
        "modeling_vanilla_transformer.VanillaTransformerForConditionalGeneration")
    assert config["custom_pipelines"] == {"translation": {
        "impl": "pipeline_vanilla_transformer.VanillaTranslationPipeline", "pt": ["AutoModelForSeq2SeqLM"]}}
    # Pipeline.save_pretrained sets custom_pipelines on the model's config; save_for_hub takes it back off.
    assert "custom_pipelines" not in model.config.to_dict()


def test_check_hub_folder_names_every_missing_file(saved, tmp_path):
    folder = shutil.copytree(saved[2], tmp_path / "broken")
    for name in ["tokenizer.json", "configuration_vanilla_transformer.py", "generation_config.json"]:
        (folder / name).unlink()
    with pytest.raises(ValueError, match="not a complete model folder") as error:
        check_hub_folder(folder)
    # configuration_*.py is found through the modeling file's relative import.
    for name in ["tokenizer.json", "configuration_vanilla_transformer.py", "generation_config.json"]:
        assert name in str(error.value)
    (folder / "model.safetensors").unlink()
    assert any(m.startswith("model.safetensors") for m in missing_hub_files(folder))


def test_a_fresh_process_without_the_package_translates_the_same_from_a_folder_and_a_hub_id(saved, tmp_path):
    model, tokenizer, folder = saved
    with torch.no_grad():
        expected_ids = model.generate(**tokenizer(SOURCES, return_tensors="pt", padding=True), **SETTINGS).tolist()
    translations = translation_pipeline(model, tokenizer)(SOURCES, batch_size=2, **SETTINGS)
    expected_texts = [t["translation_text"] for t in translations]

    hf_home = tmp_path / "hf_home"
    snapshot = hf_home / "hub" / f"models--{HUB_ID.replace('/', '--')}" / "snapshots" / SNAPSHOT
    shutil.copytree(folder, snapshot)
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text(SNAPSHOT)
    args = {"folder": str(folder), "hub_id": HUB_ID, "sources": SOURCES, "settings": SETTINGS}
    results = run_without_the_package(REMOTE_CHECK, args, tmp_path / "cwd", HF_HOME=str(hf_home))

    assert results["package_modules"] == [] and results["prompts"] == []
    for source in (str(folder), HUB_ID):
        assert results[source]["model_module"].startswith("transformers_modules.")
        assert results[source]["pipeline_module"].startswith("transformers_modules.")
        assert results[source]["ids"] == expected_ids, source
        assert results[source]["texts"] == expected_texts, source
    assert (hf_home / "modules" / "transformers_modules").is_dir()  # the remote code went to the isolated HF_HOME


# --- scripts/push_to_hub.py ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def push_to_hub():
    spec = importlib.util.spec_from_file_location("push_to_hub", REPO_ROOT / "scripts" / "push_to_hub.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def model_dir(saved, tmp_path):
    """The saved folder as a training run leaves it: plus Trainer state, a sub-folder and a hidden file."""
    folder = shutil.copytree(saved[2], tmp_path / "run")
    (folder / "training_args.bin").write_bytes(b"args")
    (folder / "checkpoint-10").mkdir()
    (folder / "checkpoint-10" / "optimizer.pt").write_bytes(b"state")
    (folder / ".cache").write_text("x")
    return folder


@pytest.fixture
def results_file(tmp_path):
    path = tmp_path / "eval_results.json"
    path.write_text(json.dumps({"bleu": 31.42, "chrf": 58.7, "bleu_signature": bleu_signature(),
                                "dataset_split": "test", "languages": ["en", "de"], "license": "apache-2.0",
                                "dataset_name": "Toy pairs"}))
    return path


@pytest.fixture
def no_token(monkeypatch, tmp_path):
    for name in ["HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_OIDC_RESOURCE"]:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_TOKEN_PATH", str(tmp_path / "no-token-here"))


def test_dry_run_stages_and_lists_exactly_the_model_files(push_to_hub, model_dir, results_file, capsys):
    before = fingerprint(model_dir)
    dry_run_dir = model_dir.parent / "run-hub-dry-run"
    assert push_to_hub.main(["--model_dir", str(model_dir), "--repo_id", HUB_ID, "--dry_run",
                             "--card_results", str(results_file)]) == 0
    assert fingerprint(model_dir) == before
    assert sorted(os.listdir(dry_run_dir)) == SAVED_FILES  # no Trainer state, sub-folder or hidden file
    listing = capsys.readouterr().out.splitlines()[1:-1]
    assert [line.split()[1] for line in listing] == SAVED_FILES
    assert [int(line.split()[0].replace(",", "")) for line in listing] == [
        (dry_run_dir / name).stat().st_size for name in SAVED_FILES]
    card = (dry_run_dir / "README.md").read_text()
    assert "31.42" in card and bleu_signature() in card and HUB_ID in card


def test_dry_run_refuses_a_folder_that_is_in_the_way(push_to_hub, model_dir, capsys):
    (model_dir.parent / "run-hub-dry-run").mkdir()
    (model_dir.parent / "run-hub-dry-run" / "old.txt").write_text("x")
    with pytest.raises(SystemExit) as exit_:
        push_to_hub.main(["--model_dir", str(model_dir), "--repo_id", HUB_ID, "--dry_run"])
    assert exit_.value.code == 2 and "exists and is not empty" in capsys.readouterr().err


def test_push_without_a_token_says_how_to_log_in(push_to_hub, model_dir, no_token, capsys):
    with pytest.raises(ValueError, match="hf auth login"):
        resolve_token()
    before = fingerprint(model_dir)
    with pytest.raises(SystemExit) as exit_:
        push_to_hub.main(["--model_dir", str(model_dir), "--repo_id", HUB_ID])
    assert exit_.value.code == 2
    assert "No Hugging Face token found" in capsys.readouterr().err
    assert fingerprint(model_dir) == before


def test_push_of_an_incomplete_folder_names_the_missing_files(push_to_hub, model_dir, capsys):
    (model_dir / "tokenizer.json").unlink()
    (model_dir / "modeling_vanilla_transformer.py").unlink()
    before = fingerprint(model_dir)
    with pytest.raises(SystemExit) as exit_:
        push_to_hub.main(["--model_dir", str(model_dir), "--repo_id", HUB_ID, "--token", "hf_fake", "--dry_run"])
    assert exit_.value.code == 2
    error = capsys.readouterr().err
    assert "not a complete model folder" in error
    assert "tokenizer.json" in error and "modeling_vanilla_transformer.py" in error
    assert fingerprint(model_dir) == before
    assert not (model_dir.parent / "run-hub-dry-run").exists()


def _http_error():
    # HfHubHTTPError needs a response of huggingface_hub's HTTP client (httpx2 in 2.x).
    http = importlib.import_module(huggingface_hub.errors.Response.__module__.split(".")[0])
    response = http.Response(403, request=http.Request("POST", "https://huggingface.co/api/repos/create"))
    return HfHubHTTPError("403 Forbidden: no write access to toy-org", response=response)


@pytest.mark.parametrize("failure", ["offline", "http", "transport"])
def test_a_failed_upload_exits_1_and_leaves_the_folder_untouched(push_to_hub, model_dir, monkeypatch, capsys,
                                                                 failure):
    if failure != "offline":  # offline: conftest's HF_HUB_OFFLINE=1 makes create_repo raise OfflineModeIsEnabled
        error = _http_error() if failure == "http" else HfHubHTTPError.__bases__[0]("connection reset")

        def fail(*args, **kwargs):
            raise error

        monkeypatch.setattr(huggingface_hub.HfApi, "create_repo", fail)
    before = fingerprint(model_dir)
    assert push_to_hub.main(["--model_dir", str(model_dir), "--repo_id", HUB_ID, "--token", "hf_fake"]) == 1
    assert f"upload to {HUB_ID} failed" in capsys.readouterr().err
    assert fingerprint(model_dir) == before


def test_push_uploads_the_staged_folder(push_to_hub, model_dir, results_file, monkeypatch):
    calls = {}

    def create_repo(self, repo_id, **kwargs):
        calls["create"] = (repo_id, kwargs)

    def upload_folder(self, *, folder_path, repo_id, **kwargs):
        calls["upload"] = (repo_id, sorted(os.listdir(folder_path)), folder_path, self.token)
        return type("Commit", (), {"commit_url": f"https://huggingface.co/{repo_id}/commit/abc"})()

    monkeypatch.setattr(huggingface_hub.HfApi, "create_repo", create_repo)
    monkeypatch.setattr(huggingface_hub.HfApi, "upload_folder", upload_folder)
    before = fingerprint(model_dir)
    assert push_to_hub.main(["--model_dir", str(model_dir), "--repo_id", HUB_ID, "--private", "--token", "hf_x",
                             "--card_results", str(results_file)]) == 0
    assert calls["create"] == (HUB_ID, {"repo_type": "model", "private": True, "exist_ok": True})
    repo_id, files, staging, token = calls["upload"]
    assert (repo_id, files, token) == (HUB_ID, SAVED_FILES, "hf_x")
    assert not Path(staging).exists()  # the staging copy is temporary
    assert fingerprint(model_dir) == before


def test_staging_adds_the_pipeline_to_a_plain_save_pretrained_folder(tmp_path):
    model, tokenizer = toy_translator()
    plain = tmp_path / "plain"
    model.save_pretrained(plain)
    tokenizer.save_pretrained(plain)
    assert "custom_pipelines[" in " ".join(missing_hub_files(plain))
    files = stage_for_hub(plain, tmp_path / "staged", card={"languages": ["en", "de"], "license": "mit",
                                                             "datasets": None, "eval_results": None,
                                                             "dataset_name": None})
    assert files == SAVED_FILES
    assert not (plain / "pipeline_vanilla_transformer.py").exists()


def test_a_model_loaded_from_one_of_our_folders_and_saved_plainly_gets_its_pipeline_file_back(tmp_path):
    model, tokenizer = toy_translator()
    save_for_hub(model, tokenizer, tmp_path / "ours")
    reloaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "ours")  # its config names the pipeline
    reloaded.save_pretrained(tmp_path / "plain")  # as Trainer saves a fine-tuned model: no pipeline file
    tokenizer.save_pretrained(tmp_path / "plain")
    assert missing_hub_files(tmp_path / "plain") == ["pipeline_vanilla_transformer.py"]
    add_translation_pipeline(tmp_path / "plain")
    assert missing_hub_files(tmp_path / "plain") == []
