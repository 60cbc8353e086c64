"""A real API server's errors and its other endpoints: OpenAI's error body for every 4xx, /health,
/version, /v1/models under --served-model-name, and /metrics.

Oracles: OpenAI's error object `{"error": {"message", "type", "param", "code"}}` and the status
codes the official `openai` client maps to its exceptions; the package's own version; the served
names given on the command line; the usage the responses report (token counters must grow by
exactly that much) and the arithmetic of the prefix-cache hit rate (hits / finished prompts).
"""
import uuid

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

import fastdeploy
from running_server import RunningServer

NAMES = ("smol", "smol-alias")
MSGS = [{"role": "user", "content": "Say OK."}]
ERROR_KEYS = {"message", "type", "param", "code"}
PNG_1PX = ("data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhK"
           "mMIQAAAABJRU5ErkJggg==")
METRICS = ("fastdeploy:num_requests_running", "fastdeploy:num_requests_waiting", "fastdeploy:gpu_cache_usage_perc",
           "fastdeploy:prompt_tokens_total", "fastdeploy:generation_tokens_total",
           "fastdeploy:time_to_first_token_seconds_count", "fastdeploy:time_per_output_token_seconds_count",
           "fastdeploy:e2e_request_latency_seconds_count", "fastdeploy:request_queue_time_seconds_count",
           "fastdeploy:hit_req_rate", "fastdeploy:hit_token_rate")


@pytest.fixture(scope="module")
def server():
    with RunningServer("--max-model-len", "512", "--max-num-seqs", "8", "--served-model-name", *NAMES,
                       model=NAMES[0]) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return server.client(timeout=60)


def post(server, route, body=None, content=None):
    return httpx.post(server.url + route, json=body, content=content, timeout=60,
                      headers={"content-type": "application/json"})


def assert_error_body(response, status, param="unset"):
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == ERROR_KEYS
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    assert body["error"]["type"] == ("not_found_error" if status == 404 and param == "unset"
                                     else "invalid_request_error")
    if param != "unset":
        assert body["error"]["param"] == param
    return body["error"]


# ---- errors --------------------------------------------------------------------------------------
@pytest.mark.parametrize("content", [b'{"model": "smol", "messages": [', b"not json", b"", b"[1, 2]", b'"text"'])
def test_malformed_body_is_400_not_422(server, content):
    for route in ("/v1/chat/completions", "/v1/completions"):
        error = assert_error_body(post(server, route, content=content), 400, param=None)
        assert "JSON" in error["message"]


@pytest.mark.parametrize("key, value", [("max_tokens", "five"), ("temperature", "hot"), ("n", 1.5),
                                        ("stop", 3), ("logprobs", "yes")])
def test_wrong_type_is_400_naming_the_field(server, key, value):
    body = {"model": "smol", "messages": MSGS, key: value}
    error = assert_error_body(post(server, "/v1/chat/completions", body), 400, param=key)
    assert key in error["message"]


def test_unknown_key_is_400(client, server):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="smol", messages=MSGS, max_tokens=2, extra_body={"frobnicate": 1})
    assert e.value.body["param"] == "frobnicate" and "frobnicate" in e.value.message
    assert e.value.body["code"] == "unknown_parameter"


def test_unknown_model_is_404(client):
    for call in (lambda: client.chat.completions.create(model="gpt-4o", messages=MSGS, max_tokens=2),
                 lambda: client.completions.create(model="default", prompt="Hi", max_tokens=2)):
        with pytest.raises(openai.NotFoundError) as e:
            call()
        assert e.value.status_code == 404 and e.value.body["param"] == "model"
        assert e.value.body["code"] == "model_not_found" and "smol" in e.value.message


def test_unknown_route_and_method(server):
    assert_error_body(httpx.get(server.url + "/v1/nothing-here"), 404)
    assert_error_body(post(server, "/v2/chat/completions", {"messages": MSGS}), 404)
    error = assert_error_body(httpx.get(server.url + "/v1/chat/completions"), 405, param=None)
    assert error["message"]


def test_image_part_on_a_text_model_is_400(client):
    content = [{"type": "text", "text": "What is this?"}, {"type": "image_url", "image_url": {"url": PNG_1PX}}]
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="smol", messages=[{"role": "user", "content": content}], max_tokens=2)
    assert "image" in e.value.message


