"""The translation server (vanilla_transformer.tools.serving on Ray Serve) keeps LibreTranslate's contract: a text comes
back whole, translated sentence by sentence in its own lines; each request gets its own sentences back however requests
are batched together; alternatives are the beam's next best; "auto" says what it detected; JSON, urlencoded and
multipart bodies read alike; every bad request, in any field of any JSON type, gets a JSON 4xx naming it and leaves the
server as it was; pages on other origins may call it; a key past its limit gets 429 and a full replica a fast 503; a
replica killed under load is replaced with no request hanging or answered wrongly; and the page at / translates in a
browser."""

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import VOCAB, confident_model, tiny_tokenizer
from vanilla_transformer.tools.serving import (
    Fields,
    Limits,
    Pairs,
    RateLimiter,
    RequestError,
    detect_language,
    filter_unique,
    languages_response,
    parse_fields,
    read_body,
)
from vanilla_transformer.tools.translation import GenerateTranslator

PAIR = ("en", "de")
SOURCES = [" ".join(f"w{4 + (i * 7 + j * 3) % (VOCAB - 4)}" for j in range(3 + i % 5)) for i in range(24)]
LIMITS = Limits(max_body_bytes=2048, max_sentences=4, max_tokens=12, batch_limit=3, char_limit=200,
                max_alternatives=2)
JSON = {"content-type": "application/json"}


def parse(body, headers=JSON, limits=LIMITS) -> Fields:
    if not isinstance(body, bytes):
        body = json.dumps(body).encode()
    return asyncio.run(parse_fields(body, headers, limits))


