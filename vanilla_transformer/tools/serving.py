"""Translations served over HTTP on Ray Serve, an existing engine that runs the same application on a laptop and on a
cluster. Each model is one translator of the one translation loop (`tools.engines`: `generate()`, CTranslate2 or
onnxruntime), and each replica decodes the sentences of concurrent requests together: whatever is queued whenever its
engine is free (`DynamicBatch`), or with a window, Ray Serve's own `serve.batch`. One model is served by the
application's own replicas; several (en→de and de→en, say) each get a deployment, its replicas and its batch, behind
one API.

The API is LibreTranslate's, so its clients work unchanged:

- `POST /translate`: `q` (a text or a list of texts), `source` (a code or "auto"), `target`, `format` ("text"),
  `alternatives` (how many other translations), `api_key`; as JSON, a urlencoded form or a multipart form. Answers
  `{"translatedText": ...}`, with `alternatives` and, for "auto", `detectedLanguage`. A text is split into sentences
  (`tools.sentences`), every sentence goes through the replica's batch, and the translations are put back in the
  text's own lines and paragraphs: nothing is dropped.
- `POST /detect`, `GET /languages`, `GET /frontend/settings`, `GET /health`; `GET /` is a page to type into.
- CORS for the origins given (every origin by default, as LibreTranslate); per-key (or per-address) request limits
  answering 429; a bound on the requests a replica holds, answering a fast 503 past it.

Not served: files (`/translate_file`), suggestions (`/suggest`) and `format: "html"`. Every error is JSON,
`{"error": ...}`, naming the field, what was given and the limit; a request is checked whole before any of it is
translated. Ray and FastAPI are the `serve` extra (`pip install ".[serve]"`).
"""

import asyncio
import json
import math
import re
import time
from collections import defaultdict, deque
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs

from ..support_vanilla_transformer import check_int
from .exports import describe_folder
from .sentences import split_text


PAGE = Path(__file__).with_name("serving_page.html")
LANGUAGE_NAMES = {"en": "English", "de": "German", "fr": "French", "es": "Spanish", "it": "Italian", "cs": "Czech",
                  "ro": "Romanian", "ru": "Russian", "zh": "Chinese", "ja": "Japanese", "nl": "Dutch", "pt": "Portuguese"}
FIELDS = ("q", "source", "target", "format", "alternatives", "api_key")


@dataclass(frozen=True)
class Limits:
    """What one request may ask for. Each is a flag of scripts/serve.py, named in the error that enforces it; None
    is no limit, as LibreTranslate's -1."""

    max_body_bytes: int = 64 * 1024
    char_limit: int | None = None        # characters a text (LibreTranslate's --char-limit)
    batch_limit: int | None = None       # texts in q as a list (LibreTranslate's --batch-limit)
    max_sentences: int = 128             # sentences in a request, once its texts are split
    max_tokens: int = 256                # tokens a sentence
    max_alternatives: int = 3            # LibreTranslate's --alternatives-limit
    req_limit: int | None = None         # requests a minute per api_key, or per client address without one
    max_queued_requests: int = 256       # requests a replica holds at once; more get 503

    def __post_init__(self):
        for name in ("max_body_bytes", "max_sentences", "max_tokens", "max_queued_requests"):
            check_int(f"`{name}`", getattr(self, name))
        check_int("`max_alternatives`", self.max_alternatives, at_least=0)
        for name in ("char_limit", "batch_limit", "req_limit"):
            if getattr(self, name) is not None:
                check_int(f"`{name}`", getattr(self, name))


