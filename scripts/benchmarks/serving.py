"""The translation server under load, over loopback: throughput and p50 / p99 latency at 1, 8, 32 and 64 concurrent
clients, each sending one sentence at a time, for

- this server (`scripts/serve.py`, Ray Serve batching up to 32 sentences) on CTranslate2 int8 and on `generate()`;
- the same server with batching off (`--max_batch_size 1`);
- what a user writes first: `pipeline("translation")` called inside a plain FastAPI handler (uvicorn);

beside each engine's own batched throughput on the same sentences outside any server (the limit) and the latency of
one `translate` call of one sentence. Each server runs in a process of its own, one at a time; the clients are one
asyncio loop in this process.

    python -m scripts.benchmarks.serving --model runs/multi30k
"""

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from .toolkit import (command_line, cpu_slug, describe_cpu, environment, load_multi30k, markdown_table,  # noqa: E402
                      multi30k_missing, offline_env, write_report)

ROOT = Path(__file__).resolve().parents[2]
CLIENTS = (1, 8, 32, 64)
PAIR = {"source": "en", "target": "de"}


# ---------------------------------------------------------------------------------------------- the baseline server
def baseline_app(model_dir: str):
    """`pipeline("translation")` in a FastAPI handler: one request, one pipeline call, no batching across requests."""
    import torch
    from fastapi import FastAPI
    from transformers import pipeline

    import vanilla_transformer  # noqa: F401  (registers the translation pipeline)

    torch.set_num_threads(int(os.environ.get("BASELINE_THREADS", "2")))
    translator = pipeline("translation", model=model_dir, trust_remote_code=True)
    app = FastAPI()

    @app.post("/translate")
    def translate(body: dict):
        return {"translatedText": translator(body["q"])[0]["translation_text"]}

    @app.get("/health")
    def health():
        return {"status": "ok"}

    return app


# ---------------------------------------------------------------------------------------------- load
async def load(url: str, sentences: list[str], clients: int, requests: int) -> dict:
    """`clients` loops, each posting one sentence at a time until `requests` have been answered."""
    import aiohttp

    latencies, failures, next_index = [], 0, iter(range(requests))

    async def client(session):
        nonlocal failures
        for i in next_index:
            started = time.perf_counter()
            async with session.post(url, json={"q": sentences[i % len(sentences)], **PAIR}) as response:
                await response.read()
                if response.status != 200:
                    failures += 1
            latencies.append(time.perf_counter() - started)

    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=clients)) as session:
        started = time.perf_counter()
        await asyncio.gather(*(client(session) for _ in range(clients)))
        seconds = time.perf_counter() - started
    ordered = sorted(latencies)
    return {"clients": clients, "requests": requests, "failures": failures, "seconds": seconds,
            "sentences_per_s": requests / seconds, "p50_ms": 1000 * ordered[len(ordered) // 2],
            "p99_ms": 1000 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]}


def wait_until_healthy(base: str, process: subprocess.Popen, seconds: float = 300):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with {process.returncode} before answering")
        try:
            with urllib.request.urlopen(f"{base}/health", timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1)
    raise TimeoutError(f"{base} did not answer /health within {seconds:.0f} s")


def stop(process: subprocess.Popen):
    """The server and every process it started (its own session)."""
    for sig, wait in ((15, 60), (9, 10)):
        try:
            os.killpg(process.pid, sig)
            process.wait(timeout=wait)
            return
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue


def measure_server(command: list[str], port: int, sentences: list[str], requests: dict[int, int], log: Path) -> list:
    with open(log, "w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=offline_env(), cwd=ROOT,
                                   start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(base, process)
        asyncio.run(load(f"{base}/translate", sentences, 4, 16))  # warm-up
        return [asyncio.run(load(f"{base}/translate", sentences, clients, count))
                for clients, count in requests.items()]
    finally:
        stop(process)
        subprocess.run([sys.executable, "-m", "ray.scripts.scripts", "stop", "--force"], capture_output=True)


def engine_alone(engine: str, folder: str, sentences: list[str], threads: int, processes: int) -> dict:
    """The engine's own batched throughput (batches of 32) on the servers' CPU budget, `processes` of `threads`
    threads each running at once as the replicas do, and one sentence's latency in a process alone."""
    code = f"""
import json, statistics, sys, time, torch
from vanilla_transformer.tools.engines import load_translator
torch.set_num_threads({threads} if {engine!r} == "transformers" else 1)
translator = load_translator({engine!r}, {folder!r}, threads={threads})
sentences = json.loads(sys.stdin.readline())
translator.translate(sentences[:32], batch_size=32)
for sentence in sentences[:8]:
    translator.translate([sentence])
print("ready", flush=True)
if sys.stdin.readline().strip() == "single":
    single = []
    for sentence in sentences[:64]:
        started = time.perf_counter(); translator.translate([sentence]); single.append(time.perf_counter() - started)
    print(json.dumps({{"single_p50_ms": 1000 * statistics.median(single)}}), flush=True)
else:
    started = time.perf_counter()
    for _ in range(3):
        translator.translate(sentences, batch_size=32)
    print(json.dumps({{"sentences_per_s": 3 * len(sentences) / (time.perf_counter() - started)}}), flush=True)
"""

    def start():
        process = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   text=True, env=offline_env(), cwd=ROOT)
        process.stdin.write(json.dumps(sentences) + "\n")
        process.stdin.flush()
        assert process.stdout.readline().strip() == "ready"
        return process

    def ask(process, task):
        process.stdin.write(task + "\n")
        process.stdin.close()

    def answer(process):
        result = json.loads(process.stdout.readlines()[-1])
        process.wait()
        return result

    workers = [start() for _ in range(processes)]  # loaded and warm before any is timed
    for worker in workers:  # all at once, as the replicas run
        ask(worker, "batched")
    batched = [answer(worker) for worker in workers]
    alone = start()
    ask(alone, "single")
    single = answer(alone)
    return {"processes": processes, "threads": threads,
            "batched_sentences_per_s": sum(b["sentences_per_s"] for b in batched), **single}