def multipart(fields: dict, files: dict | None = None) -> tuple[bytes, dict]:
    boundary = "vtboundary"
    parts = [f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n' for k, v in fields.items()]
    parts += [f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"; filename="{v}"\r\n'
              f"Content-Type: text/plain\r\n\r\nw4\r\n" for k, v in (files or {}).items()]
    return ("".join(parts) + f"--{boundary}--\r\n").encode(), {"content-type": f"multipart/form-data; boundary={boundary}"}


# Bad input: each refused with a status and a message naming the field, what was given and, where there is one, the limit.
BAD_REQUESTS = [
    ("invalid JSON", b'{"q": "w4", ', 400, "not valid JSON"),
    ("not an object", [1, 2], 400, "must be a JSON object with a field q, got a list"),
    ("undecodable bytes", b'{"q": "\xff\xfe"}', 400, "not UTF-8"),
    ("q missing", {"source": "en", "target": "de"}, 400, "q is missing"),
    ("q empty", {"q": "", "source": "en", "target": "de"}, 400, "q is missing"),
    ("q an empty list", {"q": [], "source": "en", "target": "de"}, 400, "q is missing"),
    ("q a number", {"q": 3, "source": "en", "target": "de"}, 400, "q must be a string (q: a string or a list of "
                                                                  "strings), got a number: 3"),
    ("q an object", {"q": {"a": 1}, "source": "en", "target": "de"}, 400, "got an object"),
    ("q a list with a number", {"q": ["w4", 5], "source": "en", "target": "de"}, 400, "q[1] must be a string"),
    ("q a list with null", {"q": ["w4", None], "source": "en", "target": "de"}, 400, "q[1] must be a string (q: a "
                                                                                     "string or a list of strings), got null"),
    ("source a number", {"q": "w4", "source": 1, "target": "de"}, 400, "source must be a string, got a number: 1"),
    ("target a list", {"q": "w4", "source": "en", "target": ["de"]}, 400, "target must be a string, got a list"),
    ("format an object", {"q": "w4", "source": "en", "target": "de", "format": {}}, 400, "format must be a string"),
    ("api_key a list", {"q": "w4", "source": "en", "target": "de", "api_key": []}, 400,
     "api_key must be a string, got a list: []"),
    ("api_key an object", {"q": "w4", "source": "en", "target": "de", "api_key": {}}, 400,
     "api_key must be a string, got an object: {}"),
    ("alternatives a word", {"q": "w4", "source": "en", "target": "de", "alternatives": "many"}, 400,
     "alternatives must be a whole number of at least 0, got a string: \"many\""),
    ("alternatives negative", {"q": "w4", "source": "en", "target": "de", "alternatives": -1}, 400,
     "alternatives must be a whole number"),
    ("alternatives a boolean", {"q": "w4", "source": "en", "target": "de", "alternatives": True}, 400,
     "got a boolean: true"),
    ("alternatives a fraction", {"q": "w4", "source": "en", "target": "de", "alternatives": 1.5}, 400,
     "got a number: 1.5"),
    ("too many alternatives", {"q": "w4", "source": "en", "target": "de", "alternatives": 3}, 400,
     "alternatives=3, more than max_alternatives=2"),
    ("too many texts", {"q": ["w4"] * 4, "source": "en", "target": "de"}, 400, "q has 4 texts, more than batch_limit=3"),
    ("a text too long", {"q": ["w4", "w5 " * 70], "source": "en", "target": "de"}, 400,
     "q[1] has 210 characters, more than char_limit=200"),
    ("body too large", {"q": "w4 " * 1000, "source": "en", "target": "de"}, 413, "more than max_body_bytes=2,048"),
    ("html", {"q": "w4", "source": "en", "target": "de", "format": "html"}, 400, "format='html'"),
]


@pytest.mark.parametrize("case, body, status, message", BAD_REQUESTS, ids=[case[0] for case in BAD_REQUESTS])
def test_a_bad_request_is_refused_naming_what_is_wrong(case, body, status, message):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()

    async def read():
        request = FakeRequest(data)
        return await parse_fields(await read_body(request, LIMITS), request.headers, LIMITS)

    with pytest.raises(RequestError) as refused:
        asyncio.run(read())
    assert refused.value.status == status and message in refused.value.message, refused.value.message


class FakeRequest:
    """What read_body uses of a Starlette request; `stream` fails the test if the body is read when it must not be."""

    def __init__(self, body: bytes, headers=None, readable=True):
        self.headers = {"content-type": "application/json", "content-length": str(len(body)), **(headers or {})}
        self.body, self.readable = body, readable

    async def stream(self):
        assert self.readable, "the body was read"
        for start in range(0, len(self.body), 100):
            yield self.body[start:start + 100]


def test_a_body_announced_too_large_is_refused_before_it_is_read():
    with pytest.raises(RequestError, match="has 9,999 bytes, more than max_body_bytes=2,048") as refused:
        asyncio.run(read_body(FakeRequest(b"", {"content-length": "9999"}, readable=False), LIMITS))
    assert refused.value.status == 413
    without_length = FakeRequest(b"x" * 5000)
    del without_length.headers["content-length"]
    with pytest.raises(RequestError, match="more than max_body_bytes=2,048"):
        asyncio.run(read_body(without_length, LIMITS))
    with pytest.raises(RequestError, match="Content-Length 'ten' is not a number"):
        asyncio.run(read_body(FakeRequest(b"", {"content-length": "ten"}, readable=False), LIMITS))


def test_json_urlencoded_and_multipart_bodies_read_alike():
    expected = Fields(["w4 w5\nw6"], False, "en", "de", "text", 1, "key")
    assert parse({"q": "w4 w5\nw6", "source": "en", "target": "de", "alternatives": 1, "api_key": "key"}) == expected
    form = b"q=w4+w5%0D%0Aw6&source=en&target=de&alternatives=1&api_key=key"
    assert parse(form, {"content-type": "application/x-www-form-urlencoded"}) == expected
    body, headers = multipart({"q": "w4 w5\r\nw6", "source": "en", "target": "de", "alternatives": "1",
                               "api_key": "key"})
    assert parse(body, headers) == expected
    assert parse({"q": ["w4", "w5"], "source": "auto", "target": "de"}).as_list


def test_a_multipart_file_is_refused_by_name():
    body, headers = multipart({"source": "en", "target": "de"}, {"file": "page.txt"})
    with pytest.raises(RequestError, match="file is a file \\('page.txt'\\): files are not translated"):
        parse(body, headers)


def test_limits_must_be_positive():
    with pytest.raises(ValueError, match="`max_sentences` must be an int of at least 1, got 0"):
        Limits(max_sentences=0)
    with pytest.raises(ValueError, match="`max_alternatives` must be an int of at least 0, got -1"):
        Limits(max_alternatives=-1)


def test_a_pair_is_chosen_by_source_and_target_or_detected():
    pairs = Pairs([("en", "de"), ("de", "en"), ("fr", "de")])
    assert pairs.choose(parse({"q": "w4", "source": "en", "target": "de"})) == (("en", "de"), None)
    (pair, detected) = pairs.choose(parse({"q": "Das ist das Haus von meinem Vater", "source": "auto", "target": "en"}))
    assert pair == ("de", "en") and detected["language"] == "de" and detected["confidence"] > 50
    pair, detected = pairs.choose(parse({"q": "The house of my father is big", "source": "auto", "target": "de"}))
    assert pair == ("en", "de") and detected["language"] == "en"
    german = parse({"q": "Das ist das Haus von meinem Vater", "source": "auto", "target": "de"})
    with pytest.raises(RequestError, match="source='auto' \\(detected 'de'\\) to target='de' is not served"):
        Pairs([("en", "de")]).choose(german)
    for body, message in (({"q": "w4", "source": "en"}, "target is missing: this server translates en→de, de→en"),
                          ({"q": "w4", "target": "de"}, "source is missing"),
                          ({"q": "w4", "source": "en", "target": "fr"}, "target='fr' is not served"),
                          ({"q": "w4", "source": "es", "target": "de"}, "source='es' to target='de' is not served")):
        with pytest.raises(RequestError, match=message):
            pairs.choose(parse(body))


def test_detection_keeps_to_the_served_languages_and_says_when_it_finds_none():
    assert detect_language("Das ist das Haus von meinem Vater", ["de", "en"])[0]["language"] == "de"
    assert detect_language("Das ist das Haus von meinem Vater", ["en"]) == [{"confidence": 0.0, "language": "en"}]
    assert detect_language("1234 !!", ["en", "de"]) == [{"confidence": 0.0, "language": "en"}]


def test_a_key_over_its_request_limit_gets_429_until_a_minute_has_passed():
    limiter = RateLimiter(per_minute=2)
    limiter.check("a", now=0.0)
    limiter.check("a", now=1.0)
    limiter.check("b", now=1.0)
    with pytest.raises(RequestError, match="more than req_limit=2 requests a minute; retry in 58 s") as refused:
        limiter.check("a", now=2.0)
    assert refused.value.status == 429 and refused.value.headers == {"Retry-After": "58"}
    limiter.check("a", now=60.5)
    RateLimiter(None).check("a")


def test_alternatives_are_distinct_and_never_the_translation():
    assert filter_unique(["b", "a", "b", "", "c"], "a") == ["b", "c"]


def test_languages_are_listed_as_libretranslate_lists_them():
    assert languages_response([PAIR]) == [{"code": "de", "name": "German", "targets": []},
                                          {"code": "en", "name": "English", "targets": ["de"]}]
    assert languages_response([PAIR, ("de", "en")]) == [{"code": "de", "name": "German", "targets": ["en"]},
                                                        {"code": "en", "name": "English", "targets": ["de"]}]


# ---------------------------------------------------------------------------------------------- on Ray Serve
ray = pytest.importorskip("ray", reason='the serve extra: pip install ".[serve]"')
serve = pytest.importorskip("ray.serve")
CARD = "---\nlanguage:\n- en\n- de\nlibrary_name: transformers\npipeline_tag: translation\n---\n# card\n"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def call(url, body=None, timeout=60, content_type="application/json", method=None, headers=None):
    """(status, JSON answer, headers). Every answer of the application is JSON, errors included; only Ray's proxy
    answers a request whose replica died under it in plain text, as {"text": ...} here."""
    data = body if body is None or isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method,
                                     headers={**({"Content-Type": content_type} if data else {}), **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read()), dict(response.headers)
    except urllib.error.HTTPError as error:
        body = error.read()
        try:
            return error.code, json.loads(body), dict(error.headers)
        except ValueError:
            assert error.code >= 500, (error.code, body)
            return error.code, {"text": body.decode(errors="replace")}, dict(error.headers)


def post(url, body, **kwargs):
    return call(url, body, **kwargs)


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory):
    """A saved model whose card names its pair, as scripts/train.py leaves one."""
    folder = tmp_path_factory.mktemp("served") / "model"
    model, tokenizer = confident_model(), tiny_tokenizer()
    model.generation_config.max_new_tokens = 8
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    (folder / "README.md").write_text(CARD)
    return folder, GenerateTranslator(model, tokenizer)


