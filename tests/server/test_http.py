"""The HTTP surface: HTTPS, HEAD, the Bearer scheme and a non-ASCII key, no docs UI, metrics before traffic."""
from __future__ import annotations

import http.client
import json

import pytest
from server_harness import running_server, self_signed_cert

from jido.server.config import ServerConfig

pytestmark = pytest.mark.slow

KEY = "clé-ключ-🔑"
AUTH = {"Authorization": b"Bearer " + KEY.encode()}
REFUSED = {"error": {"message": "missing or invalid API key: send 'Authorization: Bearer <key>'",
                     "type": "authentication_error", "param": None, "code": "invalid_api_key"}}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    key, cert = self_signed_cert(tmp_path_factory.mktemp("tls"))
    # No test here generates, so the server stays as fresh as it started.
    with running_server(ServerConfig(api_key=KEY, ssl_keyfile=key, ssl_certfile=cert)) as server:
        yield server


def test_fresh_server_exports_gauges_and_success_counters_at_zero(server):
    samples = server.metrics(AUTH).samples
    labels = {"model_name": "gemma-3-270m"}
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"):
        assert samples[name] == [(labels, 0.0)], name
    assert samples["vllm:request_success_total"] == [
        ({**labels, "finished_reason": reason}, 0.0) for reason in ("stop", "length", "abort")]


def test_serves_https_with_the_given_certificate_and_refuses_plain_http(server):
    assert server.base_url.startswith("https://")
    status, _, raw = server.request("GET", "/health")  # the client verifies the certificate
    assert (status, json.loads(raw)) == (200, {"status": "ok"})
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    with pytest.raises(ConnectionError):
        connection.request("GET", "/health")
        connection.getresponse()
    connection.close()


@pytest.mark.parametrize("path, headers", [("/health", {}), ("/v1/models", AUTH), ("/metrics", AUTH)])
def test_head_answers_like_get_without_a_body(server, path, headers):
    get_status, get_headers, get_body = server.request("GET", path, headers=headers)
    status, head_headers, body = server.request("HEAD", path, headers=headers)
    assert (status, body) == (get_status, b"") == (200, b"")
    assert head_headers["content-type"] == get_headers["content-type"]
    if path != "/metrics":  # its text may change between the two requests
        assert head_headers["content-length"] == get_headers["content-length"] == str(len(get_body))


def test_head_without_the_key_gets_401_headers_and_no_body(server):
    status, headers, body = server.request("HEAD", "/v1/models")
    assert (status, headers["www-authenticate"], body) == (401, "Bearer", b"")


@pytest.mark.parametrize("authorization", [b"Bearer " + KEY.encode(), b"bearer " + KEY.encode(),
                                           b"BEARER " + KEY.encode(), b"Bearer  " + KEY.encode()])
def test_bearer_scheme_in_any_case_with_the_utf8_key_is_accepted(server, authorization):
    status, _, raw = server.request("GET", "/v1/models", headers={"Authorization": authorization})
    assert status == 200
    assert [model["id"] for model in json.loads(raw)["data"]] == ["gemma-3-270m"]


MOJIBAKE = KEY.encode().decode("latin-1").encode()  # the key's UTF-8 read as Latin-1, then sent as UTF-8


@pytest.mark.parametrize("authorization", [None, b"", b"Bearer", KEY.encode(), b"Basic " + KEY.encode(),
                                           b"Bearer " + MOJIBAKE, b"Bearer " + KEY.encode() + b"x",
                                           b"Bearer cl\xe9-"])
def test_anything_but_the_bearer_key_gets_401_with_www_authenticate(server, authorization):
    headers = {} if authorization is None else {"Authorization": authorization}
    status, response_headers, raw = server.request("GET", "/v1/models", headers=headers)
    assert (status, response_headers["www-authenticate"], json.loads(raw)) == (401, "Bearer", REFUSED)


@pytest.mark.parametrize("path", ["/docs", "/redoc", "/openapi.json", "/docs/oauth2-redirect"])
def test_docs_ui_and_openapi_schema_are_not_served(server, path):
    status, _, raw = server.request("GET", path, headers=AUTH)
    assert (status, json.loads(raw)["error"]["message"]) == (404, f"GET {path}: Not Found")
