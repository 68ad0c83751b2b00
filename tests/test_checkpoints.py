"""Checkpoint averaging (§6.1): the promises of vanilla_transformer.training.checkpoints and its command-line tool."""

import os
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForSeq2SeqLM

from conftest import random_batch, tiny_model, tiny_tokenizer
from vanilla_transformer.training.checkpoints import average_checkpoints, last_checkpoints

ROOT = Path(__file__).resolve().parents[1]
CLI_ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}



def read_weights(folder) -> dict[str, torch.Tensor]:
    weights = {}
    for path in sorted(Path(folder).glob("*.safetensors")):
        with safe_open(path, framework="pt") as f:
            weights.update({name: f.get_tensor(name) for name in f.keys()})
    return weights


@pytest.fixture
def three_checkpoints(tmp_path):
    """Three differently initialised tiny models, saved as a Trainer would (checkpoint-<step>)."""
    folders = []
    for seed, step in enumerate([500, 1000, 1500]):
        folder = tmp_path / "run" / f"checkpoint-{step}"
        tiny_model(seed=seed).save_pretrained(folder)
        folders.append(folder)
    tiny_tokenizer().save_pretrained(folders[-1])
    return folders


def test_averaged_weights_are_the_mean_of_the_inputs(three_checkpoints, tmp_path):
    output = average_checkpoints(three_checkpoints, tmp_path / "averaged")
    inputs = [read_weights(folder) for folder in three_checkpoints]
    averaged = read_weights(output)
    assert averaged.keys() == inputs[0].keys()
    for name, tensor in averaged.items():
        expected = torch.stack([weights[name] for weights in inputs]).mean(dim=0)
        assert tensor.dtype == inputs[0][name].dtype
        torch.testing.assert_close(tensor, expected, atol=1e-7, rtol=0, msg=name)


def test_averaging_one_checkpoint_is_the_identity(three_checkpoints, tmp_path):
    output = average_checkpoints(three_checkpoints[:1], tmp_path / "averaged")
    original, averaged = read_weights(three_checkpoints[0]), read_weights(output)
    assert averaged.keys() == original.keys()
    for name in original:
        assert torch.equal(averaged[name], original[name]), name


def test_the_averaged_folder_loads_and_translates(three_checkpoints, tmp_path):
    output = average_checkpoints(three_checkpoints, tmp_path / "averaged")
    assert {"config.json", "generation_config.json", "tokenizer.json", "modeling_vanilla_transformer.py"} <= {
        p.name for p in output.iterdir()}
    model = AutoModelForSeq2SeqLM.from_pretrained(output).eval()
    # Ties survive: the averaged shared embedding is the encoder's, the decoder's and the output projection's.
    assert model.lm_head.weight.data_ptr() == model.model.shared.weight.data_ptr()
    assert torch.equal(model.model.shared.weight, read_weights(output)["model.shared.weight"])
    input_ids, attention_mask, _ = random_batch()
    sequences = model.generate(input_ids=input_ids, attention_mask=attention_mask, num_beams=2, max_new_tokens=5)
    assert sequences.shape[0] == input_ids.shape[0]


def test_sharded_checkpoints_average_like_single_files(three_checkpoints, tmp_path):
    sharded = []
    for seed, folder in enumerate(three_checkpoints):
        target = tmp_path / "sharded" / folder.name
        tiny_model(seed=seed).save_pretrained(target, max_shard_size="20KB")
        assert (target / "model.safetensors.index.json").is_file()
        sharded.append(target)
    from_shards = average_checkpoints(sharded, tmp_path / "from_shards")
    from_single = average_checkpoints(three_checkpoints, tmp_path / "from_single")
    assert (from_shards / "model.safetensors.index.json").is_file()
    single, shards = read_weights(from_single), read_weights(from_shards)
    assert single.keys() == shards.keys()
    assert all(torch.equal(single[name], shards[name]) for name in single)
    reloaded = AutoModelForSeq2SeqLM.from_pretrained(from_shards).state_dict()
    assert all(torch.equal(reloaded[name], shards[name]) for name in shards)