@pytest.fixture(scope="module")
def server(model_folder):
    """Two replicas on a local Ray, batching up to 8 sentences; beside it, at /limited, one replica that takes 3
    requests a minute a key and holds one request at a time, with Ray Serve's own `serve.batch`."""
    from vanilla_transformer.tools.serving import ServedModel, build_application

    port = free_port()
    ray.init(num_cpus=3, include_dashboard=False, log_to_driver=False)  # a CPU of Ray's for each replica
    serve.start(http_options={"host": "127.0.0.1", "port": port, "request_timeout_s": 30})
    model = ServedModel.from_folder(model_folder[0])
    serve.run(build_application(model, num_replicas=2, max_batch_size=8, limits=LIMITS, threads=1),
              name="translation", route_prefix="/")
    keys = frozenset({"k", "other", *(f"flood{i}" for i in range(32))})
    serve.run(build_application(model, num_replicas=1, batch_wait_timeout_s=0.01, api_keys=keys,
                                limits=Limits(req_limit=3, max_queued_requests=1)), name="limited", route_prefix="/limited")
    yield f"http://127.0.0.1:{port}"
    serve.shutdown()
    ray.shutdown()


def test_concurrent_requests_each_get_their_own_translation(server, model_folder):
    expected = {source: model_folder[1].translate([source])[0] for source in SOURCES}
    with ThreadPoolExecutor(12) as pool:
        answers = list(pool.map(lambda s: post(f"{server}/translate", {"q": s, "source": "en", "target": "de"}),
                                SOURCES))
    assert [a[0] for a in answers] == [200] * len(SOURCES)
    assert {s: a[1]["translatedText"] for s, a in zip(SOURCES, answers)} == expected
    status, answer, _ = post(f"{server}/translate", {"q": SOURCES[:3], "source": "en", "target": "de"})
    assert status == 200 and answer["translatedText"] == [expected[s] for s in SOURCES[:3]]


