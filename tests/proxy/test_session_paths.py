"""Every path under ``/v1/pcp/sessions/{id}`` answers 404 for a session the caller does not have, never an empty 200."""

from __future__ import annotations

import pytest

from tests.proxy.hybrid_helpers import model

ONE, TWO = {"authorization": "Bearer sk-one"}, {"authorization": "Bearer sk-two"}
API = "/v1/pcp/sessions/chat-1"

# (method, path under the session, the status its owner gets, and the code of an error)
PATHS = [
    ("GET", "", 200, None),
    ("GET", "/tree", 200, None),
    ("GET", "/components", 200, None),
    ("DELETE", "/components/c-1", 404, "component_not_found"),
    ("GET", "/context", 200, None),
    ("GET", "/todo", 200, None),
]


@pytest.fixture
def hybrid(start_proxy):
    return start_proxy(hybrid="enabled", context_budget=4096)


@pytest.mark.parametrize("method, path, owners, code", PATHS, ids=[f"{m} {p or '/'}" for m, p, _, _ in PATHS])
def test_a_path_under_a_session_that_does_not_exist_is_a_404(hybrid, upstream, method, path, owners, code):
    never = hybrid.http.request(method, f"/v1/pcp/sessions/never-seen{path}", headers=ONE)
    assert never.status_code == 404, never.text
    assert never.json()["error"] == {
        "message": "no session 'never-seen' for this key",
        "type": "not_found_error",
        "param": "session_id",
        "code": "session_not_found",
    }
    upstream.enqueue(model("ok"))
    chat = hybrid.http.post(
        "/v1/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": "hello"}]},
        headers={**ONE, "x-pcp-session": "chat-1", "x-pcp-mode-request": "force"},
    )
    assert chat.status_code == 200 and chat.headers["x-pcp-session"] == "chat-1", chat.text
    own = hybrid.http.request(method, f"{API}{path}", headers=ONE)
    assert own.status_code == owners and (code is None or own.json()["error"]["code"] == code), own.text
    other = hybrid.http.request(method, f"{API}{path}", headers=TWO)  # another key's session of the same name
    assert other.status_code == 404 and other.json()["error"]["code"] == "session_not_found", other.text


def test_a_session_named_by_a_component_or_a_todo_list_before_its_first_request_exists(start_proxy):
    proxy = start_proxy(hybrid="enabled")
    assert proxy.http.post(f"{API}/components", json={"at": "d-1,1,0", "content": "be brief"}, headers=ONE).status_code == 201
    assert [node["content"] for node in proxy.http.get(f"{API}/components", headers=ONE).json()["data"]] == ["be brief"]
    assert proxy.http.get(f"{API}/tree", headers=ONE).status_code == 200
    assert proxy.http.put("/v1/pcp/sessions/build/todo", json={"items": [{"id": 1, "title": "plan"}]}, headers=ONE).status_code == 200
    assert proxy.http.get("/v1/pcp/sessions/build/todo", headers=ONE).json()["total"] == 1
    assert proxy.http.get("/v1/pcp/sessions/build/todo", headers=TWO).status_code == 404


def test_a_bad_id_is_still_a_400_and_a_bad_selector_too(start_proxy):
    proxy = start_proxy()
    assert proxy.http.get("/v1/pcp/sessions/bad%20id/tree", headers=ONE).json()["error"]["code"] == "invalid_session"
    refused = proxy.http.get("/v1/pcp/sessions/never-seen/components", params={"select": "d1-x,*,*"}, headers=ONE)
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "invalid_selector"
