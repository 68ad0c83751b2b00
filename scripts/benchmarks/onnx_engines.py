"""The ONNX export against the model it came from: identical outputs, int8 quality and size, and speed beside
`generate()` and CTranslate2, in one run; transformers.js in Node, and once in a real browser.

    python -m scripts.benchmarks.onnx_engines --demo_model demo_output/model --model runs/multi30k [--browser]

For each model given (the demo model on the built-in test split, the Multi30k model on its validation set):
the float32 export's greedy and beam outputs through `translate_onnx` against `generate()`'s (identity rates),
BLEU of ours and the float32 and int8 exports (decoding as saved), and file sizes. transformers.js (Node,
`scripts/transformers_js/translate.mjs`) translates 200 test sentences of the demo model greedily: its outputs
against our greedy `generate()`'s. Speed: the same sentences, each system decoding to its own end, greedy and
beam 4, interleaved: generate(), onnxruntime float32 and int8, CTranslate2 float32 and int8.
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
from vanilla_transformer.tools.export import export_ctranslate2, translate_ctranslate2  # noqa: E402
from vanilla_transformer.tools.onnx_export import OnnxSeq2Seq, export_onnx, translate_onnx  # noqa: E402
from vanilla_transformer.tools.translation import translate  # noqa: E402
from vanilla_transformer.training.metrics import corpus_scores  # noqa: E402

from .toolkit import environment, load_multi30k, multi30k_missing, time_interleaved, write_report  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CLIENT = ROOT / "scripts" / "transformers_js"
JS_SENTENCES, SPEED_SENTENCES = 200, 64


def identity(a: list[str], b: list[str]) -> float:
    return sum(x == y for x, y in zip(a, b)) / len(a)


def quality(name, model_dir, export_dir, sources, references, threads):
    """Identity rates and BLEU of one model and its ONNX export on one evaluation set."""
    model = AutoModelForSeq2SeqLM.from_pretrained(model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    engine = {None: OnnxSeq2Seq(export_dir, threads=threads), "int8": OnnxSeq2Seq(export_dir, "_quantized", threads)}
    out = {"greedy": {"ours": translate(model, tokenizer, sources, num_beams=1),
                      "onnx float32": translate_onnx(export_dir, sources, num_beams=1, engine=engine[None])},
           "as saved": {"ours": translate(model, tokenizer, sources),
                        "onnx float32": translate_onnx(export_dir, sources, engine=engine[None]),
                        "onnx int8": translate_onnx(export_dir, sources, engine=engine["int8"])}}
    files = {path.name: path.stat().st_size for path in sorted((Path(export_dir) / "onnx").iterdir())}
    files["model.safetensors"] = Path(model_dir, "model.safetensors").stat().st_size
    return {"name": name, "sentences": len(sources), "files": files,
            "num_beams_as_saved": model.generation_config.num_beams,
            "identity": {search: identity(hyps["ours"], hyps["onnx float32"]) for search, hyps in out.items()},
            "bleu": {f"{system}, {search}": corpus_scores(h, references)["bleu"]
                     for search, hyps in out.items() for system, h in hyps.items()},
            "differences": [{"source": s, "ours": a, "onnx": b} for s, a, b in
                            zip(sources, out["as saved"]["ours"], out["as saved"]["onnx float32"]) if a != b][:10]}


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
    ours = translate(model, AutoTokenizer.from_pretrained(model_dir), sources, num_beams=1)
    return {"dtype": dtype, "sentences": len(sources), "identity_vs_our_greedy": identity(theirs, ours),
            "seconds_with_node_start": seconds,
            "differences": [{"ours": a, "transformers.js": b} for a, b in zip(ours, theirs) if a != b][:10]}


def speed(model_dir, onnx_dir, ct2_dirs, sources, threads, repeats):
    torch.set_num_threads(threads)
    model = AutoModelForSeq2SeqLM.from_pretrained(model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    engines = {"onnxruntime float32": OnnxSeq2Seq(onnx_dir, threads=threads),
               "onnxruntime int8": OnnxSeq2Seq(onnx_dir, "_quantized", threads)}
    import ctranslate2

    translators = {name: ctranslate2.Translator(str(path), intra_threads=threads) for name, path in ct2_dirs.items()}
    rows = {}
    for label, beams in (("greedy", 1), ("beam 4", 4)):
        tasks = {"generate()": lambda: translate(model, tokenizer, sources, num_beams=beams)}
        for name, engine in engines.items():
            tasks[name] = lambda e=engine: translate_onnx(onnx_dir, sources, num_beams=beams, engine=e)
        for name, path in ct2_dirs.items():
            tasks[name] = lambda p=path, t=translators[name]: translate_ctranslate2(p, sources, num_beams=beams,
                                                                                  translator=t)
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
    parser.add_argument("--output", default="scripts/benchmarks/results/onnx_engines")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--browser", action="store_true", help="also run transformers.js in headless Chromium")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="vt_onnx_"))
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
        exports[name] = export_onnx(model_dir, work / name, quantize="int8")
        results["models"][name] = {"export_seconds": time.perf_counter() - started,
                                   **quality(name, model_dir, exports[name], sources, references, args.threads)}
    if "demo" in sets and (CLIENT / "node_modules").is_dir() and shutil.which("node"):
        demo_dir, demo_sources, _ = sets["demo"]
        results["transformers.js"] = [transformers_js(exports["demo"], demo_dir, demo_sources[:JS_SENTENCES], dtype)
                                      for dtype in ("fp32", "q8")]
    if args.browser and "demo" in sets:
        screenshot = Path(args.output).with_name(Path(args.output).name + "_browser.png")
        results["browser"] = browser(exports["demo"], sets["demo"][1][:8], screenshot)
    name = "multi30k" if "multi30k" in sets else "demo"
    model_dir, sources = sets[name][:2]
    ct2 = {"ctranslate2 float32": export_ctranslate2(model_dir, work / "ct2_fp32"),
           "ctranslate2 int8": export_ctranslate2(model_dir, work / "ct2_int8", quantization="int8")}
    results["speed"] = {"model": name, "sentences": SPEED_SENTENCES, "threads": args.threads,
                        "rows": speed(model_dir, exports[name], ct2, sources[:SPEED_SENTENCES], args.threads,
                                      args.repeats)}
    command = shlex.join(["python", "-m", "scripts.benchmarks.onnx_engines", *(sys.argv[1:] if argv is None else argv)])
    paths = write_report(args.output, {"command": command, **results}, render(results, command))
    print(paths["md"].read_text())
    shutil.rmtree(work, ignore_errors=True)
    return results


def render(results, command):
    env = results["environment"]
    lines = ["# ONNX export: identical outputs, int8, transformers.js and speed", "", f"`{command}`", "",
             f"{env['cpu']}, torch {env['torch']}.", ""]
    for name, r in results["models"].items():
        lines += [f"## {name}: {r['sentences']} sentences", "",
                  f"Export (float32 and int8, verified): {r['export_seconds']:.0f} s. The float32 export's output is "
                  f"generate()'s on **{r['identity']['greedy']:.1%}** of the sentences greedily and "
                  f"**{r['identity']['as saved']:.1%}** with the saved beam search (beam {r['num_beams_as_saved']}).", "",
                  "| system, decoding | BLEU |", "|---|---|"]
        lines += [f"| {system} | {bleu:.2f} |" for system, bleu in r["bleu"].items()]
        lines += ["", "| file | MB |", "|---|---|"]
        lines += [f"| {file} | {size / 1e6:.2f} |" for file, size in r["files"].items()]
        if r["differences"]:
            lines += ["", "Where the float32 export's beam output differs (first 10):", "", "| source | ours | onnx |",
                      "|---|---|---|"]
            lines += [f"| {d['source']} | {d['ours']} | {d['onnx']} |" for d in r["differences"]]
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
                      f"(page load to the last translation):", "", "| English | German (in the browser) |", "|---|---|"]
            lines += [f"| {s} | {t} |" for s, t in zip(b.get("sources", []), b.get("translations", []))]
            lines += ["", f"![the page in headless Chromium]({Path(b['screenshot']).name})", ""]
    s = results["speed"]
    lines += [f"## Speed: {s['sentences']} {s['model']} sentences, {s['threads']} threads, each system to its own end",
              "", "| decoding | system | ms | sentences/s | vs generate() |", "|---|---|---|---|---|"]
    for label, systems in s["rows"].items():
        lines += [f"| {label} | {name} | {r['ms']:.0f} | {r['sentences_per_s']:.1f} | {r['speed_vs_generate']:.2f}x |"
                  for name, r in systems.items()]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