def test_a_paragraph_is_translated_sentence_by_sentence_and_keeps_its_lines(server, model_folder):
    sentences = [f"{source}." for source in SOURCES[:4]]
    text = f"{sentences[0]} {sentences[1]}\n\n{sentences[2]}\r\n  {sentences[3]}"
    one = {s: t for s, t in zip(sentences, model_folder[1].translate(sentences))}
    status, answer, _ = post(f"{server}/translate", {"q": text, "source": "en", "target": "de"})
    assert status == 200
    assert answer["translatedText"] == f"{one[sentences[0]]} {one[sentences[1]]}\n\n{one[sentences[2]]}\n  " \
                                       f"{one[sentences[3]]}"
    status, answer, _ = post(f"{server}/translate", {"q": " ".join(sentences + sentences[:1]), "source": "en",
                                                     "target": "de"})
    assert status == 400 and answer["error"] == "q has 5 sentences, more than max_sentences=4"


def test_alternatives_are_the_beams_next_best_and_auto_says_what_it_detected(server, model_folder):
    translator = model_folder[1]
    best, *others = translator.hypotheses([SOURCES[3]], 3)[0]
    status, answer, _ = post(f"{server}/translate", {"q": SOURCES[3], "source": "en", "target": "de",
                                                     "alternatives": 2})
    assert status == 200 and answer["translatedText"] == best
    assert answer["alternatives"] == filter_unique(others, best) and "detectedLanguage" not in answer
    english = ["The man rides his bike to the market", "Two dogs are playing in the snow"]
    status, answer, _ = post(f"{server}/translate", {"q": english, "source": "auto", "target": "de",
                                                     "alternatives": 1})
    assert status == 200 and len(answer["alternatives"]) == 2 and len(answer["detectedLanguage"]) == 2
    assert answer["detectedLanguage"][0]["language"] == "en" and answer["detectedLanguage"][0]["confidence"] > 50
    assert answer["translatedText"] == translator.translate(english)
    status, answer, _ = post(f"{server}/translate", {"q": "Zwei Hunde spielen im Schnee", "source": "auto",
                                                     "target": "de"})
    assert status == 400 and "source='auto' (detected 'de') to target='de' is not served" in answer["error"]
    assert "alternatives" not in post(f"{server}/translate", {"q": SOURCES[3], "source": "en", "target": "de"})[1]


