import os

# Tests never reach the Hub: every model, tokenizer, metric and dataset is built locally.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import atexit  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402

# datasets' cache (read once at import) in a folder of the session's own, which its subprocesses share.
if "HF_DATASETS_CACHE" not in os.environ:
    os.environ["HF_DATASETS_CACHE"] = tempfile.mkdtemp(prefix="vt-datasets-cache-")
    atexit.register(shutil.rmtree, os.environ["HF_DATASETS_CACHE"], ignore_errors=True)

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

# The test models are tiny: one thread is faster than two fighting over small kernels, and deterministic.
torch.set_num_threads(1)

from vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration  # noqa: E402

VOCAB = 48
# transformers' own test harness, fetched by tests/upstream/fetch.py: imported by test_transformers_common.py, not run.
collect_ignore = ["upstream"]


def tiny_config(**overrides) -> VanillaTransformerConfig:
    """A 2+2-layer model with a 48-token vocabulary; dropout off so outputs are deterministic."""
    values = dict(vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                  decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, dropout=0.0,
                  label_smoothing=0.0)
    return VanillaTransformerConfig(**{**values, **overrides})


def tiny_model(seed=0, **overrides) -> VanillaTransformerForConditionalGeneration:
    torch.manual_seed(seed)
    return VanillaTransformerForConditionalGeneration(tiny_config(**overrides)).eval()


def confident_model(normalize_before=False, seed=0, weight_scale=0.2, embedding_scale=0.3, quiet_eos=True):
    """`tiny_model` with weights drawn larger than the initialisation and LayerNorms perturbed, so that every
    source gets its own confident translation and a misplaced tensor or a search that ranks or stops differently
    cannot go unnoticed. `quiet_eos` shrinks the end-of-sequence embedding (a logit near 0), so outputs run long."""
    model = tiny_model(seed=seed, normalize_before=normalize_before)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            noise = torch.randn(parameter.shape, generator=generator)
            if name.endswith("layer_norm.weight"):
                parameter.copy_(1 + 0.5 * noise)
            elif name == "model.shared.weight":
                parameter.copy_(embedding_scale * noise)
                if quiet_eos:
                    parameter[model.config.eos_token_id] *= 0.01
            else:
                parameter.copy_((weight_scale if name.endswith("weight") else 0.1) * noise)
    return model.eval()


def random_batch(batch=3, source_length=7, target_length=6, seed=1, pad_rows=True):
    """Random ids above the special tokens, with right-padding of different lengths in the source."""
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(4, VOCAB, (batch, source_length), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    if pad_rows:
        for row in range(1, batch):
            keep = max(1, source_length - 2 * row)
            attention_mask[row, keep:] = 0
            input_ids[row, keep:] = 0
    labels = torch.randint(4, VOCAB, (batch, target_length), generator=generator)
    return input_ids, attention_mask, labels


@pytest.fixture(params=[False, True], ids=["post_ln", "pre_ln"])
def normalize_before(request):
    return request.param


def tiny_tokenizer():
    """A word-level tokenizer over the tiny vocabulary: `w4 w5 ...` map to ids 4, 5, ..., eos appended."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3, **{f"w{i}": i for i in range(4, VOCAB)}}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 2)])
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>")


# The first lines of a script run by `run_without_the_package`: a fresh interpreter (`python -I`: no PYTHONPATH,
# no script folder on sys.path) where the package cannot be imported, as on a machine that only has
# transformers. The editable install's finder sits on sys.meta_path, so a blocking finder goes first.
WITHOUT_THE_PACKAGE = r'''
import importlib.abc, json, os, sys

class BlockPackage(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "vanilla_transformer":
            raise ImportError(f"{name} is blocked: this process must work without the package")

sys.meta_path.insert(0, BlockPackage())
sys.path[:] = [p for p in sys.path if not os.path.isdir(os.path.join(p or os.getcwd(), "vanilla_transformer"))]
try:
    import vanilla_transformer
except ImportError:
    pass
else:
    raise SystemExit("vanilla_transformer is importable in the remote-code process")

import builtins
prompts = []  # transformers asks "Do you wish to run the custom code?" when trust_remote_code is left None
builtins.input = lambda prompt="": prompts.append(prompt) or "n"

'''


def run_without_the_package(body: str, args: dict, workdir, **env) -> dict:
    """Run `body` (which reads `json.loads(sys.argv[1])` and prints "RESULT " + json) where only transformers is
    installed; return what it printed."""
    import json
    import subprocess

    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    script = workdir / "without_the_package.py"
    script.write_text(WITHOUT_THE_PACKAGE + body)
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING", "TRANSFORMERS_", "PYTHON"))}
    environment.update(HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", **env)
    run = subprocess.run([sys.executable, "-I", str(script), json.dumps(args)], cwd=workdir, env=environment,
                         capture_output=True, stdin=subprocess.DEVNULL, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.split("RESULT ", 1)[1])


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under `folder` and its bytes: what a refusal must leave exactly as it was."""
    return {path.relative_to(folder).as_posix(): path.read_bytes() for path in folder.rglob("*") if path.is_file()}


def assert_exporter_cli_refuses(script: Path, tmp_path: Path, model, tokenizer, case: str, flags: list[str],
                                message: str, earlier_export: str):
    """Run an exporter script on a saved `model` with `flags` (their {output} and {missing} filled in): it must
    exit 2 with `message` (filled in likewise) and leave everything under `tmp_path` as it was. In the case
    "existing output" the output folder already holds `earlier_export`."""
    import subprocess

    model_dir, output = tmp_path / "model", tmp_path / "export"
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    if case == "existing output":
        output.mkdir()
        (output / earlier_export).write_bytes(b"an earlier export")
    before = snapshot(tmp_path)
    values = {"output": output, "missing": tmp_path / "missing"}
    command = [sys.executable, str(script), "--model", str(model_dir), "--output_dir", str(output),
               *[flag.format(**values) for flag in flags]]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300,
                            env={"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})
    assert result.returncode == 2 and message.format(**values) in result.stderr, result.stderr
    assert snapshot(tmp_path) == before


def hide_package(monkeypatch, package: str):
    """Make `import package` (and its submodules) fail for the rest of the test, as where it is not installed."""
    import builtins

    real_import = builtins.__import__

    def without(name, *args, **kwargs):
        if name.split(".")[0] == package:
            raise ImportError(f"No module named '{package}'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", without)


def hub_dataset_folder(root: Path, splits: dict[str, list[tuple[str, str]]], config_name: str = "de-en") -> Path:
    """A local folder laid out as the Hub serves a translation dataset repository (wmt/wmt14's layout): parquet files
    under `<config_name>/`, the config named in README.md's YAML; `splits` maps a split to its (en, de) pairs."""
    from datasets import Dataset

    (root / config_name).mkdir(parents=True, exist_ok=True)
    files = []
    for split, pairs in splits.items():
        rows = [{"de": de, "en": en} for en, de in pairs]
        Dataset.from_dict({"translation": rows}).to_parquet(root / config_name / f"{split}-00000-of-00001.parquet")
        files.append(f"  - split: {split}\n    path: {config_name}/{split}-*")
    (root / "README.md").write_text("---\nconfigs:\n- config_name: " + config_name + "\n  data_files:\n"
                                    + "\n".join(files) + "\n---\n", encoding="utf-8")
    return root
