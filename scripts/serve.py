#!/usr/bin/env python
r"""Serve trained models or their exports over HTTP with LibreTranslate's API, on Ray Serve (`pip install ".[serve]"`):

    python scripts/serve.py --model demo_output/model
    python scripts/serve.py --model runs/en_de/ct2 --model runs/de_en/ct2     # several pairs, one API
    curl -s localhost:8000/translate -H 'Content-Type: application/json' \
         -d '{"q": "A man rides a bike. Two dogs play.", "source": "en", "target": "de"}'

Any folder the project writes serves as it is: a saved model, or a CTranslate2 or ONNX export, whose engine and
language pair the folder records (--engine and --languages for a folder that does not).

Requests reach the replicas through Ray Serve's HAProxy ingress (--ingress haproxy, the default), or its Python proxy
(--ingress proxy). Without --address it starts a Ray of its own on this machine; with --address it joins a running
cluster, whose nodes were started with the same ingress (`RAY_SERVE_ENABLE_HA_PROXY=1 ray start --head` on one
machine, `RAY_SERVE_ENABLE_HA_PROXY=1 ray start --address HEAD:6379` on the others). The application lives in
`vanilla_transformer.tools.serving`.
"""

import argparse
import dataclasses
import os
import signal
import threading
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from vanilla_transformer.tools.ctranslate2 import compute_type_speeds  # noqa: E402
from vanilla_transformer.tools.engines import ENGINES  # noqa: E402
from vanilla_transformer.tools.serving import Limits, ServedModel, build_application  # noqa: E402

INGRESSES = ("haproxy", "proxy")


def positive(kind):
    def parse(text):
        value = kind(text)
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be above 0, got {text}")
        return value
    return parse


def at_least_zero(text):
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be at least 0, got {text}")
    return value


def parser():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, action="append",
                        help="A folder saved by scripts/train.py, or an export of one; repeat it to serve several pairs.")
    parser.add_argument("--engine", choices=ENGINES, default=None,
                        help="Default: what the folder is (an export's own engine, else transformers' generate()).")
    parser.add_argument("--quantized", choices=("int8",), default=None, help="onnxruntime: its int8 graphs.")
    parser.add_argument("--compute_type", default="fastest",
                        help="ctranslate2: the type it computes in; fastest (measured here at start, and used by every "
                             "replica), default (as the export was written), or int8, float32, bfloat16, ...")
    parser.add_argument("--languages", nargs=2, metavar=("SOURCE", "TARGET"), default=None,
                        help="The pair of a folder that records none (one --model only).")
    parser.add_argument("--num_replicas", type=positive(int), default=2, help="Translators per model, each a Ray actor.")
    parser.add_argument("--threads", type=positive(int), default=1, help="CPU threads (and Ray CPUs) per replica.")
    parser.add_argument("--max_batch_size", type=positive(int), default=32,
                        help="Sentences one replica decodes together: what is queued whenever its engine is free "
                             "(1: no batching).")
    parser.add_argument("--batch_wait_timeout_s", type=float, default=None,
                        help="Batch with Ray Serve's serve.batch instead, gathering for this long after a batch's "
                             "first sentence (measured slower: scripts/benchmarks/serving.py).")
    parser.add_argument("--max_body_bytes", type=positive(int), default=Limits.max_body_bytes)
    parser.add_argument("--char_limit", type=positive(int), default=None, help="Characters per text (default: none).")
    parser.add_argument("--batch_limit", type=positive(int), default=None, help="Texts in q as a list (default: none).")
    parser.add_argument("--max_sentences", type=positive(int), default=Limits.max_sentences,
                        help="Sentences per request, once its texts are split.")
    parser.add_argument("--max_tokens", type=positive(int), default=Limits.max_tokens, help="Tokens per sentence.")
    parser.add_argument("--max_alternatives", type=at_least_zero, default=Limits.max_alternatives,
                        help="The most `alternatives` a request gets.")
    parser.add_argument("--req_limit", type=positive(int), default=None,
                        help="Requests a minute per api_key (or client address), counted by each replica; more get 429.")
    parser.add_argument("--max_queued_requests", type=positive(int), default=Limits.max_queued_requests,
                        help="Requests a replica holds at once; more get a fast 503.")
    parser.add_argument("--api_keys_file", type=Path, default=None,
                        help="One key per line: requests without a listed api_key get 403.")
    parser.add_argument("--cors_origins", nargs="*", default=["*"],
                        help="Origins whose pages may call the API (default: every origin, as LibreTranslate; "
                             "none given: CORS off).")
    parser.add_argument("--request_timeout_s", type=positive(float), default=60.0,
                        help="A request not translated by then gets 503.")
    parser.add_argument("--ingress", choices=INGRESSES, default="haproxy",
                        help="haproxy: Ray Serve's HAProxy ingress, requests straight to the replicas; proxy: its "
                             "Python proxy.")
    parser.add_argument("--host", default="127.0.0.1", help="Bind address (0.0.0.0 to serve other machines).")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--address", default=None, help="A running Ray cluster's address (default: start one here).")
    return parser