@pytest.mark.parametrize("case, body, status, message", BAD_REQUESTS + [
    ("a sentence over max_tokens", {"q": ["w4", "w5 " * 12], "source": "en", "target": "de"}, 400,
     "q[1] has a sentence of 13 tokens, more than max_tokens=12"),
    ("a pair not served", {"q": "w4", "source": "de", "target": "en"}, 400,
     "target='en' is not served: this server translates en→de"),
], ids=[case[0] for case in BAD_REQUESTS] + ["too many tokens", "pair not served"])
def test_the_server_refuses_each_bad_request_in_json_and_answers_the_next(server, case, body, status, message):
    code, answer, _ = post(f"{server}/translate", body if isinstance(body, bytes) else json.dumps(body).encode())
    assert code == status and message in answer["error"], answer
    code, answer, _ = post(f"{server}/translate", {"q": "w4 w5", "source": "en", "target": "de"})
    assert code == 200 and isinstance(answer["translatedText"], str)


def test_forms_unknown_routes_and_wrong_methods_are_answered_in_json(server):
    status, answer, _ = post(f"{server}/translate", b"q=w4+w5&source=en&target=de",
                             content_type="application/x-www-form-urlencoded")
    assert status == 200 and isinstance(answer["translatedText"], str)
    body, headers = multipart({"q": "w4 w5", "source": "en", "target": "de"})
    status, multipart_answer, _ = post(f"{server}/translate", body, content_type=headers["content-type"])
    assert status == 200 and multipart_answer == answer
    assert call(f"{server}/nowhere")[:2] == (404, {"error": "GET /nowhere: Not Found"})
    assert call(f"{server}/translate")[:2] == (405, {"error": "GET /translate: Method Not Allowed"})


def test_a_body_announced_too_large_is_refused_without_waiting_for_it(server):
    host, port = server.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=20) as connection:
        connection.sendall(b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                           b"Content-Length: 10000000\r\n\r\n")
        answer = b""
        while b"\r\n\r\n" not in answer or len(answer.partition(b"\r\n\r\n")[2]) < _content_length(answer):
            chunk = connection.recv(4096)  # the headers and the body may come in separate segments
            if not chunk:
                break
            answer += chunk
    answer = answer.decode()
    assert answer.startswith("HTTP/1.1 413") and "more than max_body_bytes=2,048" in answer, answer


def _content_length(response: bytes) -> int:
    headers = response.partition(b"\r\n\r\n")[0].decode().lower().splitlines()
    return next((int(line.split(":", 1)[1]) for line in headers if line.startswith("content-length:")), 0)


