"""Pinned prefixes: each chat request runs from its prefix's saved state, computed once from an
empty slot; the server is scripted (what it is sent is what is checked)."""

import json
import threading
import urllib.request

import pytest

from pipeline.lm.prefix import PinnedPrefixes, PinningFront, UpstreamError, state_name
from tests.support import JSONServer

SYSTEM = {"role": "system", "content": "Answer in one word."}
DEMO = [{"role": "user", "content": "Capital of France?"}, {"role": "assistant", "content": "Paris"}]


class Server:
    """llama.cpp's routes as far as pinning uses them: a template that closes a turn only when
    another follows, slots whose saves write a file, and a chat reply naming what it was sent."""

    def __init__(self, folder):
        self.folder, self.sent = folder, []

    def __call__(self, route: str, body: dict) -> dict:
        self.sent.append((route, body))
        if route == "/apply-template":
            turns = [f"<{m['role']}>{m['content']}" for m in body["messages"]]
            return {"prompt": "</>".join(turns) + ("" if body["messages"][-1]["role"] == "assistant" else "</><assistant>")}
        if "action=save" in route:
            (self.folder / body["filename"]).write_bytes(b"state")
        if route == "/v1/chat/completions":
            return {"choices": [{"message": {"content": body["messages"][-1]["content"].upper()}}]}
        return {}

    def routes(self) -> list[str]:
        return [route for route, _ in self.sent]


def test_a_prefix_is_computed_once_from_an_empty_slot_then_restored_before_each_request(tmp_path):
    server = Server(tmp_path)
    pins = PinnedPrefixes(server, tmp_path, slots=1)
    first = [SYSTEM, *DEMO, {"role": "user", "content": "Capital of Italy?"}]
    assert pins.chat({"messages": first, "max_tokens": 8})["choices"][0]["message"]["content"] == "CAPITAL OF ITALY?"
    name = state_name(first[:-1])
    assert server.routes() == ["/apply-template", "/apply-template", "/slots/0?action=erase", "/completion",
                               "/slots/0?action=save", "/v1/chat/completions"]
    # the computed prefix is the text the prefix alone and the whole request share: the demo's
    # turn left open by the template alone, closed where the question follows
    assert server.sent[3][1] == {"prompt": "<system>Answer in one word.</><user>Capital of France?</><assistant>Paris", "n_predict": 0,
                                 "cache_prompt": True, "id_slot": 0}
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]  # saved aside, then renamed
    assert server.sent[-1][1] == {"messages": first, "max_tokens": 8, "id_slot": 0, "cache_prompt": True}
    server.sent.clear()
    pins.chat({"messages": [SYSTEM, *DEMO, {"role": "user", "content": "Capital of Spain?"}]})
    assert server.sent[0] == ("/slots/0?action=restore", {"filename": name}) and server.routes()[1:] == ["/v1/chat/completions"]
    server.sent.clear()
    pins.chat({"messages": [SYSTEM, {"role": "user", "content": "2 + 2?"}]})  # another step: its own prefix
    assert server.routes()[2:5] == ["/slots/0?action=erase", "/completion", "/slots/0?action=save"]
    assert server.sent[3][1]["prompt"] == "<system>Answer in one word.</><"  # as far as the two texts agree


