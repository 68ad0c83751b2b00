"""Translations served over HTTP on Ray Serve, an existing engine that runs the same application on a laptop and on a
cluster: each replica holds one translator of the one translation loop (`tools.engines`: `generate()`, CTranslate2 or
onnxruntime), and Ray Serve's own dynamic batching (`serve.batch`) gathers the sentences of concurrent requests into
the loop's batches.

The API is LibreTranslate's, so its clients work unchanged: `POST /translate` with `q` (a string or a list),
`source`, `target`, `format` ("text") and `api_key`, answering `{"translatedText": ...}`; `GET /languages`; and
`GET /health`. `GET /` is a page to type into. A bad request gets a 4xx whose `error` names the field and the limit,
before anything reaches the model. Ray and FastAPI are the `serve` extra (`pip install ".[serve]"`).
"""

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs

from ..support_vanilla_transformer import check_int

PAGE = Path(__file__).with_name("serving_page.html")
LANGUAGE_NAMES = {"en": "English", "de": "German", "fr": "French", "es": "Spanish", "it": "Italian", "cs": "Czech",
                  "ro": "Romanian", "ru": "Russian", "zh": "Chinese", "ja": "Japanese"}


@dataclass(frozen=True)
class Limits:
    """What one request may ask for. Each is a flag of scripts/serve.py, named in the error that enforces it."""

    max_body_bytes: int = 64 * 1024
    max_sentences: int = 64
    max_tokens: int = 256

    def __post_init__(self):
        for name in ("max_body_bytes", "max_sentences", "max_tokens"):
            check_int(f"`{name}`", getattr(self, name))


class RequestError(Exception):
    """A request the server refuses: `status` (4xx) and a message naming the field and the limit."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


@dataclass(frozen=True)
class TranslateRequest:
    sentences: list[str]
    as_list: bool


def parse_translate_request(body: bytes, content_type: str, limits: Limits, languages: tuple[str, str],
                            api_keys: frozenset[str] | None = None) -> TranslateRequest:
    """Check a `POST /translate` body, JSON or form-encoded as LibreTranslate takes it, against the limits, the
    model's language pair and the keys; raise `RequestError` naming what is wrong."""
    if len(body) > limits.max_body_bytes:
        raise RequestError(413, f"the request body has {len(body):,} bytes, more than max_body_bytes="
                                f"{limits.max_body_bytes:,}")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as error:
        raise RequestError(400, f"the request body is not UTF-8 text (byte {error.start}: "
                                f"{body[error.start:error.start + 1]!r})") from None
    fields = _fields(text, content_type)
    if api_keys is not None and fields.get("api_key") not in api_keys:
        given = "missing" if fields.get("api_key") in (None, "") else "not a listed key"
        raise RequestError(403, f"api_key is {given}: this server takes only the keys in its --api_keys_file")
    source, target = languages
    for field, expected in (("source", source), ("target", target)):
        value = fields.get(field, expected if field == "source" else None)
        if field == "source" and value == "auto":
            continue
        if value != expected:
            given = f"{field} is missing" if value is None else f"{field}={value!r}"
            raise RequestError(400, f"{given}: this server translates {source} to {target} only "
                                    f"(source={source!r}, target={target!r})")
    if fields.get("format", "text") != "text":
        raise RequestError(400, f"format={fields['format']!r}: only 'text' is served")
    return TranslateRequest(*_sentences(fields.get("q"), limits))


def _fields(text: str, content_type: str) -> dict:
    if "application/x-www-form-urlencoded" in content_type:
        return {key: values[0] for key, values in parse_qs(text, keep_blank_values=True).items()}
    try:
        fields = json.loads(text)
    except json.JSONDecodeError as error:
        raise RequestError(400, f"the request body is not valid JSON: {error.msg} at character {error.pos}") from None
    if not isinstance(fields, dict):
        raise RequestError(400, f"the request body must be a JSON object with a field q, got a "
                                f"{type(fields).__name__}")
    return fields


def _sentences(q, limits: Limits) -> tuple[list[str], bool]:
    if q is None:
        raise RequestError(400, "q is missing: give the text to translate, a string or a list of strings")
    as_list = isinstance(q, list)
    sentences = q if as_list else [q]
    if not all(isinstance(sentence, str) for sentence in sentences):
        wrong = next(s for s in sentences if not isinstance(s, str)) if as_list else q
        raise RequestError(400, f"q must be a string or a list of strings, got a {type(wrong).__name__}: "
                                f"{json.dumps(wrong)[:60]}")
    if not sentences:
        raise RequestError(400, "q is an empty list: give at least one sentence")
    if len(sentences) > limits.max_sentences:
        raise RequestError(400, f"q has {len(sentences)} sentences, more than max_sentences={limits.max_sentences}")
    for i, sentence in enumerate(sentences):
        if not sentence.strip():
            raise RequestError(400, f"{f'q[{i}]' if as_list else 'q'} is empty: give text to translate")
    return sentences, as_list


def check_token_counts(request: TranslateRequest, token_counts: list[int], limit: int) -> None:
    """Refuse a sentence longer than `limit` tokens (the server's --max_tokens, or less where the engine takes
    fewer positions) before it reaches a batch, where it would fail its neighbours too."""
    for i, (sentence, count) in enumerate(zip(request.sentences, token_counts)):
        if count > limit:
            name = f"q[{i}]" if request.as_list else "q"
            raise RequestError(400, f"{name} has {count} tokens, more than max_tokens={limit}: {sentence[:60]!r}")