def test_languages_detection_settings_health_and_the_page(server):
    assert call(f"{server}/languages")[1] == languages_response([PAIR])
    assert call(f"{server}/health")[1] == {"status": "ok"}
    status, detected, _ = post(f"{server}/detect", {"q": "The man rides his bike to the market"})
    assert status == 200 and detected[0]["language"] == "en" and detected[0]["confidence"] > 50
    assert post(f"{server}/detect", {"q": 5})[:2] == (400, {"error": "q must be a string (q: a string or a list of "
                                                                      "strings), got a number: 5"})
    settings = call(f"{server}/frontend/settings")[1]
    assert settings["language"] == {"source": {"code": "en", "name": "English"},
                                    "target": {"code": "de", "name": "German"}}
    assert settings["charLimit"] == 200 and settings["keyRequired"] is False
    with urllib.request.urlopen(f"{server}/", timeout=30) as response:
        assert "<textarea" in response.read().decode()


def test_pages_on_other_origins_may_call_the_api(server):
    origin = {"Origin": "https://app.example"}
    preflight = urllib.request.Request(f"{server}/translate", method="OPTIONS", headers={
        **origin, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type"})
    with urllib.request.urlopen(preflight, timeout=30) as response:
        assert response.status == 200 and response.headers["access-control-allow-origin"] == "*"
        assert "POST" in response.headers["access-control-allow-methods"]
    status, _, headers = post(f"{server}/translate", {"q": "w4", "source": "en", "target": "de"}, headers=origin)
    assert status == 200 and headers["access-control-allow-origin"] == "*"


def test_a_key_past_its_limit_gets_429_and_a_full_replica_a_fast_503(server):
    limited = f"{server}/limited"
    answers = [post(f"{limited}/translate", {"q": "w4", "source": "en", "target": "de", "api_key": "k"})
               for _ in range(4)]
    assert [a[0] for a in answers] == [200, 200, 200, 429]
    assert "more than req_limit=3 requests a minute" in answers[3][1]["error"]
    assert "retry-after" in {name.lower() for name in answers[3][2]}
    assert post(f"{limited}/translate", {"q": "w4", "source": "en", "target": "de", "api_key": "other"})[0] == 200

    def ask(i):
        started = time.monotonic()
        status, answer, _ = post(f"{limited}/translate", {"q": SOURCES[i % 24], "source": "en", "target": "de",
                                                          "api_key": f"flood{i}"})
        return status, answer, time.monotonic() - started

    with ThreadPoolExecutor(17) as pool:
        flooding = pool.map(ask, range(32))
        started = time.monotonic()
        assert call(f"{limited}/health")[:2] == (200, {"status": "ok"})  # not behind the translations
        health_seconds = time.monotonic() - started
        flood = list(flooding)
    assert health_seconds < 2, f"/health took {health_seconds:.1f} s under load"
    busy = [(answer, seconds) for status, answer, seconds in flood if status == 503]
    assert {status for status, _, _ in flood} <= {200, 503} and busy, flood
    assert all("max_queued_requests=1" in answer["error"] and seconds < 2 for answer, seconds in busy), busy
    assert post(f"{limited}/translate", {"q": "w4", "source": "en", "target": "de", "api_key": "guess"})[:2] == (
        403, {"error": "api_key is not a listed key: this server takes only the keys in its --api_keys_file"})


def chromium():
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(chromium() is None, reason="no chromium: apt-get update && apt-get install -y chromium")
def test_a_page_on_another_origin_translates_a_paragraph_in_a_browser(server, model_folder, tmp_path):
    """A page served from another port (another origin) calls the API as a browser app would, through CORS."""
    import http.server
    import threading

    sentences = [f"{source}." for source in SOURCES[5:8]]
    expected = " ".join(model_folder[1].translate(sentences))
    (tmp_path / "index.html").write_text(f"""<!doctype html><body><output id="out"></output><script>
fetch("{server}/translate", {{method: "POST", headers: {{"Content-Type": "application/json"}},
  body: JSON.stringify({{q: {json.dumps(" ".join(sentences))}, source: "en", target: "de"}})}})
  .then(r => r.json()).then(a => {{ const o = document.getElementById("out"); o.textContent = a.translatedText;
                                    o.dataset.done = "true"; }})
  .catch(e => {{ document.getElementById("out").textContent = "failed: " + e; }});
</script></body>""")
    handler = lambda *a: http.server.SimpleHTTPRequestHandler(*a, directory=str(tmp_path))  # noqa: E731
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) as other_origin:
        threading.Thread(target=other_origin.serve_forever, daemon=True).start()
        page = subprocess.run([chromium(), "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
                               "--disable-background-networking", "--disable-component-update", "--disable-sync",
                               f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=30000", "--dump-dom",
                               f"http://127.0.0.1:{other_origin.server_address[1]}/index.html"],
                              capture_output=True, text=True, timeout=120)
        other_origin.shutdown()
    assert f'<output id="out" data-done="true">{expected}</output>' in page.stdout, page.stdout[-2000:]


@pytest.mark.skipif(chromium() is None, reason="no chromium: apt-get update && apt-get install -y chromium")
def test_the_page_translates_in_a_browser(server, model_folder, tmp_path):
    source = SOURCES[5]
    page = subprocess.run([chromium(), "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic",
                           "--no-first-run", "--disable-background-networking", "--disable-component-update",
                           "--disable-sync", f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=30000",
                           "--dump-dom", f"{server}/?q={source.replace(' ', '+')}&source=en&target=de"],
                          capture_output=True, text=True, timeout=120)
    expected = model_folder[1].translate([source])[0]
    assert f'<output id="target" for="source">{expected}</output>' in page.stdout, page.stdout[-2000:]
    assert 'data-done="true"' in page.stdout and "transformers, " in page.stdout


def replica_pids(application: str = "translation") -> set[int]:
    """The processes of an application's live replicas, each asked through Ray (named actors need no dashboard)."""
    pids = set()
    for actor in ray.util.list_named_actors(all_namespaces=True):
        if actor["name"].startswith(f"SERVE_REPLICA::{application}#"):
            try:
                handle = ray.get_actor(actor["name"], namespace=actor["namespace"])
                pids.add(ray.get(handle.__ray_call__.remote(lambda replica: os.getpid()), timeout=10))
            except (ray.exceptions.RayError, ValueError):  # a replica that died since it was listed
                pass
    return pids


def test_a_replica_killed_under_load_is_replaced_and_no_request_hangs_or_gets_another_answer(server, model_folder):
    expected = {source: model_folder[1].translate([source])[0] for source in SOURCES}
    replicas = replica_pids()
    assert len(replicas) == 2
    victim = min(replicas)

    def ask(i):
        source = SOURCES[i % len(SOURCES)]
        started = time.monotonic()
        try:
            status, answer, _ = post(f"{server}/translate", {"q": source, "source": "en", "target": "de"}, timeout=45)
        except (urllib.error.URLError, ConnectionError, TimeoutError) as error:
            return source, "failed", repr(error), time.monotonic() - started
        return source, status, answer, time.monotonic() - started

    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(ask, i) for i in range(120)]
        time.sleep(0.5)
        os.kill(victim, signal.SIGKILL)
        answers = [future.result() for future in futures]
    failures = []
    for source, status, answer, seconds in answers:
        assert seconds < 45, f"a request took {seconds:.0f} s"
        assert status != "failed", answer
        if status == 200:
            assert answer["translatedText"] == expected[source], "answered with another request's text"
        else:
            assert status >= 500, (status, answer)
            failures.append((status, answer))
    assert sum(status == 200 for _, status, _, _ in answers) > len(answers) // 2
    print(f"{len(answers) - len(failures)} translated, {len(failures)} refused:", failures[:3])
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        alive = replica_pids()
        if len(alive) == 2 and victim not in alive:
            break
        time.sleep(1)
    else:
        pytest.fail("Ray Serve did not replace the killed replica within 60 s")
    status, answer, _ = post(f"{server}/translate", {"q": SOURCES[0], "source": "en", "target": "de"})
    assert status == 200 and answer["translatedText"] == expected[SOURCES[0]]
