"""Every /v1 path the proxy does not page is forwarded as it came: one base URL serves a whole app."""

from __future__ import annotations

import json
import socket
import threading

import openai
import pytest

from proxy.testing.upstream import Reply, completion, sse_chunks

MESSAGES = [{"role": "user", "content": "Say hi."}]


def _envelope(response) -> dict:
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


def test_embeddings_go_upstream_byte_for_byte(proxy, upstream):
    # Odd spacing, key order, a field no API defines, and a query string must all survive.
    body = b'{"input": ["a",  "b"], "model":"text-embedding-3-small","x_vendor":{"k":[1]}}'
    answer = b'{"object":"list","data":[],  "model":"e","vendor_extra":true}'
    upstream.enqueue(Reply(body=answer, headers={"content-type": "application/json", "x-request-id": "req-9", "x-ratelimit-remaining-requests": "99"}))

    response = proxy.http.post(
        "/v1/embeddings?api-version=2024-06-01&x=a%20b",
        content=body,
        headers={"content-type": "application/json", "authorization": "Bearer sk-client", "x-custom": "kept"},
    )

    sent = upstream.requests[-1]
    assert (sent.method, sent.path, sent.query, sent.body) == ("POST", "/v1/embeddings", "api-version=2024-06-01&x=a%20b", body)
    assert sent.headers["authorization"] == "Bearer sk-client" and sent.headers["x-custom"] == "kept"
    assert response.status_code == 200 and response.content == answer
    assert response.headers["x-request-id"] == "req-9" and response.headers["x-ratelimit-remaining-requests"] == "99"
    assert response.headers["x-pcp-mode"] == "passthrough"


def test_the_sdk_embeds_completes_and_answers_through_one_base_url(proxy, upstream):
    client = proxy.client()
    vectors = client.embeddings.create(model="text-embedding-3-small", input=["one", "two"])
    assert [len(v.embedding) for v in vectors.data] == [8, 8]

    upstream.enqueue(
        Reply(
            body=json.dumps(
                {
                    "id": "cmpl-1",
                    "object": "text_completion",
                    "created": 0,
                    "model": "m",
                    "choices": [{"index": 0, "text": "legacy", "finish_reason": "stop", "logprobs": None}],
                }
            ).encode()
        )
    )
    assert client.completions.create(model="m", prompt="Say").choices[0].text == "legacy"

    upstream.enqueue(
        Reply(
            body=json.dumps(
                {
                    "id": "resp_1",
                    "object": "response",
                    "created_at": 0,
                    "model": "m",
                    "status": "completed",
                    "output": [
                        {
                            "type": "message",
                            "id": "msg_1",
                            "role": "assistant",
                            "status": "completed",
                            "content": [{"type": "output_text", "text": "hi there", "annotations": []}],
                        }
                    ],
                }
            ).encode()
        )
    )
    assert client.responses.create(model="m", input="Say hi").output_text == "hi there"

    assert [r.path for r in upstream.requests] == ["/v1/embeddings", "/v1/completions", "/v1/responses"]


def test_langchain_embeddings_and_chat_share_the_proxy(proxy, upstream):
    langchain_openai = pytest.importorskip("langchain_openai")
    base = {"base_url": f"{proxy.url}/v1", "api_key": "sk-client", "http_client": proxy.http, "max_retries": 0}
    # Without the length check langchain sends the texts themselves; with it, it needs tiktoken's data from the network.
    embedder = langchain_openai.OpenAIEmbeddings(model="text-embedding-3-small", check_embedding_ctx_length=False, **base)
    chat = langchain_openai.ChatOpenAI(model="m", **base)

    vectors = embedder.embed_documents(["the allotment", "the seedlings"])
    upstream.enqueue(completion("Seedlings need water."))
    answer = chat.invoke("What do seedlings need?")

    assert len(vectors) == 2 and len(vectors[0]) == 8
    assert answer.content == "Seedlings need water."
    assert [r.path for r in upstream.requests] == ["/v1/embeddings", "/v1/chat/completions"]


def test_a_multipart_upload_arrives_as_it_was_sent(proxy, upstream):
    boundary = "----pcp-boundary-7"
    form = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nassistants\r\n'
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="notes.jsonl"\r\nContent-Type: application/octet-stream\r\n\r\n'
    ).encode()
    form += bytes(range(256)) * 40 + f"\r\n--{boundary}--\r\n".encode()  # fmt: skip
    upstream.enqueue(
        Reply(body=b'{"id":"file-1","object":"file","bytes":10240,"created_at":0,"filename":"notes.jsonl","purpose":"assistants","status":"processed"}')
    )

    response = proxy.http.post("/v1/files", content=form, headers={"content-type": f"multipart/form-data; boundary={boundary}"})

    assert response.status_code == 200 and response.json()["id"] == "file-1"
    assert upstream.requests[-1].body == form
    assert upstream.requests[-1].headers["content-type"] == f"multipart/form-data; boundary={boundary}"


