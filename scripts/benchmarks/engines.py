"""Every engine a trained model runs on, side by side in one run: `generate()`, its ONNX export on onnxruntime
(float32 and int8) and its CTranslate2 export (float32 and int8), all through the one translation loop
(`vanilla_transformer.tools.translation`); transformers.js in Node, and once in a real browser.

    python -m scripts.benchmarks.engines --demo_model demo_output/model --model runs/multi30k [--browser]

For each model given (the demo model on the built-in test split, the Multi30k model on its validation set): the
float32 exports' outputs against `generate()`'s, greedy and with the saved beam search (identity rates; CTranslate2,
which has no GNMT penalty, against `generate()` with transformers' |Y|^alpha), BLEU of every system, and file sizes.
transformers.js (Node, `scripts/transformers_js/translate.mjs`) translates 200 test sentences of the demo model
greedily: its outputs against our greedy `generate()`'s. Speed, on the Multi30k model (else the demo model):
`--speed_sentences` sentences in batches of 64 as `scripts/translate.py` sends them, each system decoding to its own
end, greedy and beam 4, interleaved repetitions, `--threads` threads each.
`--browser` serves a page from localhost to headless Chromium (Debian's `chromium`), which translates with
transformers.js (onnxruntime-web, WebAssembly) and posts the translations back; a screenshot is kept.
"""

import argparse
import http.server
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer  # noqa: E402

from vanilla_transformer.data.builtin_task import build_builtin_task  # noqa: E402
from vanilla_transformer.tools.ctranslate2 import CTranslate2Translator, export_ctranslate2  # noqa: E402
from vanilla_transformer.tools.onnx import OnnxTranslator, export_onnx  # noqa: E402
from vanilla_transformer.tools.translation import GenerateTranslator  # noqa: E402
from vanilla_transformer.training.metrics import corpus_scores  # noqa: E402

from .toolkit import environment, load_multi30k, markdown_table, multi30k_missing, time_interleaved, write_report  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CLIENT = ROOT / "scripts" / "transformers_js"
JS_SENTENCES, BATCH_SIZE = 200, 64


def identity(a: list[str], b: list[str]) -> float:
    return sum(x == y for x, y in zip(a, b)) / len(a)


def export_all(model_dir, work: Path) -> dict[str, Path]:
    return {"onnx": export_onnx(model_dir, work / "onnx", quantize="int8"),
            "ct2 float32": export_ctranslate2(model_dir, work / "ct2_fp32"),
            "ct2 int8": export_ctranslate2(model_dir, work / "ct2_int8", quantization="int8")}


def translators(model_dir, exports, threads) -> dict:
    """Every system, by the name the report gives it, behind the one translation loop."""
    model = AutoModelForSeq2SeqLM.from_pretrained(model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return {"generate()": GenerateTranslator(model, tokenizer),
            "onnxruntime float32": OnnxTranslator(exports["onnx"], threads=threads),
            "onnxruntime int8": OnnxTranslator(exports["onnx"], "int8", threads),
            "ctranslate2 float32": CTranslate2Translator(exports["ct2 float32"], threads=threads),
            "ctranslate2 int8": CTranslate2Translator(exports["ct2 int8"], threads=threads)}


def quality(name, model_dir, exports, sources, references, threads):
    """Identity rates and BLEU of one model and its exports on one evaluation set."""
    systems = translators(model_dir, exports, threads)
    model, tokenizer = systems["generate()"].model, systems["generate()"].tokenizer
    beams = model.generation_config.num_beams
    out = {"greedy": {system: t.translate(sources, BATCH_SIZE, num_beams=1) for system, t in systems.items()},
           "as saved": {system: t.translate(sources, BATCH_SIZE) for system, t in systems.items()}}
    # CTranslate2 ranks beams by log P / |Y|^alpha: compared with generate() ranking so, not with the GNMT penalty.
    hf_penalty = GenerateTranslator(model, tokenizer, length_penalty_type="hf").translate(sources, BATCH_SIZE)
    files = {path.name: path.stat().st_size for path in sorted((exports["onnx"] / "onnx").iterdir())}
    files.update({f"{system}/model.bin": (path / "model.bin").stat().st_size for system, path in exports.items()
                  if system.startswith("ct2")})
    files["model.safetensors"] = Path(model_dir, "model.safetensors").stat().st_size
    ours = out["as saved"]["generate()"]
    return {"name": name, "sentences": len(sources), "files": files, "num_beams_as_saved": beams,
            "identity": {
                "onnxruntime float32, greedy": identity(out["greedy"]["generate()"], out["greedy"]["onnxruntime float32"]),
                "onnxruntime float32, as saved": identity(ours, out["as saved"]["onnxruntime float32"]),
                "ctranslate2 float32, greedy": identity(out["greedy"]["generate()"], out["greedy"]["ctranslate2 float32"]),
                "ctranslate2 float32, beam with |Y|^alpha": identity(hf_penalty, out["as saved"]["ctranslate2 float32"])},
            "bleu": {f"{system}, {search}": corpus_scores(h, references)["bleu"]
                     for search, hyps in out.items() for system, h in hyps.items()},
            "differences": [{"source": s, "ours": a, "onnx": b} for s, a, b in
                            zip(sources, ours, out["as saved"]["onnxruntime float32"]) if a != b][:10]}


def transformers_js(export_dir, model_dir, sources, dtype="fp32"):
    """transformers.js's translations (Node) against our greedy generate()'s."""
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as file:
        file.write("\n".join(sources) + "\n")
    start = time.perf_counter()
    run = subprocess.run(["node", str(CLIENT / "translate.mjs"), str(export_dir), file.name, "--dtype", dtype],
                         capture_output=True, text=True, check=True)
    seconds = time.perf_counter() - start
    theirs = [json.loads(line) for line in run.stdout.splitlines()]
    model = AutoModelForSeq2SeqLM.from_pretrained(model_dir).eval()
    ours = GenerateTranslator(model, AutoTokenizer.from_pretrained(model_dir)).translate(sources, num_beams=1)
    return {"dtype": dtype, "sentences": len(sources), "identity_vs_our_greedy": identity(theirs, ours),
            "seconds_with_node_start": seconds,
            "differences": [{"ours": a, "transformers.js": b} for a, b in zip(ours, theirs) if a != b][:10]}


def speed(model_dir, exports, sources, threads, repeats):
    torch.set_num_threads(threads)
    systems = translators(model_dir, exports, threads)
    rows = {}
    for label, beams in (("greedy", 1), ("beam 4", 4)):
        tasks = {name: (lambda t=t: t.translate(sources, BATCH_SIZE, num_beams=beams)) for name, t in systems.items()}
        with torch.inference_mode():
            times = time_interleaved(tasks, repeats, warmup=1)
        median = {name: statistics.median(ts) for name, ts in times.items()}
        rows[label] = {name: {"ms": s * 1e3, "sentences_per_s": len(sources) / s,
                              "speed_vs_generate": median["generate()"] / s} for name, s in median.items()}
    return rows


class _Handler(http.server.SimpleHTTPRequestHandler):
    """Serves the repository read-only and takes the page's results by POST."""
    results: dict = {}

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).results.update(json.loads(body))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args):
        pass