def languages_response(languages: tuple[str, str]) -> list[dict]:
    """`GET /languages` as LibreTranslate answers it: each language with the targets it translates into."""
    source, target = languages
    return [{"code": source, "name": LANGUAGE_NAMES.get(source, source), "targets": [target]},
            {"code": target, "name": LANGUAGE_NAMES.get(target, target), "targets": []}]


def model_languages(model_dir) -> tuple[str, str] | None:
    """The (source, target) pair a folder's model card declares (`language: [en, de]`), or None."""
    card = Path(model_dir, "README.md")
    if not card.is_file():
        return None
    from .model_card import check_model_card_metadata

    languages = check_model_card_metadata(card).language
    return tuple(languages) if isinstance(languages, list) and len(languages) == 2 else None


def build_application(model_dir, engine: str = "transformers", quantized: str | None = None,
                      languages: tuple[str, str] | None = None, num_replicas: int = 1, max_batch_size: int = 32,
                      batch_wait_timeout_s: float = 0.005, limits: Limits = Limits(),
                      api_keys: frozenset[str] | None = None, threads: int = 1,
                      max_replicas_per_node: int | None = None):
    """The Ray Serve application: `serve.run(build_application(...))` serves it. `num_replicas` translators, each
    batching up to `max_batch_size` sentences that arrive within `batch_wait_timeout_s` of the first."""
    from fastapi import FastAPI, Request
    from fastapi.responses import HTMLResponse, JSONResponse
    from ray import serve

    model_dir = str(Path(model_dir).resolve())
    languages = languages or model_languages(model_dir)
    if languages is None:
        raise ValueError(f"{model_dir} has no model card naming its two languages: give languages=(source, target)")
    for name, value in (("num_replicas", num_replicas), ("max_batch_size", max_batch_size), ("threads", threads)):
        check_int(f"`{name}`", value)
    if not batch_wait_timeout_s >= 0:
        raise ValueError(f"batch_wait_timeout_s must be at least 0, got {batch_wait_timeout_s!r}")
    app = FastAPI(title="vanilla_transformer translation server")
    options = {"num_replicas": num_replicas, "max_ongoing_requests": max(64, 4 * max_batch_size),
               "ray_actor_options": {"num_cpus": threads}}
    if max_replicas_per_node is not None:
        options["max_replicas_per_node"] = max_replicas_per_node

    @serve.deployment(**options)
    @serve.ingress(app)
    class TranslationServer:
        def __init__(self):
            import ray
            import torch

            from .engines import load_translator

            # Only generate() computes in torch; another engine's threads would share the cores with torch's idle pool.
            torch.set_num_threads(threads if engine == "transformers" else 1)
            self.translator = load_translator(engine, model_dir, quantized=quantized, threads=threads)
            limit = self.translator.max_positions
            self.max_tokens = min(limits.max_tokens, limit) if limit else limits.max_tokens
            self.translate_batch.set_max_batch_size(max_batch_size)
            self.translate_batch.set_batch_wait_timeout_s(batch_wait_timeout_s)
            self.page = PAGE.read_text(encoding="utf-8").replace("{{SOURCE}}", languages[0]).replace(
                "{{TARGET}}", languages[1])
            context = serve.get_replica_context()
            self.served_by = f"{ray.get_runtime_context().get_node_id()[:12]}/{context.replica_id.unique_id}"

        @serve.batch
        async def translate_batch(self, sentences: list[str]) -> list[str]:
            import asyncio

            # In a thread, so the replica keeps answering health checks and queueing while the engine decodes.
            return await asyncio.to_thread(self.translator.translate, sentences, batch_size=len(sentences))

        @app.post("/translate")
        async def translate(self, request: Request):
            import asyncio

            started = time.perf_counter()
            try:
                parsed = parse_translate_request(await request.body(), request.headers.get("content-type", ""),
                                                 limits, languages, api_keys)
                counts = [len(ids) for ids in self.translator.tokenizer(parsed.sentences)["input_ids"]]
                check_token_counts(parsed, counts, self.max_tokens)
            except RequestError as error:
                return JSONResponse({"error": error.message}, status_code=error.status)
            translations = await asyncio.gather(*(self.translate_batch(s) for s in parsed.sentences))
            headers = {"x-served-by": self.served_by, "x-engine": engine,
                       "x-translate-ms": f"{(time.perf_counter() - started) * 1000:.1f}"}
            return JSONResponse({"translatedText": translations if parsed.as_list else translations[0]},
                                headers=headers)

        @app.get("/languages")
        async def list_languages(self):
            return languages_response(languages)

        @app.get("/health")
        async def health(self):
            return {"status": "ok", "engine": engine, "model": Path(model_dir).name, "languages": list(languages),
                    "served_by": self.served_by, "pid": os.getpid()}

        @app.get("/", response_class=HTMLResponse)
        async def page(self):
            return self.page

    return TranslationServer.bind()


__all__ = ["Limits", "RequestError", "TranslateRequest", "parse_translate_request", "check_token_counts",
           "languages_response", "model_languages", "build_application"]