def test_the_sdk_uploads_audio_and_files(proxy, upstream):
    client = proxy.client()
    upstream.enqueue(Reply(body=b'{"text":"hello from the audio"}'))
    transcript = client.audio.transcriptions.create(model="whisper-1", file=("clip.wav", b"RIFF" + bytes(2000), "audio/wav"))
    assert transcript.text == "hello from the audio"
    sent = upstream.requests[-1]
    assert sent.path == "/v1/audio/transcriptions" and sent.headers["content-type"].startswith("multipart/form-data")
    assert b"RIFF" + bytes(2000) in sent.body


def test_other_methods_and_stored_completions_are_forwarded(proxy, upstream):
    client = proxy.client()
    upstream.enqueue(Reply(body=b'{"id":"file-1","object":"file","deleted":true}'))
    assert client.files.delete("file-1").deleted
    upstream.enqueue(Reply(body=b'{"object":"list","data":[],"first_id":null,"last_id":null,"has_more":false}'))
    assert list(client.chat.completions.list(limit=2)) == []
    proxy.http.get("/v1/chat/completions/chatcmpl-1")

    calls = [(r.method, r.path, r.query) for r in upstream.requests]
    assert calls == [("DELETE", "/v1/files/file-1", ""), ("GET", "/v1/chat/completions", "limit=2"), ("GET", "/v1/chat/completions/chatcmpl-1", "")]


def test_a_head_request_is_forwarded_as_one(proxy, upstream):
    upstream.enqueue(Reply(body=b"", headers={"content-type": "application/json", "x-request-id": "req-head"}))
    response = proxy.http.head("/v1/models/gpt-4o")
    assert (response.status_code, response.headers["x-request-id"], response.content) == (200, "req-head", b"")
    sent = upstream.requests[-1]
    assert (sent.method, sent.path, sent.body) == ("HEAD", "/v1/models/gpt-4o", b"")


def test_an_empty_post_keeps_its_empty_body(proxy, upstream):
    upstream.enqueue(Reply(body=b'{"id":"batch_1","object":"batch","status":"cancelling"}'))
    proxy.http.post("/v1/batches/batch_1/cancel", content=b"")
    sent = upstream.requests[-1]
    assert (sent.method, sent.body, sent.headers.get("content-length")) == ("POST", b"", "0")