def test_different_architectures_are_refused(three_checkpoints, tmp_path):
    wider = tmp_path / "wider"
    tiny_model(encoder_ffn_dim=128).save_pretrained(wider)
    with pytest.raises(ValueError, match=r"encoder\.layers\.0\.ffn\.fc1\.(weight|bias).*wider"):
        average_checkpoints([wider, three_checkpoints[0]], tmp_path / "out")
    pre_ln = tmp_path / "pre_ln"
    tiny_model(normalize_before=True).save_pretrained(pre_ln)
    with pytest.raises(ValueError, match="normalize_before"):
        average_checkpoints([pre_ln, three_checkpoints[0]], tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_an_existing_output_is_never_overwritten(three_checkpoints, tmp_path):
    output = tmp_path / "precious"
    output.mkdir()
    (output / "notes.txt").write_text("keep me")
    with pytest.raises(ValueError, match="not empty"):
        average_checkpoints(three_checkpoints, output)
    assert [p.name for p in output.iterdir()] == ["notes.txt"]
    empty = tmp_path / "empty"
    empty.mkdir()
    assert (average_checkpoints(three_checkpoints, empty) / "model.safetensors").is_file()


def test_pickles_and_empty_folders_are_refused(three_checkpoints, tmp_path):
    pickled = tmp_path / "pickled"
    pickled.mkdir()
    (pickled / "config.json").write_text((three_checkpoints[0] / "config.json").read_text())
    torch.save({"weight": torch.zeros(2)}, pickled / "pytorch_model.bin")
    with pytest.raises(ValueError, match=r"pickled.*only safetensors are supported"):
        average_checkpoints([three_checkpoints[0], pickled], tmp_path / "out")
    empty = tmp_path / "no_weights"
    empty.mkdir()
    with pytest.raises(ValueError, match="no_weights holds no model weights"):
        average_checkpoints([empty], tmp_path / "out")


def test_last_checkpoints_sorts_steps_as_numbers(tmp_path):
    for step in [9, 10, 100, 2, 11]:
        (tmp_path / f"checkpoint-{step}").mkdir()
    (tmp_path / "checkpoint-final").mkdir()  # not a step: ignored
    (tmp_path / "runs").mkdir()
    assert [p.name for p in last_checkpoints(tmp_path, 3)] == ["checkpoint-10", "checkpoint-11", "checkpoint-100"]
    assert [p.name for p in last_checkpoints(tmp_path, 5)][0] == "checkpoint-2"
    with pytest.raises(ValueError, match="only 5"):
        last_checkpoints(tmp_path, 6)


def test_command_line_tool_averages_the_last_checkpoints(three_checkpoints, tmp_path):
    command = [sys.executable, str(ROOT / "scripts" / "average_checkpoints.py"), "--run_dir",
               str(tmp_path / "run"), "--last", "2", "--output_dir", str(tmp_path / "cli")]
    result = subprocess.run(command, capture_output=True, text=True, env=CLI_ENV, timeout=120)
    assert result.returncode == 0, result.stderr
    expected = average_checkpoints(three_checkpoints[1:], tmp_path / "api")
    cli, api = read_weights(tmp_path / "cli"), read_weights(expected)
    assert all(torch.equal(cli[name], api[name]) for name in api)

    explicit = ["--checkpoints", *map(str, three_checkpoints), "--output_dir", str(tmp_path / "cli")]
    with pytest.raises(ValueError, match="not empty"):  # in-process: a second interpreter start costs seconds
        runpy.run_path(str(ROOT / "scripts" / "average_checkpoints.py"), run_name="cli").get("main")(explicit)


def test_a_logits_bias_is_averaged_like_every_other_tensor(tmp_path):
    folders = []
    for seed in range(2):
        model = tiny_model(seed=seed, lm_head_bias=True)
        with torch.no_grad():
            model.lm_head.bias.normal_(generator=torch.Generator().manual_seed(seed))
        model.save_pretrained(tmp_path / f"checkpoint-{seed + 1}")
        folders.append(tmp_path / f"checkpoint-{seed + 1}")
    averaged = read_weights(average_checkpoints(folders, tmp_path / "averaged"))
    expected = (read_weights(folders[0])["lm_head.bias"] + read_weights(folders[1])["lm_head.bias"]) / 2
    torch.testing.assert_close(averaged["lm_head.bias"], expected, atol=1e-7, rtol=0)
    assert AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "averaged").lm_head.bias is not None
