"""The translation server (vanilla_transformer.tools.serving on Ray Serve) keeps LibreTranslate's contract: its
answers are the translation loop's own, each request gets its own sentences back however requests are batched
together, every bad request gets a 4xx naming the field and the limit and leaves the server as it was, a replica
killed under load is replaced with no request hanging or answered wrongly, the page at / translates in a browser, and
two Ray nodes each serve a replica."""

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
    Limits,
    RequestError,
    languages_response,
    model_languages,
    parse_translate_request,
)
from vanilla_transformer.tools.translation import GenerateTranslator

PAIR = ("en", "de")
SOURCES = [" ".join(f"w{4 + (i * 7 + j * 3) % (VOCAB - 4)}" for j in range(3 + i % 5)) for i in range(24)]
LIMITS = Limits(max_body_bytes=2048, max_sentences=4, max_tokens=12)


def parse(body, content_type="application/json", api_keys=None):
    if not isinstance(body, bytes):
        body = json.dumps(body).encode()
    return parse_translate_request(body, content_type, LIMITS, PAIR, api_keys)


# Bad input: each refused with a status and a message naming the field and, where there is one, the limit.
BAD_REQUESTS = [
    ("invalid JSON", b'{"q": "w4", ', 400, "not valid JSON"),
    ("not an object", [1, 2], 400, "must be a JSON object"),
    ("undecodable bytes", b'{"q": "\xff\xfe"}', 400, "not UTF-8"),
    ("q missing", {"source": "en", "target": "de"}, 400, "q is missing"),
    ("q a number", {"q": 3, "source": "en", "target": "de"}, 400, "q must be a string or a list of strings"),
    ("q a list with a number", {"q": ["w4", 5], "source": "en", "target": "de"}, 400, "got a int"),
    ("q empty", {"q": "  ", "source": "en", "target": "de"}, 400, "q is empty"),
    ("q an empty list", {"q": [], "source": "en", "target": "de"}, 400, "q is an empty list"),
    ("too many sentences", {"q": ["w4"] * 5, "source": "en", "target": "de"}, 400, "more than max_sentences=4"),
    ("body too large", {"q": "w4 " * 1000, "source": "en", "target": "de"}, 413, "more than max_body_bytes=2,048"),
    ("another source", {"q": "w4", "source": "fr", "target": "de"}, 400, "source='fr'"),
    ("another target", {"q": "w4", "source": "en", "target": "fr"}, 400, "target='fr'"),
    ("target missing", {"q": "w4", "source": "en"}, 400, "target is missing"),
    ("html", {"q": "w4", "source": "en", "target": "de", "format": "html"}, 400, "format='html'"),
]


@pytest.mark.parametrize("case, body, status, message", BAD_REQUESTS, ids=[case[0] for case in BAD_REQUESTS])
def test_a_bad_request_is_refused_naming_what_is_wrong(case, body, status, message):
    with pytest.raises(RequestError) as refused:
        parse(body)
    assert refused.value.status == status and message in refused.value.message, refused.value.message


def test_requests_are_read_as_libretranslate_clients_send_them():
    assert parse({"q": "w4 w5", "source": "en", "target": "de"}).sentences == ["w4 w5"]
    assert not parse({"q": "w4 w5", "source": "auto", "target": "de"}).as_list
    assert parse({"q": ["w4", "w5"], "source": "en", "target": "de"}).as_list
    form = parse(b"q=w4+w5&source=en&target=de&format=text", "application/x-www-form-urlencoded")
    assert form.sentences == ["w4 w5"]


def test_api_keys_are_checked_before_anything_else():
    keys = frozenset({"secret"})
    assert parse({"q": "w4", "source": "en", "target": "de", "api_key": "secret"}, api_keys=keys).sentences == ["w4"]
    for body in ({"q": "w4", "source": "en", "target": "de"}, {"q": "w4", "target": "de", "api_key": "guess"}):
        with pytest.raises(RequestError) as refused:
            parse(body, api_keys=keys)
        assert refused.value.status == 403 and "api_key" in refused.value.message


def test_limits_must_be_positive():
    with pytest.raises(ValueError, match="`max_sentences` must be an int of at least 1, got 0"):
        Limits(max_sentences=0)


def test_languages_are_listed_as_libretranslate_lists_them(tmp_path):
    assert languages_response(PAIR) == [{"code": "en", "name": "English", "targets": ["de"]},
                                        {"code": "de", "name": "German", "targets": []}]
    (tmp_path / "README.md").write_text("---\nlanguage:\n- en\n- de\nlibrary_name: transformers\n"
                                        "pipeline_tag: translation\n---\n# card\n")
    assert model_languages(tmp_path) == ("en", "de")
    assert model_languages(tmp_path / "nowhere") is None