def test_bad_messages_are_400(client):
    for messages in ([], [{"role": "wizard", "content": "hi"}], [{"content": "hi"}]):
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="smol", messages=messages, max_tokens=2)
        assert "messages" in e.value.message


def test_the_server_answers_after_errors(client):
    out = client.completions.create(model="smol-alias", prompt="Hello", max_tokens=3)
    assert out.model == "smol-alias" and out.usage.completion_tokens >= 1


# ---- health, version, models ---------------------------------------------------------------------
def test_health_and_version(server):
    assert httpx.get(server.url + "/health").status_code == 200
    r = httpx.get(server.url + "/version")
    assert r.status_code == 200 and r.json()["version"] == fastdeploy.__version__


def test_models_lists_the_served_names(client):
    models = client.models.list()
    assert [m.id for m in models.data] == list(NAMES)
    assert all(m.object == "model" and m.model_extra["max_model_len"] == 512 for m in models.data)
    for name in NAMES:
        assert client.chat.completions.create(model=name, messages=MSGS, max_tokens=2).model == name


# ---- metrics -------------------------------------------------------------------------------------
def scrape(server) -> dict:
    """{(sample name, sorted labels): value} of GET /metrics."""
    r = httpx.get(server.url + "/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(r.text) for s in family.samples}


def value(metrics: dict, name: str, **labels) -> float:
    return metrics.get((name, tuple(sorted(labels.items()))), 0.0)


def test_metrics_names(server):
    metrics = scrape(server)
    names = {name for name, _ in metrics}
    assert set(METRICS) <= names, set(METRICS) - names


def test_token_counters_grow_by_the_reported_usage(client, server):
    before = scrape(server)
    chat = client.chat.completions.create(model="smol", messages=MSGS, n=2, temperature=1.0, seed=4, max_tokens=5)
    stream = client.completions.create(model="smol", prompt=["One", "Two three"], max_tokens=4, stream=True,
                                       stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    streamed = list(stream)[-1].usage
    after = scrape(server)

    def grew(name, **labels):
        return value(after, name, **labels) - value(before, name, **labels)

    assert grew("fastdeploy:generation_tokens_total") == chat.usage.completion_tokens + streamed.completion_tokens
    assert grew("fastdeploy:prompt_tokens_total") == chat.usage.prompt_tokens + streamed.prompt_tokens
    reasons = [c.finish_reason for c in chat.choices] + ["length", "length"]
    for reason in set(reasons):
        assert grew("fastdeploy:request_success_total", finished_reason=reason) == reasons.count(reason)
    for histogram in ("time_to_first_token_seconds", "e2e_request_latency_seconds", "request_queue_time_seconds"):
        assert grew(f"fastdeploy:{histogram}_count") == 3  # one per prompt
        assert grew(f"fastdeploy:{histogram}_sum") > 0


def test_prefix_cache_hit_rate(client, server):
    prompt = f"{uuid.uuid4().hex} " + "a list of words to fill a few cache blocks " * 12  # never seen before
    before = scrape(server)
    finished = value(before, "fastdeploy:e2e_request_latency_seconds_count")
    hits = value(before, "fastdeploy:hit_req_rate") * finished
    cold, warm = (client.completions.create(model="smol", prompt=prompt, max_tokens=1) for _ in range(2))
    assert cold.usage.prompt_tokens_details.cached_tokens == 0
    assert warm.usage.prompt_tokens_details.cached_tokens > 0
    after = scrape(server)
    assert value(after, "fastdeploy:e2e_request_latency_seconds_count") == finished + 2
    assert value(after, "fastdeploy:hit_req_rate") == pytest.approx((hits + 1) / (finished + 2))


def test_running_gauge_and_kv_usage_during_a_stream(client, server):
    stream = client.completions.create(model="smol", prompt="Count:", max_tokens=200, stream=True,
                                       extra_body={"ignore_eos": True})
    next(iter(stream))
    during = scrape(server)
    stream.close()  # the client leaves: the request is aborted
    assert value(during, "fastdeploy:num_requests_running") == 1
    assert 0 < value(during, "fastdeploy:gpu_cache_usage_perc") <= 1
