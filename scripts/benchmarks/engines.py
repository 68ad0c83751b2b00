"""Every engine a trained model runs on, through one translation loop (`vanilla_transformer.tools.engines`):
`generate()`, onnxruntime and CTranslate2 (float32 and int8 each), and transformers.js in Node.

    python -m scripts.benchmarks.engines --demo_model demo_output/model --model runs/multi30k

Per model (the demo model on the built-in test split, the Multi30k model on its validation set): the exports' outputs
against `generate()`'s (CTranslate2, which has no GNMT penalty, against `generate()` ranking by |Y|^alpha), BLEU and
file sizes. Speed (the Multi30k model, else the demo's): each system in a fresh process per repetition, since a live
runtime's threads slow whatever runs beside it.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from functools import partial
from multiprocessing import get_context
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from vanilla_transformer.data.builtin_task import build_builtin_task  # noqa: E402
from vanilla_transformer.tools.ctranslate2 import export_ctranslate2  # noqa: E402
from vanilla_transformer.tools.engines import load_translator  # noqa: E402
from vanilla_transformer.tools.onnx import export_onnx  # noqa: E402
from vanilla_transformer.tools.translation import GenerateTranslator  # noqa: E402
from vanilla_transformer.training.metrics import corpus_scores  # noqa: E402

from scripts.utils.reports import engines_report, write_cpu_report  # noqa: E402

from .toolkit import (ENGINE_CODE, command_line, environment, load_multi30k, multi30k_missing,  # noqa: E402
                      time_interleaved)

ROOT = Path(__file__).resolve().parents[2]
CLIENT = ROOT / "scripts" / "transformers_js"
JS_SENTENCES, BATCH_SIZE = 200, 64
DECODINGS = {"greedy": 1, "beam 4": 4}


def identity(a: list[str], b: list[str]) -> float:
    return sum(x == y for x, y in zip(a, b)) / len(a)


def systems(model_dir, exports) -> dict[str, tuple]:
    """Every system, by the name the report gives it: `load_translator`'s engine, folder and quantized graphs."""
    return {"generate()": ("transformers", model_dir, None),
            "onnxruntime float32": ("onnxruntime", exports["onnx"], None),
            "onnxruntime int8": ("onnxruntime", exports["onnx"], "int8"),
            "ctranslate2 float32": ("ctranslate2", exports["ct2 float32"], None),
            "ctranslate2 int8": ("ctranslate2", exports["ct2 int8"], None)}


def quality(name, model_dir, exports, sources, references, threads) -> dict:
    """Identity rates and BLEU of one model and its exports on one evaluation set."""
    translators = {system: load_translator(engine, folder, quantized=quantized, threads=threads)
                   for system, (engine, folder, quantized) in systems(model_dir, exports).items()}
    ours = translators["generate()"]
    out = {"greedy": {system: t.translate(sources, BATCH_SIZE, num_beams=1) for system, t in translators.items()},
           "as saved": {system: t.translate(sources, BATCH_SIZE) for system, t in translators.items()}}
    # CTranslate2 ranks beams by log P / |Y|^alpha: compared with generate() ranking so, not with the GNMT penalty.
    out["beam with |Y|^alpha"] = {"generate()": GenerateTranslator(ours.model, ours.tokenizer, length_penalty_type="hf")
                                  .translate(sources, BATCH_SIZE)}
    files = {path.name: path.stat().st_size for path in sorted((exports["onnx"] / "onnx").iterdir())}
    files.update({f"{system}/model.bin": (path / "model.bin").stat().st_size for system, path in exports.items()
                  if system.startswith("ct2")})
    files["model.safetensors"] = Path(model_dir, "model.safetensors").stat().st_size
    greedy, saved, hf = out["greedy"], out["as saved"], out["beam with |Y|^alpha"]["generate()"]
    return {"name": name, "sentences": len(sources), "files": files,
            "num_beams_as_saved": ours.model.generation_config.num_beams,
            "identity": {
                "onnxruntime float32, greedy": identity(greedy["generate()"], greedy["onnxruntime float32"]),
                "onnxruntime float32, as saved": identity(saved["generate()"], saved["onnxruntime float32"]),
                "ctranslate2 float32, greedy": identity(greedy["generate()"], greedy["ctranslate2 float32"]),
                "ctranslate2 float32, beam with |Y|^alpha": identity(hf, saved["ctranslate2 float32"]),
                "generate(), beam with |Y|^alpha against as saved": identity(hf, saved["generate()"])},
            "bleu": {f"{system}, {search}": corpus_scores(h, references)["bleu"]
                     for search, hyps in out.items() for system, h in hyps.items()},
            "differences": [{"source": s, "ours": a, "onnx": b} for s, a, b in
                            zip(sources, saved["generate()"], saved["onnxruntime float32"]) if a != b][:10],
            "greedy_generate": greedy["generate()"]}


def time_system(engine, folder, quantized, sources, threads) -> tuple[int, dict[str, list[float]]]:
    """This process's id, and the seconds of one call of each decoding of `sources` by one system after a warm-up
    call; run in a fresh process, where no other runtime's threads compete."""
    torch.set_num_threads(threads)
    translator = load_translator(engine, folder, quantized=quantized, threads=threads)
    tasks = {label: partial(translator.translate, sources, BATCH_SIZE, num_beams=beams)
             for label, beams in DECODINGS.items()}
    with torch.inference_mode():
        return os.getpid(), time_interleaved(tasks, 1, warmup=1)