def test_a_forwarded_stream_is_relayed(proxy, upstream):
    events = [b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta","delta":"Hel","item_id":"m","output_index":0,"content_index":0,"sequence_number":1,"logprobs":[]}\n\n',
              b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta","delta":"lo","item_id":"m","output_index":0,"content_index":0,"sequence_number":2,"logprobs":[]}\n\n']  # fmt: skip
    upstream.enqueue(Reply(headers={"content-type": "text/event-stream"}, chunks=events))

    stream = proxy.client().responses.create(model="m", input="hi", stream=True)

    assert "".join(event.delta for event in stream if event.type == "response.output_text.delta") == "Hello"


def test_a_forwarded_stream_arrives_as_it_comes(start_proxy, upstream):
    proxy = start_proxy(sockets=True)
    gate = threading.Event()
    events = [
        f'data: {{"id":"c","object":"text_completion","created":0,"model":"m","choices":[{{"index":0,"text":"{t}","finish_reason":null,"logprobs":null}}]}}\n\n'.encode()
        for t in ("first", "second")
    ]
    upstream.enqueue(Reply(headers={"content-type": "text/event-stream"}, chunks=[events[0], gate, events[1], b"data: [DONE]\n\n"]))

    texts = []
    for chunk in proxy.client().completions.create(model="m", prompt="p", stream=True):
        if chunk.choices[0].text == "first":
            assert upstream.finished_streams == 0  # had the proxy buffered, the upstream would be done
            gate.set()
        texts.append(chunk.choices[0].text)

    assert texts == ["first", "second"] and upstream.finished_streams == 1


def test_a_large_download_arrives_whole(proxy, upstream):
    content = bytes(range(256)) * 8192  # 2 MiB: relayed as it comes, with its length
    upstream.enqueue(Reply(body=content, headers={"content-type": "application/octet-stream"}))
    response = proxy.http.get("/v1/files/file-1/content")
    assert response.content == content and response.headers["content-length"] == str(len(content))


def test_upstream_errors_keep_their_status_and_body(proxy, upstream):
    body = b'{"error":{"message":"Invalid URL (GET /v1/nope)","type":"invalid_request_error","param":null,"code":null}}'
    upstream.enqueue(Reply(status=404, body=body))
    response = proxy.http.get("/v1/nope")
    assert (response.status_code, response.content) == (404, body)


def test_proxy_keys_and_the_upstream_key_apply_to_every_path(start_proxy, upstream):
    proxy = start_proxy(api_keys=["pk-alpha"], upstream_api_key="sk-upstream")
    refused = proxy.http.post("/v1/embeddings", json={"model": "e", "input": "x"})
    assert refused.status_code == 401 and _envelope(refused)["code"] == "missing_api_key"
    assert upstream.requests == []
    with pytest.raises(openai.AuthenticationError):
        proxy.client(api_key="pk-wrong").embeddings.create(model="e", input="x")

    proxy.client(api_key="pk-alpha").embeddings.create(model="e", input="x")
    assert upstream.requests[-1].headers["authorization"] == "Bearer sk-upstream"


def test_the_proxys_own_failures_use_the_envelope(start_proxy):
    with socket.socket() as sock:  # a port nobody listens on once closed
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dead = start_proxy(upstream_base_url=f"http://127.0.0.1:{port}/v1")
    response = dead.http.post("/v1/embeddings", json={"model": "e", "input": "x"})
    assert response.status_code == 502 and _envelope(response)["code"] == "upstream_unreachable"
    with pytest.raises(openai.InternalServerError):
        dead.client().embeddings.create(model="e", input="x")


@pytest.mark.parametrize("path", ["/v1/pcp", "/v1/pcp/sessions/s-1/unknown", "/v1/pcp/memory/team/unknown"])
def test_pcp_paths_are_the_proxys_own_and_never_forwarded(proxy, upstream, path):
    for method in ("GET", "POST", "DELETE"):
        response = proxy.http.request(method, path)
        assert response.status_code == 404
        error = _envelope(response)
        assert error["type"] == "not_found_error" and "reserved" in error["message"]
    assert upstream.requests == []


@pytest.mark.parametrize(
    "path",
    [
        "/v1/models/%2e%2e/files",
        "/v1/models/..%2ffiles",
        "/v1/models/org/%2E%2E/%2E%2E/files",
        "/v1/models/a%2f%2e%2e%2f%2e%2e%2ffiles",
        "/v1/files/%2e%2e%5cadmin",
        "/v1/%2e%2e/admin",
    ],
)
def test_no_path_climbs_out_of_v1(proxy, upstream, path):
    """Forwarded as it was, ".." would reach any upstream path with the proxy's key."""
    response = proxy.http.get(path)
    assert response.status_code == 400 and _envelope(response)["param"] == "path"
    assert upstream.requests == []


def test_a_climbing_path_sent_raw_is_refused(start_proxy, upstream):
    proxy = start_proxy(sockets=True)  # httpx would resolve "..": the request line is written by hand
    host, port = proxy.url.removeprefix("http://").split(":")
    for target in (b"/v1/files/../../admin", b"/v1//evil.example/x", b"/v1/models/%2E%2e"):
        with socket.create_connection((host, int(port))) as conn:
            conn.sendall(b"GET " + target + b" HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            reply = b""
            while chunk := conn.recv(65536):
                reply += chunk
        assert reply.startswith(b"HTTP/1.1 400") or reply.startswith(b"HTTP/1.1 404"), (target, reply[:200])
    assert upstream.requests == []


@pytest.mark.parametrize("model", ["fake-model", "org/fake-model", "llama3:8b", "ft:gpt-4o:org::abc%2Fdef"])
def test_model_ids_are_forwarded_as_sent(proxy, upstream, model):
    proxy.http.get(f"/v1/models/{model}")
    assert upstream.requests[-1].path.endswith(model.replace("%2F", "/"))


def test_the_stream_of_a_chat_completion_below_the_threshold_is_unchanged(proxy, upstream):
    events = sse_chunks(["a", "b"])
    upstream.enqueue(Reply(headers={"content-type": "text/event-stream"}, chunks=events))
    response = proxy.http.post("/v1/chat/completions", json={"model": "m", "messages": MESSAGES, "stream": True})
    assert response.content == b"".join(events)
