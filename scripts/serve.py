#!/usr/bin/env python
r"""Serve a trained model or an export over HTTP with LibreTranslate's API, on Ray Serve (`pip install ".[serve]"`):

    python scripts/serve.py --model demo_output/model
    curl -s localhost:8000/translate -H 'Content-Type: application/json' \
         -d '{"q": "I carry the blue pigs", "source": "en", "target": "de"}'

Without --address it starts a Ray of its own on this machine; with --address it joins a running cluster (`ray start
--head` on one machine, `ray start --address HEAD:6379` on the others), whose replicas serve behind every node's proxy.
The application lives in `vanilla_transformer.tools.serving`.
"""

import argparse
import os
import signal
import threading
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from vanilla_transformer.tools.engines import ENGINES  # noqa: E402
from vanilla_transformer.tools.serving import Limits, build_application  # noqa: E402


def positive(kind):
    def parse(text):
        value = kind(text)
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be above 0, got {text}")
        return value
    return parse


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="A folder saved by scripts/train.py, or an export of one.")
    parser.add_argument("--engine", choices=ENGINES, default="transformers",
                        help="transformers: the model's generate(); ctranslate2 or onnxruntime: an export's folder.")
    parser.add_argument("--quantized", choices=("int8",), default=None, help="onnxruntime: its int8 graphs.")
    parser.add_argument("--languages", nargs=2, metavar=("SOURCE", "TARGET"), default=None,
                        help="The pair served (default: the two languages of the folder's model card).")
    parser.add_argument("--num_replicas", type=positive(int), default=1, help="Translators, each a Ray actor.")
    parser.add_argument("--threads", type=positive(int), default=1, help="CPU threads (and Ray CPUs) per replica.")
    parser.add_argument("--max_batch_size", type=positive(int), default=32,
                        help="Sentences one replica decodes together (1: no batching).")
    parser.add_argument("--batch_wait_timeout_s", type=float, default=0.005,
                        help="How long a batch waits for more sentences after its first.")
    parser.add_argument("--max_body_bytes", type=positive(int), default=Limits.max_body_bytes)
    parser.add_argument("--max_sentences", type=positive(int), default=Limits.max_sentences,
                        help="Sentences per request (q as a list).")
    parser.add_argument("--max_tokens", type=positive(int), default=Limits.max_tokens, help="Tokens per sentence.")
    parser.add_argument("--api_keys_file", type=Path, default=None,
                        help="One key per line: requests without a listed api_key get 403.")
    parser.add_argument("--request_timeout_s", type=positive(float), default=60.0,
                        help="A request not answered by then gets 408 from Ray Serve's proxy.")
    parser.add_argument("--host", default="127.0.0.1", help="Bind address (0.0.0.0 to serve other machines).")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--address", default=None, help="A running Ray cluster's address (default: start one here).")
    args = parser.parse_args(argv)
    if args.batch_wait_timeout_s < 0:
        parser.error(f"--batch_wait_timeout_s must be at least 0, got {args.batch_wait_timeout_s}")
    if not Path(args.model).is_dir():
        parser.error(f"--model {args.model}: no such folder")
    if args.quantized and args.engine != "onnxruntime":
        parser.error(f"--quantized {args.quantized} is for --engine onnxruntime, not {args.engine}")
    api_keys = None
    if args.api_keys_file is not None:
        if not args.api_keys_file.is_file():
            parser.error(f"--api_keys_file {args.api_keys_file}: no such file")
        api_keys = frozenset(line.strip() for line in args.api_keys_file.read_text().splitlines() if line.strip())
        if not api_keys:
            parser.error(f"--api_keys_file {args.api_keys_file} lists no key")
    application = build_application(
        args.model, engine=args.engine, quantized=args.quantized,
        languages=tuple(args.languages) if args.languages else None, num_replicas=args.num_replicas,
        max_batch_size=args.max_batch_size, batch_wait_timeout_s=args.batch_wait_timeout_s,
        limits=Limits(args.max_body_bytes, args.max_sentences, args.max_tokens), api_keys=api_keys,
        threads=args.threads)

    import ray
    from ray import serve

    ray.init(address=args.address, include_dashboard=False, log_to_driver=False)
    serve.start(http_options={"host": args.host, "port": args.port, "request_timeout_s": args.request_timeout_s})
    serve.run(application, name="translation", route_prefix="/")
    print(f"serving {args.model} ({args.engine}, {args.num_replicas} replica(s)) at http://{args.host}:{args.port}/ "
          "- Ctrl+C stops", flush=True)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    serve.shutdown()
    ray.shutdown()


if __name__ == "__main__":
    main()