def speed(model_dir, exports, sources, threads, repeats) -> dict:
    """Every system in a fresh process per repetition (`time_system`), the order alternating as in
    `time_interleaved`: medians, speed against `generate()`'s, and how many processes (none this one) ran them."""
    named = systems(model_dir, exports)
    times, processes = {name: {label: [] for label in DECODINGS} for name in named}, set()
    for rep in range(repeats):
        for name in list(named) if rep % 2 == 0 else list(named)[::-1]:
            with ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn")) as process:
                pid, measured = process.submit(time_system, *named[name], sources, threads).result()
            processes.add(pid)
            for label, seconds in measured.items():
                times[name][label] += seconds
    rows = {}
    for label in DECODINGS:
        median = {name: statistics.median(t[label]) for name, t in times.items()}
        rows[label] = {name: {"ms": s * 1e3, "sentences_per_s": len(sources) / s,
                              "speed_vs_generate": median["generate()"] / s} for name, s in median.items()}
    return {"processes": len(processes - {os.getpid()}), "rows": rows}


def transformers_js(export_dir, sources, ours, dtype):
    """transformers.js's greedy translations (Node) against `ours`, our greedy generate()'s of the same sources."""
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as file:
        file.write("\n".join(sources) + "\n")
    start = time.perf_counter()
    run = subprocess.run(["node", str(CLIENT / "translate.mjs"), str(export_dir), file.name, "--dtype", dtype],
                         capture_output=True, text=True, check=True)
    seconds = time.perf_counter() - start
    theirs = [json.loads(line) for line in run.stdout.splitlines()]
    return {"dtype": dtype, "sentences": len(sources), "identity_vs_our_greedy": identity(theirs, ours),
            "seconds_with_node_start": seconds,
            "differences": [{"ours": a, "transformers.js": b} for a, b in zip(ours, theirs) if a != b][:10]}


def evaluation_sets(args) -> dict[str, tuple]:
    """The models found, each with its evaluation set's sources and references."""
    sets = {}
    if Path(args.demo_model, "config.json").is_file():
        test = build_builtin_task()["test"]["translation"]
        sets["demo"] = (args.demo_model, [p["en"] for p in test], [p["de"] for p in test])
    else:
        print(f"demo model skipped: no model in {args.demo_model} (make demo)")
    if (reason := multi30k_missing(args.data_dir, args.model)) is None:
        validation = load_multi30k(args.data_dir)["validation"]["translation"]
        sets["multi30k"] = (args.model, [p["en"] for p in validation], [p["de"] for p in validation])
    else:
        print(f"Multi30k model skipped: {reason}")
    return sets


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--demo_model", default="demo_output/model")
    parser.add_argument("--model", default="runs/multi30k")
    parser.add_argument("--data_dir", default="../shared/data/multi30k")
    parser.add_argument("--output", default=None,
                        help="Report path without extension (default: scripts/benchmarks/results/engines_<cpu>, "
                             "since the engines' speed-ups differ by processor).")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--speed_sentences", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.speed_sentences < 1 or args.threads < 1:
        parser.error(f"--repeats, --speed_sentences and --threads must be at least 1, got {args.repeats}, "
                     f"{args.speed_sentences} and {args.threads}")
    sets = evaluation_sets(args)
    if not sets:
        print("skipped: no model to export")
        return None
    work, exports = Path(tempfile.mkdtemp(prefix="vt_engines_")), {}
    results = {"environment": environment(measures=ENGINE_CODE), "models": {}}
    for name, (model_dir, sources, references) in sets.items():
        started, folder = time.perf_counter(), work / name
        exports[name] = {"onnx": export_onnx(model_dir, folder / "onnx", quantize="int8"),
                         "ct2 float32": export_ctranslate2(model_dir, folder / "ct2_fp32"),
                         "ct2 int8": export_ctranslate2(model_dir, folder / "ct2_int8", quantization="int8")}
        results["models"][name] = {"export_seconds": time.perf_counter() - started,
                                   **quality(name, model_dir, exports[name], sources, references, args.threads)}
    if "demo" in sets and (CLIENT / "node_modules").is_dir() and shutil.which("node"):
        ours = results["models"]["demo"]["greedy_generate"][:JS_SENTENCES]
        results["transformers.js"] = [transformers_js(exports["demo"]["onnx"], sets["demo"][1][:JS_SENTENCES], ours,
                                                      dtype) for dtype in ("fp32", "q8")]
    name = "multi30k" if "multi30k" in sets else "demo"
    model_dir, sources = sets[name][:2]
    results["speed"] = {"model": name, "sentences": min(args.speed_sentences, len(sources)), "threads": args.threads,
                        "batch_size": BATCH_SIZE, **speed(model_dir, exports[name], sources[:args.speed_sentences],
                                                          args.threads, args.repeats)}
    for model in results["models"].values():
        model.pop("greedy_generate")
    command = command_line("engines", argv)
    write_cpu_report("engines", args.output, {"command": command, **results}, engines_report(results, command))
    shutil.rmtree(work, ignore_errors=True)
    return results


if __name__ == "__main__":
    main()