# ---------------------------------------------------------------------------------------------- on Ray Serve
ray = pytest.importorskip("ray", reason='the serve extra: pip install ".[serve]"')
serve = pytest.importorskip("ray.serve")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def post(url, body, timeout=60, content_type="application/json"):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": content_type})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read()), dict(response.headers)
    except urllib.error.HTTPError as error:
        body = error.read()
        try:
            return error.code, json.loads(body), dict(error.headers)
        except ValueError:  # Ray Serve's proxy answers its own errors in plain text
            return error.code, {"text": body.decode(errors="replace")}, dict(error.headers)


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("served") / "model"
    model, tokenizer = confident_model(), tiny_tokenizer()
    model.generation_config.max_new_tokens = 8
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder, GenerateTranslator(model, tokenizer)


@pytest.fixture(scope="module")
def server(model_folder):
    """Two replicas on a local Ray, batching up to 8 sentences."""
    from vanilla_transformer.tools.serving import build_application

    port = free_port()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": port, "request_timeout_s": 30})
    serve.run(build_application(model_folder[0], languages=PAIR, num_replicas=2, max_batch_size=8,
                                batch_wait_timeout_s=0.01, limits=LIMITS, threads=1), name="translation",
              route_prefix="/")
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


@pytest.mark.parametrize("case, body, status, message", BAD_REQUESTS + [
    ("a sentence over max_tokens", {"q": ["w4", "w5 " * 12], "source": "en", "target": "de"}, 400,
     "q[1] has 13 tokens, more than max_tokens=12")], ids=[case[0] for case in BAD_REQUESTS] + ["too many tokens"])
def test_the_server_refuses_each_bad_request_and_answers_the_next(server, case, body, status, message):
    code, answer, _ = post(f"{server}/translate", body if isinstance(body, bytes) else json.dumps(body).encode())
    assert code == status and message in answer["error"], answer
    code, answer, _ = post(f"{server}/translate", {"q": "w4 w5", "source": "en", "target": "de"})
    assert code == 200 and isinstance(answer["translatedText"], str)


def test_languages_health_and_the_page(server):
    with urllib.request.urlopen(f"{server}/languages", timeout=30) as response:
        assert json.loads(response.read()) == languages_response(PAIR)
    with urllib.request.urlopen(f"{server}/health", timeout=30) as response:
        assert json.loads(response.read())["status"] == "ok"
    with urllib.request.urlopen(f"{server}/", timeout=30) as response:
        page = response.read().decode()
    assert "<textarea" in page and "en → de" in page


def chromium():
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(chromium() is None, reason="no chromium: apt-get update && apt-get install -y chromium")
def test_the_page_translates_in_a_browser(server, model_folder, tmp_path):
    source = SOURCES[5]
    page = subprocess.run([chromium(), "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic",
                           "--no-first-run", "--disable-background-networking", "--disable-component-update",
                           "--disable-sync", f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=30000",
                           "--dump-dom", f"{server}/?q={source.replace(' ', '+')}"],
                          capture_output=True, text=True, timeout=120)
    expected = model_folder[1].translate([source])[0]
    assert f'<output id="target" for="source">{expected}</output>' in page.stdout, page.stdout[-2000:]
    assert 'data-done="true"' in page.stdout and "transformers, " in page.stdout


def replica_pids(server, wanted: int, tries: int = 40) -> set[int]:
    """The processes of the replicas that answer /health (Ray Serve spreads the calls over them)."""
    pids = set()
    for _ in range(tries):
        try:
            with urllib.request.urlopen(f"{server}/health", timeout=10) as response:
                pids.add(json.loads(response.read())["pid"])
        except OSError:
            time.sleep(0.2)
        if len(pids) == wanted:
            break
    return pids


def test_a_replica_killed_under_load_is_replaced_and_no_request_hangs_or_gets_another_answer(server, model_folder):
    expected = {source: model_folder[1].translate([source])[0] for source in SOURCES}
    replicas = replica_pids(server, 2)
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
        alive = replica_pids(server, 2)
        if len(alive) == 2 and victim not in alive:
            break
        time.sleep(1)
    else:
        pytest.fail("Ray Serve did not replace the killed replica within 60 s")
    status, answer, _ = post(f"{server}/translate", {"q": SOURCES[0], "source": "en", "target": "de"})
    assert status == 200 and answer["translatedText"] == expected[SOURCES[0]]