class RequestError(Exception):
    """A request the server refuses: `status` (4xx, or 503) and a message naming the field and the limit."""

    def __init__(self, status: int, message: str, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers or {}


@dataclass(frozen=True)
class ServedModel:
    """One folder the server translates with: a saved model or an export, its engine and its (source, target)."""

    folder: str
    engine: str
    languages: tuple[str, str]
    quantized: str | None = None
    compute_type: str = "default"

    @classmethod
    def from_folder(cls, folder, engine: str | None = None, languages=None, quantized: str | None = None,
                    compute_type: str = "default"):
        """What the folder says of itself (`exports.describe_folder`), with `engine` and `languages` where given; a
        folder that names no pair needs `languages`."""
        folder = Path(folder).resolve()
        if not folder.is_dir():
            raise ValueError(f"model folder {folder}: no such folder")
        described = describe_folder(folder)
        engine = engine or described["engine"]
        if engine != described["engine"]:
            kind = "a saved model" if described["engine"] == "transformers" else f"a {described['engine']} export"
            raise ValueError(f"{folder} is {kind}, not a folder for engine={engine!r}")
        languages = tuple(languages or described["languages"] or ())
        if len(languages) != 2:
            raise ValueError(f"{folder} records no language pair (no model card or export record naming two "
                             "languages): give languages=(source, target), --languages on the command line")
        return cls(str(folder), engine, languages, quantized, compute_type if engine == "ctranslate2" else "default")


@dataclass(frozen=True)
class Fields:
    """A `POST /translate` or `/detect` body, read and type-checked."""

    texts: list[str]
    as_list: bool
    source: str | None
    target: str | None
    format: str
    alternatives: int
    api_key: str | None


# ---------------------------------------------------------------------------------------------- reading requests
def check_content_length(headers, limits: Limits) -> None:
    """Refuse a body announced larger than the limit before reading any of it."""
    length = headers.get("content-length")
    if length is None:
        return
    if not length.isdigit():
        raise RequestError(400, f"Content-Length {length!r} is not a number of bytes")
    if int(length) > limits.max_body_bytes:
        raise RequestError(413, f"the request body has {int(length):,} bytes, more than max_body_bytes="
                                f"{limits.max_body_bytes:,}")


async def read_body(request, limits: Limits) -> bytes:
    """The body, refused by its Content-Length, or as soon as a body sent without one passes the limit."""
    check_content_length(request.headers, limits)
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limits.max_body_bytes:
            raise RequestError(413, f"the request body has more than max_body_bytes={limits.max_body_bytes:,} bytes")
    return bytes(body)


async def parse_fields(body: bytes, headers, limits: Limits) -> Fields:
    """The fields of a body as LibreTranslate reads them: JSON, a urlencoded form or a multipart form; each field
    checked for its type and limits."""
    content_type = headers.get("content-type", "")
    if content_type.startswith("multipart/form-data"):
        fields = await _multipart_fields(body, headers)
    else:
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError as error:
            raise RequestError(400, f"the request body is not UTF-8 text (byte {error.start}: "
                                    f"{body[error.start:error.start + 1]!r})") from None
        if content_type.startswith("application/x-www-form-urlencoded"):
            fields = {key: values[0] for key, values in parse_qs(text, keep_blank_values=True).items()}
        else:
            try:
                fields = json.loads(text)
            except json.JSONDecodeError as error:
                raise RequestError(400, f"the request body is not valid JSON: {error.msg} at character "
                                        f"{error.pos}") from None
            if not isinstance(fields, dict):
                raise RequestError(400, f"the request body must be a JSON object with a field q, got "
                                        f"{_describe(fields)}")
    if isinstance(fields.get("q"), str) and not content_type.startswith("application/json"):
        fields["q"] = "\n".join(fields["q"].splitlines())  # a form's CRLF line ends, as LibreTranslate reads them
    return _check_fields(fields, limits)


async def _multipart_fields(body: bytes, headers) -> dict:
    from starlette.datastructures import Headers, UploadFile
    from starlette.formparsers import MultiPartException, MultiPartParser

    async def stream():
        yield body

    try:
        form = await MultiPartParser(Headers(headers=dict(headers.items())), stream(), max_fields=len(FIELDS) * 4).parse()
    except MultiPartException as error:
        raise RequestError(400, f"the multipart body is not readable: {error.message}") from None
    fields = {}
    for key, value in form.multi_items():
        if isinstance(value, UploadFile):
            raise RequestError(400, f"{key} is a file ({value.filename!r}): files are not translated, send text")
        fields.setdefault(key, value)
    return fields


def _describe(value) -> str:
    kind = {dict: "an object", list: "a list", bool: "a boolean", int: "a number", float: "a number",
            str: "a string", type(None): "null"}[type(value)]
    return f"{kind}: {json.dumps(value)[:60]}"


def _check_fields(fields: dict, limits: Limits) -> Fields:
    for name in ("source", "target", "format", "api_key"):
        value = fields.get(name)
        if value is not None and not isinstance(value, str):
            raise RequestError(400, f"{name} must be a string, got {_describe(value)}")
    q = fields.get("q")
    if q is None or q == "" or q == []:
        raise RequestError(400, "q is missing: give the text to translate, a string or a list of strings")
    as_list = isinstance(q, list)
    texts = q if as_list else [q]
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            where = f"q[{i}]" if as_list else "q"
            raise RequestError(400, f"{where} must be a string (q: a string or a list of strings), got "
                                    f"{_describe(text)}")
    if as_list and limits.batch_limit is not None and len(texts) > limits.batch_limit:
        raise RequestError(400, f"q has {len(texts)} texts, more than batch_limit={limits.batch_limit}")
    if limits.char_limit is not None:
        for i, text in enumerate(texts):
            if len(text) > limits.char_limit:
                where = f"q[{i}]" if as_list else "q"
                raise RequestError(400, f"{where} has {len(text):,} characters, more than char_limit="
                                        f"{limits.char_limit:,}")
    alternatives = fields.get("alternatives", 0)
    if isinstance(alternatives, str) and re.fullmatch(r"\s*\d+\s*", alternatives):
        alternatives = int(alternatives)
    if alternatives is None:
        alternatives = 0
    if isinstance(alternatives, bool) or not isinstance(alternatives, int) or alternatives < 0:
        raise RequestError(400, f"alternatives must be a whole number of at least 0, got {_describe(alternatives)}")
    if alternatives > limits.max_alternatives:
        raise RequestError(400, f"alternatives={alternatives}, more than max_alternatives={limits.max_alternatives}")
    text_format = fields.get("format") or "text"
    if text_format != "text":
        raise RequestError(400, f"format={text_format!r}: only 'text' is served")
    return Fields(texts, as_list, fields.get("source"), fields.get("target"), text_format, alternatives,
                  fields.get("api_key") or None)


# ---------------------------------------------------------------------------------------------- languages
def languages_response(pairs) -> list[dict]:
    """`GET /languages` as LibreTranslate answers it: each language with the targets it translates into."""
    targets = defaultdict(list)
    for source, target in pairs:
        targets[source].append(target)
        targets.setdefault(target, [])
    return [{"code": code, "name": LANGUAGE_NAMES.get(code, code), "targets": sorted(targets[code])}
            for code in sorted(targets)]


def detect_language(text: str, candidates) -> list[dict]:
    """LibreTranslate's detection: the candidates langdetect finds in `text`, most likely first, each
    `{"confidence": 0-100, "language": code}`; the first candidate at confidence 0 where it finds none of them."""
    from langdetect import DetectorFactory, LangDetectException, detect_langs

    DetectorFactory.seed = 0  # langdetect samples; a seed makes its answer the same every time
    candidates = list(candidates)
    try:
        found = [(language.lang, language.prob) for language in detect_langs(text)]
    except LangDetectException:  # no letters at all
        found = []
    kept = [{"confidence": round(100 * prob, 1), "language": code} for code, prob in found if code in candidates]
    return kept or [{"confidence": 0.0, "language": candidates[0]}]


class Pairs:
    """The served pairs and how a request's source and target pick one."""

    def __init__(self, pairs):
        self.pairs = list(pairs)

    @property
    def languages(self) -> list[str]:
        """Every language served, the sources first: those "auto" and `/detect` tell apart, the first source being
        the answer where none is found (as LibreTranslate answers "en")."""
        sources = list(dict.fromkeys(source for source, _ in self.pairs))
        return sources + [target for target in dict.fromkeys(t for _, t in self.pairs) if target not in sources]

    def choose(self, fields: Fields) -> tuple[tuple[str, str], dict | None]:
        """((source, target), the detection for source "auto", else None); 400 naming what is not served. "auto"
        detects one language for all of a request's texts, among every served language, as LibreTranslate detects
        among its installed ones."""
        served = ", ".join(f"{s}→{t}" for s, t in self.pairs)
        if fields.target is None:
            raise RequestError(400, f"target is missing: this server translates {served}")
        if fields.source is None:
            raise RequestError(400, f"source is missing: give a language code or 'auto' (served: {served})")
        if not any(to == fields.target for _, to in self.pairs):
            raise RequestError(400, f"target={fields.target!r} is not served: this server translates {served}")
        detected, source = None, fields.source
        if source == "auto":
            detected = detect_language(" ".join(fields.texts), self.languages)[0]
            source = detected["language"]
        if (source, fields.target) not in self.pairs:
            given = f"source='auto' (detected {source!r})" if detected else f"source={source!r}"
            raise RequestError(400, f"{given} to target={fields.target!r} is not served: this server translates "
                                    f"{served}")
        return (source, fields.target), detected


# ---------------------------------------------------------------------------------------------- limits
class RateLimiter:
    """At most `per_minute` requests in any 60 seconds for each key (LibreTranslate's --req-limit). Each replica
    counts the requests it is given."""

    def __init__(self, per_minute: int | None):
        self.per_minute, self.seen = per_minute, defaultdict(deque)

    def check(self, key: str, now: float | None = None) -> None:
        if self.per_minute is None:
            return
        now = time.monotonic() if now is None else now
        for other in [other for other, times in self.seen.items() if times and times[-1] <= now - 60]:
            del self.seen[other]  # keys idle for a minute, so that the table does not grow with every client
        seen = self.seen[key]
        while seen and seen[0] <= now - 60:
            seen.popleft()
        if len(seen) >= self.per_minute:
            retry = max(1, math.ceil(seen[0] + 60 - now))
            raise RequestError(429, f"Slowdown: more than req_limit={self.per_minute} requests a minute; retry in "
                                    f"{retry} s", {"Retry-After": str(retry)})
        seen.append(now)


def check_token_counts(sentences: list[str], owners: list[str], token_counts: list[int], limit: int) -> None:
    """Refuse a sentence longer than `limit` tokens (the server's --max_tokens, or less where the engine takes
    fewer positions) before it reaches a batch, where it would fail its neighbours too."""
    for sentence, owner, count in zip(sentences, owners, token_counts):
        if count > limit:
            raise RequestError(400, f"{owner} has a sentence of {count} tokens, more than max_tokens={limit}: "
                                    f"{sentence[:60]!r}")


def filter_unique(alternatives: list[str], best: str) -> list[str]:
    """LibreTranslate's alternatives: distinct, non-empty, not the translation itself, best first."""
    seen, kept = {best, ""}, []
    for text in alternatives:
        if text not in seen:
            seen.add(text)
            kept.append(text)
    return kept


# ---------------------------------------------------------------------------------------------- the application
class DynamicBatch:
    """Items of concurrent requests processed together by `process` (a blocking function of a list, run in a
    thread): whenever it is free, everything queued, up to `max_batch_size` items, goes as one batch. Nothing waits
    for a batch to fill, so one request alone is answered at once, and under load the batches grow by themselves."""

    def __init__(self, process, max_batch_size: int):
        self.process, self.max_batch_size = process, max_batch_size
        self.queue: asyncio.Queue | None = None
        self.worker: asyncio.Task | None = None

    async def __call__(self, item):
        if self.queue is None:  # the replica's event loop exists only once it serves
            self.queue = asyncio.Queue()
            self.worker = asyncio.get_running_loop().create_task(self._run())  # held: the loop keeps weak references
        done = asyncio.get_running_loop().create_future()
        await self.queue.put((item, done))
        return await done

    async def _run(self):
        while True:
            batch = [await self.queue.get()]
            while len(batch) < self.max_batch_size and not self.queue.empty():
                batch.append(self.queue.get_nowait())
            batch = [(item, done) for item, done in batch if not done.cancelled()]  # their requests timed out
            if not batch:
                continue
            try:
                results = await asyncio.to_thread(self.process, [item for item, _ in batch])
                if len(results) != len(batch):
                    raise RuntimeError(f"the engine answered {len(results)} of a batch of {len(batch)}")
            except Exception as error:  # the engine failed: every request of the batch is told, none hangs
                for _, done in batch:
                    if not done.done():
                        done.set_exception(error)
                continue
            for (_, done), result in zip(batch, results):
                if not done.done():
                    done.set_result(result)


class BatchedTranslator:
    """One model's translator behind a `DynamicBatch`: `translate(sentences, num_hypotheses)` from any number of
    concurrent requests decodes their sentences together, up to `max_batch_size` at a time. With a
    `batch_wait_timeout_s`, Ray Serve's own `serve.batch` gathers them instead: it forms a batch when its window
    closes, even while the engine is busy, so its batches stay small under load (measured slower at every load in
    scripts/benchmarks/serving.py, and kept for that comparison)."""

    def __init__(self, model: ServedModel, threads: int, max_batch_size: int, batch_wait_timeout_s: float | None):
        import torch
        from ray import serve

        from .engines import load_translator

        # Only generate() computes in torch; another engine's threads would share the cores with torch's idle pool.
        torch.set_num_threads(threads if model.engine == "transformers" else 1)
        self.translator = load_translator(model.engine, model.folder, quantized=model.quantized, threads=threads,
                                          compute_type=model.compute_type)
        if batch_wait_timeout_s is None:
            self.decode_batch = DynamicBatch(self._decode, max_batch_size)
        else:
            self.decode_batch = serve.batch(max_batch_size=max_batch_size,
                                            batch_wait_timeout_s=batch_wait_timeout_s)(self._decode_batch)

    async def translate(self, sentences: list[str], num_hypotheses: int) -> list[list[str]]:
        return list(await asyncio.gather(*(self.decode_batch((sentence, num_hypotheses)) for sentence in sentences)))

    async def _decode_batch(self, items: list[tuple[str, int]]) -> list[list[str]]:
        # In a thread, so the replica keeps answering health checks and queueing while the engine decodes.
        return await asyncio.to_thread(self._decode, items)

    def _decode(self, items):
        results = [None] * len(items)
        for count in sorted({count for _, count in items}):
            indices = [i for i, (_, wanted) in enumerate(items) if wanted == count]
            found = self.translator.hypotheses([items[i][0] for i in indices], count, batch_size=len(indices))
            for i, hypotheses in zip(indices, found):
                results[i] = hypotheses
        return results


def build_application(models, num_replicas: int = 1, max_batch_size: int = 32,
                      batch_wait_timeout_s: float | None = None, limits: Limits = Limits(),
                      api_keys: frozenset[str] | None = None, threads: int = 1, max_replicas_per_node: int | None = None,
                      cors_origins=("*",), request_timeout_s: float = 60.0):
    """The Ray Serve application for `models` (`ServedModel`s, or one): `serve.run(build_application(...))` serves
    it. Each model gets `num_replicas` translators, each decoding up to `max_batch_size` sentences at once: those
    queued whenever its engine is free, or with `batch_wait_timeout_s` those Ray Serve's `serve.batch` gathers within
    that window (`BatchedTranslator`). A request not answered within `request_timeout_s` gets 503."""
    from fastapi import FastAPI, Request
    from fastapi.middleware.cors import CORSMiddleware
    from fastapi.responses import HTMLResponse, JSONResponse
    from ray import serve
    from starlette.exceptions import HTTPException

    models = [models] if isinstance(models, ServedModel) else list(models)
    if not models:
        raise ValueError("give at least one model to serve")
    pairs = Pairs(model.languages for model in models)
    if len(set(pairs.pairs)) != len(models):
        raise ValueError(f"two models translate the same pair: {pairs.pairs}")
    for name, value in (("num_replicas", num_replicas), ("max_batch_size", max_batch_size), ("threads", threads)):
        check_int(f"`{name}`", value)
    if batch_wait_timeout_s is not None and not batch_wait_timeout_s >= 0:
        raise ValueError(f"batch_wait_timeout_s must be at least 0, got {batch_wait_timeout_s!r}")
    if not request_timeout_s > 0:
        raise ValueError(f"request_timeout_s must be above 0, got {request_timeout_s!r}")

    app = FastAPI(title="vanilla_transformer translation server", docs_url=None, redoc_url=None, openapi_url=None)
    if cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=list(cors_origins), allow_methods=["GET", "POST"],
                           allow_headers=["Authorization", "Content-Type"], max_age=20 * 24 * 3600)

    def error(status, message, headers=None):
        return JSONResponse({"error": message}, status_code=status, headers=headers)

    @app.exception_handler(HTTPException)
    async def http_error(request, exc):  # 404, 405: JSON as every other answer
        return error(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}")

    @app.exception_handler(Exception)
    async def server_error(request, exc):
        return error(500, f"the server failed: {type(exc).__name__}: {exc}")

    # The Ray replicas take all the requests they are given (their queue is bounded by the handler, which answers
    # 503 in JSON past `max_queued_requests`), and Ray's own timeout backs up the handler's.
    replica_options = {"num_replicas": num_replicas, "max_ongoing_requests": limits.max_queued_requests + 16,
                       "ray_actor_options": {"num_cpus": threads}}
    if max_replicas_per_node is not None:
        replica_options["max_replicas_per_node"] = max_replicas_per_node
    batching = {"threads": threads, "max_batch_size": max_batch_size, "batch_wait_timeout_s": batch_wait_timeout_s}

    @serve.deployment(**replica_options)
    class ModelReplica:
        """One model of several, in replicas of its own."""

        def __init__(self, model: ServedModel):
            self.batched = BatchedTranslator(model, **batching)

        async def translate(self, sentences, num_hypotheses):
            return await self.batched.translate(sentences, num_hypotheses)

    # With several models the API holds none: its replicas only read requests, so they reserve no CPU of Ray's.
    @serve.deployment(**(replica_options if len(models) == 1 else {**replica_options, "ray_actor_options": {"num_cpus": 0}}))
    @serve.ingress(app)
    class TranslationServer:
        def __init__(self, handles: dict):
            import ray
            from transformers import AutoTokenizer

            self.routes = {}
            for model in models:
                if handles:  # several models: each in its own deployment
                    handle = handles[model.languages]
                    tokenizer = AutoTokenizer.from_pretrained(model.folder)
                    positions = describe_folder(model.folder).get("max_positions")
                    call = self._remote(handle)
                else:
                    batched = BatchedTranslator(model, **batching)
                    tokenizer, positions = batched.translator.tokenizer, batched.translator.max_positions
                    call = batched.translate
                self.routes[model.languages] = (call, tokenizer, min(limits.max_tokens, positions or limits.max_tokens),
                                                model.engine)
            self.rate_limiter, self.held = RateLimiter(limits.req_limit), 0
            self.page = PAGE.read_text(encoding="utf-8")
            context = serve.get_replica_context()
            self.served_by = f"{ray.get_runtime_context().get_node_id()[:12]}/{context.replica_id.unique_id}"
            detect_language("warm up", ["en"])  # langdetect loads its profiles once, here

        @staticmethod
        def _remote(handle):
            async def call(sentences, num_hypotheses):
                return await handle.translate.remote(sentences, num_hypotheses)
            return call

        def admit(self, request, fields: Fields | None = None):
            """Keys, per-key limits and the replica's bound, before anything else is done."""
            if fields is not None and api_keys is not None and fields.api_key not in api_keys:
                given = "missing" if fields.api_key is None else "not a listed key"
                raise RequestError(403, f"api_key is {given}: this server takes only the keys in its "
                                        "--api_keys_file")
            if fields is not None:  # a key counts only where keys are checked: an unchecked one would be a new budget
                client = request.client.host if request.client else "unknown"
                self.rate_limiter.check(fields.api_key if api_keys is not None else client)
            if self.held >= limits.max_queued_requests:
                raise RequestError(503, f"the server is busy: it holds max_queued_requests="
                                        f"{limits.max_queued_requests} requests; retry shortly", {"Retry-After": "1"})

        async def fields_of(self, request) -> Fields:
            self.admit(request)
            body = await read_body(request, limits)
            fields = await parse_fields(body, request.headers, limits)
            self.admit(request, fields)
            return fields

        @app.post("/translate")
        async def translate(self, request: Request):
            started = time.perf_counter()
            try:
                fields = await self.fields_of(request)
                pair, detected = pairs.choose(fields)
                call, tokenizer, max_tokens, engine = self.routes[pair]

                def prepare():
                    splits = [split_text(text, pair[0]) for text in fields.texts]
                    sentences = [s for split in splits for s in split.sentences]
                    owners = [f"q[{i}]" if fields.as_list else "q" for i, split in enumerate(splits)
                              for _ in split.sentences]
                    if len(sentences) > limits.max_sentences:
                        raise RequestError(400, f"q has {len(sentences)} sentences, more than max_sentences="
                                                f"{limits.max_sentences}")
                    counts = [len(ids) for ids in tokenizer(sentences)["input_ids"]] if sentences else []
                    check_token_counts(sentences, owners, counts, max_tokens)
                    return splits, sentences

                # A long text takes the segmenter a while: in a thread, so that the replica's loop goes on serving.
                long = sum(len(text) for text in fields.texts) > 2000
                splits, sentences = await asyncio.to_thread(prepare) if long else prepare()
                self.held += 1
                try:
                    found = await asyncio.wait_for(call(sentences, fields.alternatives + 1), request_timeout_s)
                except asyncio.TimeoutError:
                    raise RequestError(503, f"not translated within request_timeout_s={request_timeout_s:g}: the "
                                            "server is busy; retry shortly", {"Retry-After": "1"}) from None
                finally:
                    self.held -= 1
            except RequestError as refused:
                return error(refused.status, refused.message, refused.headers)
            texts, alternatives, start = [], [], 0
            for split in splits:
                hypotheses = found[start:start + len(split.sentences)]
                start += len(split.sentences)
                best = split.join([h[0] for h in hypotheses])
                texts.append(best)
                others = [split.join([h[min(k, len(h) - 1)] for h in hypotheses])
                          for k in range(1, fields.alternatives + 1)]
                alternatives.append(filter_unique(others, best))
            answer = {"translatedText": texts if fields.as_list else texts[0]}
            if fields.alternatives:
                answer["alternatives"] = alternatives if fields.as_list else alternatives[0]
            if detected is not None:
                answer["detectedLanguage"] = [detected] * len(texts) if fields.as_list else detected
            headers = {"x-served-by": self.served_by, "x-engine": engine,
                       "x-translate-ms": f"{(time.perf_counter() - started) * 1000:.1f}"}
            return JSONResponse(answer, headers=headers)

        @app.post("/detect")
        async def detect(self, request: Request):
            try:
                fields = await self.fields_of(request)
            except RequestError as refused:
                return error(refused.status, refused.message, refused.headers)
            return detect_language(" ".join(fields.texts), pairs.languages)

        @app.get("/languages")
        async def list_languages(self):
            return languages_response(pairs.pairs)

        @app.get("/frontend/settings")
        async def frontend_settings(self):
            source, target = pairs.pairs[0]
            return {"charLimit": -1 if limits.char_limit is None else limits.char_limit,
                    "frontendTimeout": 500, "apiKeys": api_keys is not None, "keyRequired": api_keys is not None,
                    "suggestions": False, "filesTranslation": False, "supportedFilesFormat": [],
                    "language": {"source": {"code": source, "name": LANGUAGE_NAMES.get(source, source)},
                                 "target": {"code": target, "name": LANGUAGE_NAMES.get(target, target)}}}

        @app.get("/health")
        async def health(self):
            return {"status": "ok"}

        @app.get("/", response_class=HTMLResponse)
        async def page(self):
            return self.page

    handles = {}
    if len(models) > 1:
        handles = {model.languages: ModelReplica.options(name=f"Model_{'_'.join(model.languages)}").bind(model)
                   for model in models}
    return TranslationServer.bind(handles)


__all__ = ["Limits", "RequestError", "ServedModel", "Fields", "Pairs", "RateLimiter", "BatchedTranslator",
           "read_body", "parse_fields", "check_content_length", "check_token_counts", "languages_response",
           "detect_language", "filter_unique", "build_application"]
