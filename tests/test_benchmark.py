"""The benchmark's promises: it compares like with like, and its reports are written. No timing is asserted."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from scripts.benchmarks import benchmark
from scripts.benchmarks.peers import run_benchmark, verdicts
from scripts.benchmarks.benchmark import write_results
from scripts.benchmarks.workloads import (
    BenchmarkSpec,
    build_models,
    decoders,
    max_positions,
    parameter_counts,
    source_batch,
    token_counts,
    training_batch,
    training_flops,
)


@pytest.fixture(scope="module")
def spec():
    return BenchmarkSpec.quick()


@pytest.fixture(scope="module")
def models(spec):
    torch.set_num_threads(spec.threads)
    return build_models(spec)


def test_marian_has_our_shape_and_parameter_count(spec, models):
    ours, marian = models["ours"], models["marian"]
    # quick mode: tiny preset, vocabulary 1000 -> 297,472 trainable parameters in both.
    assert parameter_counts(ours) == {"trainable": 297_472, "frozen": 0, "buffers": 0}
    counts = parameter_counts(marian)
    assert counts["trainable"] == 297_472
    # What Marian holds beyond ours is never trained: two frozen sinusoid tables and `final_logits_bias`.
    assert counts["frozen"] == 2 * max_positions(spec) * ours.config.d_model
    assert counts["buffers"] == marian.final_logits_bias.numel() == ours.config.vocab_size
    for field in ("d_model", "encoder_layers", "decoder_layers", "encoder_attention_heads", "decoder_attention_heads",
                  "encoder_ffn_dim", "decoder_ffn_dim", "vocab_size", "activation_function", "scale_embedding",
                  "pad_token_id", "eos_token_id", "decoder_start_token_id", "dropout"):
        assert getattr(marian.config, field) == getattr(ours.config, field), field
    assert marian.config._attn_implementation == ours.config._attn_implementation == "sdpa"
    assert marian.lm_head.weight is marian.model.shared.weight is marian.model.encoder.embed_tokens.weight


@pytest.mark.parametrize("num_beams", [1, 4])
def test_decoding_without_the_cache_reruns_the_prefix_and_gives_our_cached_tokens(spec, models, num_beams):
    ours = models["ours"]
    runs, widths, tokens = decoders(models, source_batch(spec, ours.config, batch=3), num_beams), [], {}
    hook = ours.get_decoder().register_forward_pre_hook(
        lambda module, args, kwargs: widths.append(kwargs["input_ids"].shape[1]), with_kwargs=True)
    try:
        tokens = {name: runs[name](new_tokens=6) for name in ("ours", "uncached")}
    finally:
        hook.remove()
    # The decoder's input width, step by step: one token a step with the cache, then the whole prefix without it.
    assert widths == [1] * 6 + list(range(1, 7))
    assert tokens["ours"].shape == (3, 7) and torch.equal(tokens["ours"], tokens["uncached"])
    assert not (tokens["ours"][:, 1:] == ours.config.eos_token_id).any()  # fixed length: eos is suppressed


def test_training_flops_agree_with_torchs_flop_counter(spec, models):
    # torch's counter sees every matmul but not CPU attention kernels; ours without attention must match it.
    # Both models compute the whole padded batch.
    batch = training_batch(spec, models["ours"].config)
    shape = (*batch["input_ids"].shape, batch["labels"].shape[1])
    assert token_counts(batch) == (int(batch["attention_mask"].sum()), int((batch["labels"] != -100).sum()))
    assert sum(token_counts(batch)) < batch["input_ids"].numel() + batch["labels"].numel()
    for name, model in models.items():
        model.train()
        with FlopCounterMode(display=False) as counter:
            model(**batch).loss.backward()
        config = models["ours"].config
        assert training_flops(config, *shape, False) == counter.get_total_flops(), name
        assert training_flops(config, *shape, True) > counter.get_total_flops()
    assert training_flops(config, *shape, True, *token_counts(batch)) < training_flops(config, *shape)


def test_quick_benchmark_compares_like_with_like_and_writes_reports(spec, tmp_path):
    results = run_benchmark(spec, log=lambda message: None)
    shapes = results["checks"]["output_shapes"]
    expected = [spec.generation_batch_size, spec.new_tokens + 1]
    assert shapes == {f"{system}/{workload}": expected for workload in ("greedy", "beam")
                      for system in ("ours", "marian", "uncached")}
    assert results["checks"]["uncached_greedy_equals_ours"] and results["checks"]["uncached_beam_equals_ours"]
    assert results["environment"]["torch_threads"] == spec.threads == 1
    for workload in ("train", "greedy", "beam"):
        assert set(results[workload]["systems"]) >= {"ours", "marian"}
        assert all(len(s["times_s"]) == spec.repeats for s in results[workload]["systems"].values())
    train = results["train"]
    assert set(train["systems"]) == {"ours", "marian"}
    for system in train["systems"].values():  # every derived figure follows from the measured medians
        assert system["mfu"] == pytest.approx(train["flops_per_step"] / system["median_s"]
                                              / results["matmul_peak"]["flops"])
        assert system["throughput"] == pytest.approx(train["target_tokens"] / system["median_s"])
    compiled = results["train_compiled"]  # eager and torch.compile'd steps, interleaved; compilation timed apart
    c = {name: system["median_s"] for name, system in compiled["systems"].items()}
    assert set(c) == {"ours_eager", "ours_compiled", "marian_eager", "marian_compiled"} and not compiled["errors"]
    assert compiled["backend"] == "aot_eager" and all(s["loss_finite"] for s in compiled["systems"].values())
    assert compiled["compiled_speed_vs_marian_compiled"] == pytest.approx(c["marian_compiled"] / c["ours_compiled"])
    assert compiled["compiled_speed_vs_eager"] == pytest.approx({n: c[f"{n}_eager"] / c[f"{n}_compiled"]
                                                                 for n in ("ours", "marian")})
    for workload in ("train", "greedy", "beam"):
        times = results[workload]["systems"]
        paired = results["paired_ratios"][f"{workload}_speed_vs_marian"]
        assert paired["median"] == times["marian"]["times_s"][0] / times["ours"]["times_s"][0]  # one repeat
        assert results["ratios"][f"{workload}_speed_vs_marian"] == pytest.approx(
            times["marian"]["median_s"] / times["ours"]["median_s"])
    assert results["ratios"]["beam_speed_vs_uncached"] == pytest.approx(
        results["beam"]["systems"]["uncached"]["median_s"] / results["beam"]["systems"]["ours"]["median_s"])
    assert results["verdicts"].keys() == results["ratios"].keys()
    memory = results["memory_mib"]
    assert set(memory) == {"ours", "marian", "uncached"}
    assert set(memory["uncached"]) == {"greedy", "beam"}

    paths = write_results(results, tmp_path)
    assert {p.name for p in tmp_path.iterdir()} == {"results_tiny.json", "results_tiny.md"}
    saved = json.loads(paths["json"].read_text())
    assert saved["ratios"].keys() == results["ratios"].keys()
    markdown = paths["md"].read_text()
    assert "| workload | ours | Marian | ours, no cache | ours/Marian | ours/no cache |" in markdown
    assert "| training step, compiled (torch.compile, aot_eager;" in markdown
    assert "| ratio | measured | ours is |" in markdown
    assert "training in float32" in markdown and results["matmul_peak"]["dtype"] == "float32"


def test_bench_bf16_runs_every_training_step_under_bf16_autocast(tmp_path, monkeypatch):
    from scripts.benchmarks import memory, workloads

    make_train_step, seen = workloads.make_train_step, []

    def spy(model, batch, **options):
        seen.append(options.get("autocast"))
        return make_train_step(model, batch, **options)

    monkeypatch.setattr(workloads, "make_train_step", spy)
    monkeypatch.setattr(memory, "make_train_step", spy)
    benchmark.main(["--quick", "--bf16", "--no_memory", "--output_dir", str(tmp_path)])
    results = json.loads((tmp_path / "results_tiny_bf16.json").read_text())  # beside the float32 run's, not over it
    assert results["spec"]["bf16"] and results["matmul_peak"]["dtype"] == "bfloat16"  # MFU against the bf16 peak
    assert "training in bf16 autocast" in (tmp_path / "results_tiny_bf16.md").read_text()
    expected = 6  # ours and Marian; then both eager and compiled
    if memory.memory_method_available():  # and the memory workload's step
        memory.memory_workloads(BenchmarkSpec.quick(bf16=True), "ours")
        expected += 1
    assert seen == [torch.bfloat16] * expected


@pytest.mark.parametrize("fields, message", [
    (dict(device="cuda:0"), "`memory` measures the resident memory of CPU processes; with device 'cuda:0'"),
    (dict(device="gpu", memory=False), "`device` 'gpu' is not a torch device"),
])
def test_a_benchmark_spec_refuses_a_device_it_cannot_measure_naming_it(fields, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        BenchmarkSpec(**fields)


def test_ours_is_called_faster_or_slower_only_where_every_estimate_agrees():
    def results(greedy_q1):
        paired = {"median": 1.0, "q1": 0.95, "q3": 1.05}
        return {
            "ratios": {"train_speed_vs_marian": 1.1, "train_memory_vs_marian": 0.995, "greedy_speed_vs_marian": 1.6,
                       "beam_speed_vs_marian": 0.8, "beam_speed_vs_uncached": 4.0,
                       "greedy_memory_vs_marian": 0.5},
            "paired_ratios": {"train_speed_vs_marian": paired,
                              "beam_speed_vs_marian": {"median": 0.8, "q1": 0.75, "q3": 0.9},
                              "greedy_speed_vs_marian": {"median": 1.6, "q1": greedy_q1, "q3": 1.7}},
            "memory_mib": {"ours": {"train": 100.0, "greedy": 10.0}, "marian": {"train": 100.5, "greedy": 20.0}},
        }

    said = {name: v["verdict"] for name, v in verdicts(results(greedy_q1=1.55)).items()}
    assert said["train_speed_vs_marian"] == "level"  # median 1.1, paired quartiles 0.95-1.05: the noise could do it
    assert said["greedy_speed_vs_marian"] == "faster"  # 1.6 and quartiles 1.55-1.7: all above 1
    assert said["beam_speed_vs_marian"] == "slower"  # 0.8 and quartiles 0.75-0.9: all below 1
    assert said["beam_speed_vs_uncached"] == "faster"  # no paired ratio: the median alone
    assert said["train_memory_vs_marian"] == "level" and said["greedy_memory_vs_marian"] == "smaller"  # 1 MiB tie
    assert verdicts(results(greedy_q1=0.98))["greedy_speed_vs_marian"]["verdict"] == "level"


# The quality-parity baseline (quality_parity.py) rests on two promises, checked here cheaply.
def test_the_marian_baseline_computes_our_network_and_trains_on_our_objective():
    from transformers import MarianMTModel

    from conftest import random_batch, tiny_model
    from scripts.benchmarks.quality_parity import label_smoothed_loss_func
    from vanilla_transformer.tools.marian import copy_weights_into_marian
    from vanilla_transformer.tools.marian import marian_config_like

    ours = tiny_model(label_smoothing=0.1)
    marian = MarianMTModel(marian_config_like(ours.config)).eval()
    copy_weights_into_marian(ours, marian)
    input_ids, attention_mask, labels = random_batch()
    labels[1, -2:] = -100
    batch = dict(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
    with torch.no_grad():
        expected, got = ours(**batch, num_items_in_batch=torch.tensor(11)), marian(**batch)
    torch.testing.assert_close(got.logits, expected.logits, atol=1e-5, rtol=1e-5)
    # Marian, trained through `compute_loss_func`, optimises the very loss our model computes.
    marian_loss = label_smoothed_loss_func(0.1)(got, labels, torch.tensor(11))
    torch.testing.assert_close(marian_loss, expected.loss, atol=1e-5, rtol=0)
    assert marian_loss.item() != marian(**batch).loss.item()  # Marian's own loss is not smoothed


def test_the_package_imports_no_peer_model_profiler_benchmark_or_private_name():
    import ast

    code = ("import sys, vanilla_transformer, vanilla_transformer.training, vanilla_transformer.tools.hub, "
            "vanilla_transformer.data, vanilla_transformer.tools.ctranslate2; "
            "print(','.join(sorted(sys.modules)))")
    loaded = set(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True,
                                cwd=Path(__file__).resolve().parents[1]).stdout.strip().split(","))
    assert "transformers.models.marian.modeling_marian" not in loaded
    assert not [name for name in loaded if name.split(".")[0] == "scripts"]  # measurement never ships
    # torch itself loads cProfile (torch._dynamo), so the package's own imports are read instead.
    package = Path(__file__).resolve().parents[1] / "vanilla_transformer"
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                module = node.module if isinstance(node, ast.ImportFrom) else None
                names = [alias.name for alias in node.names]
                for name in [module or "", *names]:
                    assert name.split(".")[0] not in {"cProfile", "pstats", "profile"}, path.name
                    assert "profiler" not in name and "benchmark" not in name and "parity" not in name, path.name
                if path.name != "marian.py":  # the Marian converter reads Marian, by design
                    assert not any(n.startswith("Marian") for n in names), path.name
                if isinstance(node, ast.ImportFrom) and node.level:
                    assert not any(n.startswith("_") for n in names), f"{path.name} imports {names} from .{module}"


def test_the_engine_benchmark_times_each_system_in_a_fresh_process_of_its_own(tmp_path, monkeypatch):
    # A live runtime's thread pool slows whatever runs next to it in the same process.
    from conftest import tiny_model, tiny_tokenizer
    from scripts.benchmarks import engines

    tiny_model().save_pretrained(tmp_path)
    tiny_tokenizer().save_pretrained(tmp_path)
    both = {"generate()": ("transformers", tmp_path, None), "generate(), again": ("transformers", tmp_path, None)}
    monkeypatch.setattr(engines, "systems", lambda model_dir, exports: both)
    speed = engines.speed(tmp_path, {}, ["w4 w5 w6", "w7 w8", "w9"], threads=1, repeats=1)
    assert speed["processes"] == 2  # one per system (and repetition), none of them this one
    assert list(speed["rows"]) == ["greedy", "beam 4"]
    for rows in speed["rows"].values():
        assert set(rows) == set(both) and rows["generate()"]["speed_vs_generate"] == 1.0
        assert all(row["sentences_per_s"] == pytest.approx(3 / row["ms"] * 1e3) for row in rows.values())


def test_peak_memory_growth_sees_an_allocation_and_nothing_else():
    from scripts.benchmarks.memory import memory_method_available, peak_growth_mib

    if not memory_method_available():
        pytest.skip("peak-memory measurement needs Linux's /proc/self/clear_refs")
    sixty_four_mib = lambda: torch.ones(16 * 2**20).add_(1)  # noqa: E731  (float32: 64 MiB, touched)
    assert 60 <= peak_growth_mib(sixty_four_mib) <= 80
    assert peak_growth_mib(lambda: None) < 8


@pytest.mark.parametrize("overrides, message", [
    (dict(precision="bfloat16"), r"--precision must be one of \('auto', 'bf16', 'fp32'\), got 'bfloat16'"),
    (dict(average_last_checkpoints=-1), r"--average_last_checkpoints must be 0 \(no averaging\) or more, got -1"),
    (dict(max_steps=300, save_steps=100, average_last_checkpoints=5),
     r"--average_last_checkpoints 5 needs that many checkpoints, but --max_steps 300 with --save_steps 100 writes 3"),
    (dict(config_overrides="dropout=0.3,label_smoothing=0.2"),
     r"--config_overrides sets label_smoothing=0.2, but --label_smoothing sets it"),
])
def test_the_parity_run_refuses_settings_it_could_not_honour_before_preparing_anything(tmp_path, overrides, message):
    from scripts.benchmarks.quality_parity import ParitySettings, run_parity

    settings = ParitySettings(work_dir=str(tmp_path / "work"), **overrides)
    with pytest.raises(ValueError, match=message):
        run_parity(settings)
    assert not (tmp_path / "work").exists()


def test_every_report_table_keeps_its_columns_when_a_cell_holds_a_bar():
    from scripts.utils.reports import markdown_table

    lines = markdown_table(["system", "identical"], [["ctranslate2, beam with |Y|^alpha", "98.5%"]])
    assert lines == ["| system | identical |", "|---|---|", "| ctranslate2, beam with \\|Y\\|^alpha | 98.5% |"]
    assert all(len(re.split(r"(?<!\\)\|", line)) == 4 for line in lines)  # two cells between three bars
    with pytest.raises(ValueError, match=r"a table row has 1 cells for 2 columns: \['alone'\]"):
        markdown_table(["system", "identical"], [["alone"]])


def test_a_report_prints_a_load_average_or_a_dash_where_the_platform_has_none():
    from scripts.utils.reports import format_load

    assert format_load([1.234, 0.5, 0.0]) == "1.2/0.5/0.0"
    assert format_load(None) == "–"