def test_a_request_without_a_prefix_or_streamed_goes_as_it_came(tmp_path):
    server = Server(tmp_path)
    pins = PinnedPrefixes(server, tmp_path, slots=1)
    pins.chat({"messages": [{"role": "user", "content": "hi"}]})
    pins.chat({"messages": [SYSTEM, {"role": "user", "content": "hi"}], "stream": True})
    assert server.sent == [("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
                           ("/v1/chat/completions", {"messages": [SYSTEM, {"role": "user", "content": "hi"}], "stream": True})]


def test_a_state_the_server_cannot_restore_is_computed_again(tmp_path):
    server = Server(tmp_path)
    messages = [SYSTEM, {"role": "user", "content": "hi"}]
    (tmp_path / state_name(messages[:-1])).write_bytes(b"damaged")

    def refusing(route, body):
        if "action=restore" in route:
            raise UpstreamError(400, b'{"error": "failed to restore"}')
        return server(route, body)

    PinnedPrefixes(refusing, tmp_path, slots=1).chat({"messages": messages})
    assert server.routes() == ["/apply-template", "/apply-template", "/slots/0?action=erase", "/completion",
                               "/slots/0?action=save", "/v1/chat/completions"]


def test_requests_in_flight_at_once_each_hold_a_slot_of_their_own(tmp_path):
    release, inside, held = threading.Event(), threading.Barrier(3), []
    server = Server(tmp_path)

    def slow(route, body):
        if route == "/v1/chat/completions":
            held.append(body["id_slot"])
            inside.wait(timeout=10)
            release.wait(timeout=10)
        return server(route, body)

    pins = PinnedPrefixes(slow, tmp_path, slots=2)
    threads = [threading.Thread(target=pins.chat, args=({"messages": [SYSTEM, {"role": "user", "content": str(k)}]},)) for k in range(2)]
    for thread in threads:
        thread.start()
    inside.wait(timeout=10)  # both requests are in the server at once
    assert sorted(held) == [0, 1]
    release.set()
    for thread in threads:
        thread.join(timeout=10)


def test_the_front_answers_chat_requests_and_passes_the_servers_errors_on(tmp_path):
    server = Server(tmp_path)

    def answering(route, body):
        if route == "/v1/chat/completions" and body["messages"][-1]["content"] == "too long":
            raise UpstreamError(400, b'{"error": {"message": "the request exceeds the context"}}')
        return server(route, body)

    upstream = Upstream()
    front = PinningFront(PinnedPrefixes(answering, tmp_path, slots=1), upstream.address)
    try:
        def post(path, body):
            request = urllib.request.Request(front.address + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=10) as reply:
                return json.load(reply)

        reply = post("/v1/chat/completions", {"messages": [SYSTEM, {"role": "user", "content": "hi"}]})
        assert reply["choices"][0]["message"]["content"] == "HI"
        with pytest.raises(urllib.error.HTTPError) as refused:
            post("/v1/chat/completions", {"messages": [SYSTEM, {"role": "user", "content": "too long"}]})
        assert refused.value.code == 400 and b"exceeds the context" in refused.value.read()
        with urllib.request.urlopen(front.address + "/health", timeout=10) as reply:  # anything else is passed on
            assert json.load(reply) == {"status": "ok", "path": "/health"}
        with pytest.raises(urllib.error.HTTPError) as unknown:
            post("/v1/embeddings", {})
        assert unknown.value.code == 404 and json.loads(unknown.value.read()) == {"error": "no /v1/embeddings"}
    finally:
        front.close()
        upstream.close()


def Upstream() -> JSONServer:  # noqa: N802 - stands in for a class
    """A stand-in llama.cpp server for what the front passes on: /health, and 404 for the rest."""
    return JSONServer(lambda request, body: (200, {"status": "ok", "path": request.path}, {}) if request.path == "/health"
                      else (404, {"error": f"no {request.path}"}, {}))


def test_the_least_recently_used_states_go_first_beyond_the_kept_number(tmp_path, monkeypatch):
    import os

    from pipeline.lm import prefix

    monkeypatch.setattr(prefix, "KEPT_STATES", 2)
    pins = PinnedPrefixes(Server(tmp_path), tmp_path, slots=1)
    steps = [[{"role": "system", "content": f"step {k}"}, {"role": "user", "content": "q"}] for k in range(3)]
    for age, messages in enumerate(steps[:2]):
        pins.chat({"messages": messages})
        os.utime(tmp_path / state_name(messages[:-1]), ns=(age * 10**9, age * 10**9))
    pins.chat({"messages": steps[0]})  # restored: now the most recently used
    pins.chat({"messages": steps[2]})
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(state_name(m[:-1]) for m in (steps[0], steps[2]))


def test_a_reply_begun_for_the_model_is_not_part_of_the_fixed_part(tmp_path):
    from pipeline.lm.prefix import fixed_part

    begun = [SYSTEM, *DEMO, {"role": "user", "content": "Capital of Italy?"}, {"role": "assistant", "content": "[[ ## answer ## ]]"}]
    assert fixed_part(begun) == [SYSTEM, *DEMO] and fixed_part([{"role": "user", "content": "hi"}]) == []
    server = Server(tmp_path)
    PinnedPrefixes(server, tmp_path, slots=1).chat({"messages": begun})
    assert server.sent[0] == ("/apply-template", {"messages": [SYSTEM, *DEMO]})