def run_benchmark(args) -> dict:
    from vanilla_transformer.tools.ctranslate2 import export_ctranslate2

    sentences = [pair["en"] for pair in load_multi30k(args.data_dir)["validation"]["translation"]][:args.sentences]
    work = Path(tempfile.mkdtemp(prefix="vt_serving_"))
    folders = {"ctranslate2 int8": ("ctranslate2", str(export_ctranslate2(args.model, work / "ct2_int8",
                                                                          quantization="int8"))),
               "generate()": ("transformers", str(Path(args.model).resolve()))}
    requests = {clients: max(args.requests // (4 if clients == 1 else 1), 4 * clients) for clients in args.clients}
    results = {"environment": environment(), "sentences": len(sentences), "threads": args.threads,
               "num_replicas": args.num_replicas, "batch_wait_timeout_s": args.batch_wait_timeout_s,
               "requests": requests, "engines": {}, "servers": {}}
    serve = [sys.executable, "scripts/serve.py", "--languages", "en", "de", "--threads", str(args.threads),
             "--max_sentences", "1", "--num_replicas", str(args.num_replicas),
             "--batch_wait_timeout_s", str(args.batch_wait_timeout_s)]
    for name, (engine, folder) in folders.items():
        if name not in args.engines:
            continue
        results["engines"][name] = engine_alone(engine, folder, sentences, args.threads, args.num_replicas)
        for label, batch in (("Ray Serve, batches of up to 32", 32), ("Ray Serve, batching off", 1)):
            port = args.port
            command = [*serve, "--model", folder, "--engine", engine, "--max_batch_size", str(batch),
                       "--port", str(port)]
            print(f"{name}: {label}", flush=True)
            results["servers"][f"{name}: {label}"] = {
                "engine": name, "batching": batch > 1,
                "levels": measure_server(command, port, sentences, requests, work / "server.log")}
    if not args.baseline:
        return results
    print("pipeline() in FastAPI", flush=True)
    baseline = [sys.executable, "-m", "uvicorn", "--factory", "--port", str(args.port), "--log-level", "warning",
                "scripts.benchmarks.serving:baseline_from_env"]
    # What a user writes first runs one process with torch's default threads: every core.
    os.environ["BASELINE_MODEL"], os.environ["BASELINE_THREADS"] = folders["generate()"][1], str(os.cpu_count())
    results["servers"]["generate(): pipeline() in a FastAPI handler"] = {
        "engine": "generate()", "batching": False,
        "levels": measure_server(baseline, args.port, sentences, requests, work / "baseline.log")}
    shutil.rmtree(work, ignore_errors=True)
    return results


def baseline_from_env():
    return baseline_app(os.environ["BASELINE_MODEL"])


# ---------------------------------------------------------------------------------------------- report
def render(results: dict, command: str) -> str:
    env = results["environment"]
    rows = []
    for name, server in results["servers"].items():
        alone = results["engines"][server["engine"]]["batched_sentences_per_s"]
        for level in server["levels"]:
            rows.append([name, level["clients"], f"{level['sentences_per_s']:.1f}",
                         f"{level['sentences_per_s'] / alone:.0%}", f"{level['p50_ms']:,.0f}",
                         f"{level['p99_ms']:,.0f}", level["failures"]])
    engines = [[name, f"{e['batched_sentences_per_s']:.1f}", f"{e['single_p50_ms']:,.0f}"]
               for name, e in results["engines"].items()]
    return "\n".join([
        "# The translation server under load", "", f"`{command}`", "",
        f"{describe_cpu(env)}, commit {env.get('commit')}; each server {results.get('num_replicas', 1)} "
        f"replica(s) of {results['threads']} threads, a batch gathered for up to "
        f"{results.get('batch_wait_timeout_s', 0.005) * 1000:g} ms; "
        f"{results['sentences']} Multi30k validation sentences, each client sending one at a time over loopback "
        f"(requests per level: {', '.join(f'{c} clients {n}' for c, n in results['requests'].items())}).", "",
        "## Each engine alone (no server)", "",
        "As many processes as a server has replicas, each of its threads, decoding batches of 32 at once; and one "
        "sentence at a time in one process.", "",
        *markdown_table(["engine", "batches of 32, sentences/s", "one sentence, ms"], engines), "",
        "## Served", "",
        *markdown_table(["server", "clients", "sentences/s", "of the engine alone", "p50 ms", "p99 ms", "failed"],
                        rows), ""])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="runs/multi30k", help="A trained folder (the Multi30k recipe's).")
    parser.add_argument("--data_dir", default="../shared/data/multi30k")
    parser.add_argument("--sentences", type=int, default=256)
    parser.add_argument("--requests", type=int, default=256, help="Requests per level (a quarter at 1 client).")
    parser.add_argument("--threads", type=int, default=1, help="Threads per replica (and per engine process).")
    parser.add_argument("--port", type=int, default=8123)
    parser.add_argument("--clients", type=int, nargs="+", default=list(CLIENTS), help="Concurrency levels.")
    parser.add_argument("--engines", nargs="+", default=["ctranslate2 int8", "generate()"],
                        choices=["ctranslate2 int8", "generate()"])
    parser.add_argument("--num_replicas", type=int, default=2, help="Replicas per server (and engine processes).")
    parser.add_argument("--batch_wait_timeout_s", type=float, default=0.005)
    parser.add_argument("--no_baseline", dest="baseline", action="store_false",
                        help="Skip pipeline() in FastAPI.")
    parser.add_argument("--output", default=None,
                        help="Report path without extension (default: scripts/benchmarks/results/serving_<cpu>).")
    args = parser.parse_args(argv)
    for flag in ("sentences", "requests", "threads", "num_replicas"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag} must be at least 1, got {getattr(args, flag)}")
    reason = multi30k_missing(args.data_dir) or (None if Path(args.model, "config.json").is_file()
                                                 else f"no trained model in {args.model}")
    if reason:
        print(f"skipped: {reason}")
        return None
    results = run_benchmark(args)
    command = command_line("serving", argv)
    output = args.output or f"scripts/benchmarks/results/serving_{cpu_slug(results['environment'])}"
    paths = write_report(output, {"command": command, **results}, render(results, command))
    print(paths["md"].read_text())
    return results


if __name__ == "__main__":
    main()