def served_model(folder, args) -> ServedModel:
    """The folder as the server runs it; a CTranslate2 export in the compute type measured fastest here."""
    model = ServedModel.from_folder(folder, args.engine, args.languages, args.quantized, args.compute_type)
    if args.compute_type != "fastest" and model.engine != "ctranslate2":
        raise ValueError(f"--compute_type {args.compute_type} is for ctranslate2 exports; {folder} runs on {model.engine}")
    if model.engine == "ctranslate2" and model.compute_type not in ("fastest", "default"):
        import ctranslate2

        supported = sorted(ctranslate2.get_supported_compute_types("cpu"))
        if model.compute_type not in supported:
            raise ValueError(f"--compute_type {model.compute_type}: this machine computes in {', '.join(supported)}")
    if model.compute_type != "fastest":
        return model
    speeds = compute_type_speeds(model.folder, threads=args.threads)
    fastest = max(speeds, key=speeds.get)
    print(f"{folder}: {fastest} measured fastest here (sentences/s, {args.threads} thread(s): "
          f"{', '.join(f'{name} {speed:.0f}' for name, speed in speeds.items())})", flush=True)
    return dataclasses.replace(model, compute_type=fastest)


def main(argv=None):
    command = parser()
    args = command.parse_args(argv)
    if args.batch_wait_timeout_s is not None and args.batch_wait_timeout_s < 0:
        command.error(f"--batch_wait_timeout_s must be at least 0, got {args.batch_wait_timeout_s}")
    for folder in args.model:
        if not Path(folder).is_dir():
            command.error(f"--model {folder}: no such folder")
    if args.languages and len(args.model) > 1:
        command.error(f"--languages {' '.join(args.languages)} is for one --model; {len(args.model)} were given, and "
                      "each must record its own pair")
    api_keys = None
    if args.api_keys_file is not None:
        if not args.api_keys_file.is_file():
            command.error(f"--api_keys_file {args.api_keys_file}: no such file")
        api_keys = frozenset(line.strip() for line in args.api_keys_file.read_text().splitlines() if line.strip())
        if not api_keys:
            command.error(f"--api_keys_file {args.api_keys_file} lists no key")
    # Read by Ray Serve when it is imported, here and in every process of a Ray this command starts: the ingress,
    # and Ray Serve's throughput mode (user code on the replica's own event loop, buffered access logs), measured
    # faster for both ingresses (scripts/benchmarks/serving.py). The Python proxy needs direct ingress off.
    os.environ["RAY_SERVE_ENABLE_HA_PROXY"] = "1" if args.ingress == "haproxy" else "0"
    os.environ.setdefault("RAY_SERVE_THROUGHPUT_OPTIMIZED", "1")
    if args.ingress == "proxy":
        os.environ["RAY_SERVE_ENABLE_DIRECT_INGRESS"] = "0"

    try:
        models = [served_model(folder, args) for folder in args.model]
        if args.quantized and any(model.engine != "onnxruntime" for model in models):
            raise ValueError(f"--quantized {args.quantized} is for onnxruntime exports (CTranslate2 exports are "
                             "quantized when written)")
        limits = Limits(**{field.name: getattr(args, field.name) for field in dataclasses.fields(Limits)})
        application = build_application(
            models, num_replicas=args.num_replicas, max_batch_size=args.max_batch_size,
            batch_wait_timeout_s=args.batch_wait_timeout_s, limits=limits, api_keys=api_keys, threads=args.threads,
            cors_origins=args.cors_origins, request_timeout_s=args.request_timeout_s)
    except ValueError as error:
        command.error(str(error))

    import ray
    from ray import serve

    ray.init(address=args.address, include_dashboard=False, log_to_driver=False)
    # Ray's own timeout backs up the application's, which answers in JSON first.
    serve.start(http_options={"host": args.host, "port": args.port, "request_timeout_s": args.request_timeout_s + 5})
    serve.run(application, name="translation", route_prefix="/")
    served = ", ".join(f"{'→'.join(m.languages)} ({m.engine}, {Path(m.folder).name})" for m in models)
    print(f"serving {served} with {args.num_replicas} replica(s) each at http://{args.host}:{args.port}/ "
          f"({args.ingress} ingress) - Ctrl+C stops", flush=True)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    serve.shutdown()
    ray.shutdown()


if __name__ == "__main__":
    main()