def browser(export_dir, sources, screenshot: Path, timeout=600):
    """transformers.js in headless Chromium: a page served from localhost translates `sources` (greedy,
    onnxruntime-web's WebAssembly backend, float32) and posts them back; a screenshot of the page is kept."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        return {"skipped": "no chromium: apt-get update && apt-get install -y chromium"}
    site = Path(tempfile.mkdtemp(prefix="vt_browser_"))
    (site / "model").symlink_to(Path(export_dir).resolve())
    (site / "node_modules").symlink_to(CLIENT / "node_modules")
    shutil.copy(CLIENT / "browser.html", site / "index.html")
    (site / "sources.json").write_text(json.dumps(sources))
    handler = type("Handler", (_Handler,), {"results": {}})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), lambda *a: handler(*a, directory=str(site)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}/index.html"
    # No background networking: this machine's closed network refuses Chromium's own connections.
    base = [chromium, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--user-data-dir=" + str(site / "profile")]
    start = time.perf_counter()
    page = subprocess.Popen([*base, "--remote-debugging-port=0", url], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        while "translations" not in handler.results and "error" not in handler.results:
            if time.perf_counter() - start > timeout or page.poll() is not None:
                break
            time.sleep(1)
    finally:
        page.kill()
    seconds = time.perf_counter() - start
    # The screenshot is a second, fresh load of the page, which shows the same translations when they are done.
    subprocess.run([*base, "--window-size=1000,700", "--virtual-time-budget=600000", f"--screenshot={screenshot}",
                    url], capture_output=True, timeout=timeout)
    server.shutdown()
    version = subprocess.run([chromium, "--version"], capture_output=True, text=True).stdout.strip()
    return {"browser": version, "seconds": seconds, "screenshot": str(screenshot), **handler.results}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--demo_model", default="demo_output/model")
    parser.add_argument("--model", default="runs/multi30k")
    parser.add_argument("--data_dir", default="../shared/data/multi30k")
    parser.add_argument("--output", default="scripts/benchmarks/results/engines")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--speed_sentences", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--browser", action="store_true", help="also run transformers.js in headless Chromium")
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.speed_sentences < 1 or args.threads < 1:
        parser.error(f"--repeats, --speed_sentences and --threads must be at least 1, got {args.repeats}, "
                     f"{args.speed_sentences} and {args.threads}")
    work = Path(tempfile.mkdtemp(prefix="vt_engines_"))
    results = {"environment": environment(), "models": {}}
    sets = {}
    if Path(args.demo_model, "config.json").is_file():
        test = build_builtin_task()["test"]["translation"]
        sets["demo"] = (args.demo_model, [p["en"] for p in test], [p["de"] for p in test])
    else:
        print(f"demo model skipped: no model in {args.demo_model} (make demo)")
    reason = multi30k_missing(args.data_dir) or (None if Path(args.model, "config.json").is_file()
                                                 else f"no trained model in {args.model}")
    if reason is None:
        validation = load_multi30k(args.data_dir)["validation"]["translation"]
        sets["multi30k"] = (args.model, [p["en"] for p in validation], [p["de"] for p in validation])
    else:
        print(f"Multi30k model skipped: {reason}")
    if not sets:
        print("skipped: no model to export")
        return None
    exports = {}
    for name, (model_dir, sources, references) in sets.items():
        started = time.perf_counter()
        exports[name] = export_all(model_dir, work / name)
        results["models"][name] = {"export_seconds": time.perf_counter() - started,
                                   **quality(name, model_dir, exports[name], sources, references, args.threads)}
    if "demo" in sets and (CLIENT / "node_modules").is_dir() and shutil.which("node"):
        demo_dir, demo_sources, _ = sets["demo"]
        results["transformers.js"] = [transformers_js(exports["demo"]["onnx"], demo_dir, demo_sources[:JS_SENTENCES], dtype)
                                      for dtype in ("fp32", "q8")]
    if args.browser and "demo" in sets:
        screenshot = Path(args.output).with_name(Path(args.output).name + "_browser.png")
        results["browser"] = browser(exports["demo"]["onnx"], sets["demo"][1][:8], screenshot)
    name = "multi30k" if "multi30k" in sets else "demo"
    model_dir, sources = sets[name][:2]
    results["speed"] = {"model": name, "sentences": min(args.speed_sentences, len(sources)), "threads": args.threads,
                        "batch_size": BATCH_SIZE,
                        "rows": speed(model_dir, exports[name], sources[:args.speed_sentences], args.threads,
                                      args.repeats)}
    command = shlex.join(["python", "-m", "scripts.benchmarks.engines", *(sys.argv[1:] if argv is None else argv)])
    paths = write_report(args.output, {"command": command, **results}, render(results, command))
    print(paths["md"].read_text())
    shutil.rmtree(work, ignore_errors=True)
    return results


def render(results, command):
    env = results["environment"]
    s = results["speed"]
    lines = ["# Engines: generate(), onnxruntime, CTranslate2, transformers.js", "", f"`{command}`", "",
             f"{env['cpu']}, torch {env['torch']}.", "",
             f"## Speed: {s['sentences']} {s['model']} sentences in batches of {s['batch_size']}, {s['threads']} threads, "
             "each system to its own end", ""]
    lines += markdown_table(["decoding", "system", "ms", "sentences/s", "vs generate()"],
                            [[label, name, f"{r['ms']:.0f}", f"{r['sentences_per_s']:.1f}",
                              f"{r['speed_vs_generate']:.2f}x"]
                             for label, systems in s["rows"].items() for name, r in systems.items()])
    lines.append("")
    for name, r in results["models"].items():
        lines += [f"## {name}: {r['sentences']} sentences", "",
                  f"Exports (ONNX float32 and int8, CTranslate2 float32 and int8, each verified): "
                  f"{r['export_seconds']:.0f} s. The float32 exports' outputs are generate()'s on these shares of the "
                  f"sentences (saved beam: {r['num_beams_as_saved']}):", ""]
        lines += markdown_table(["export, decoding", "identical to generate()"],
                                [[what, f"{rate:.1%}"] for what, rate in r["identity"].items()])
        lines += [""] + markdown_table(["system, decoding", "BLEU"],
                                       [[system, f"{bleu:.2f}"] for system, bleu in r["bleu"].items()])
        lines += [""] + markdown_table(["file", "MB"], [[file, f"{size / 1e6:.2f}"] for file, size in r["files"].items()])
        if r["differences"]:
            lines += ["", "Where the ONNX float32 export's beam output differs (first 10):", ""]
            lines += markdown_table(["source", "ours", "onnx"],
                                    [[d["source"], d["ours"], d["onnx"]] for d in r["differences"]])
        lines.append("")
    for js in results.get("transformers.js", []):
        lines += [f"transformers.js 4.3.2 in Node ({js['dtype']}), {js['sentences']} built-in test sentences, greedy: "
                  f"**{js['identity_vs_our_greedy']:.1%}** identical to our greedy generate()"
                  f"{'' if js['dtype'] == 'fp32' else ' (float32)'}; {js['seconds_with_node_start']:.0f} s.", ""]
    if "browser" in results:
        b = results["browser"]
        if "skipped" in b:
            lines += [f"Browser run skipped: {b['skipped']}.", ""]
        else:
            lines += [f"## In the browser: {b['browser']}, headless", "",
                      f"transformers.js with onnxruntime-web (WebAssembly), served from localhost, in {b['seconds']:.0f} s "
                      f"(page load to the last translation):", ""]
            lines += markdown_table(["English", "German (in the browser)"],
                                    [[s, t] for s, t in zip(b.get("sources", []), b.get("translations", []))])
            lines += ["", f"![the page in headless Chromium]({Path(b['screenshot']).name})", ""]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
