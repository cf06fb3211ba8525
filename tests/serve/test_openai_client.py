"""The official ``openai`` Python client against the server: completions and chat, whole and
streamed, and its errors."""

from __future__ import annotations

import pytest

from tests.requires import optional


@pytest.fixture
def openai_client(server):
    openai = optional("openai")
    return openai.OpenAI(base_url=server.url + "/v1", api_key="not-needed", max_retries=0)


def test_completions_whole_and_streamed(openai_client):
    c = openai_client.completions.create(model="chatty", prompt="KING:", max_tokens=16,
                                         temperature=0, logprobs=2)
    assert c.object == "text_completion" and c.usage.completion_tokens == 16
    (choice,) = c.choices
    assert choice.finish_reason == "length" and choice.text
    assert "".join(choice.logprobs.tokens) == choice.text
    assert all(len(top) == 2 for top in choice.logprobs.top_logprobs)
    parts = list(openai_client.completions.create(model="chatty", prompt="KING:",
                                                  max_tokens=16, temperature=0, stream=True))
    assert "".join(p.choices[0].text for p in parts) == choice.text
    assert parts[-1].choices[0].finish_reason == "length"


def test_chat_whole_and_streamed(openai_client):
    messages = [{"role": "user", "content": "the king"}]
    r = openai_client.chat.completions.create(model="chatty", messages=messages,
                                              temperature=0, max_tokens=20)
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == "ok" and r.choices[0].finish_reason == "stop"
    parts = list(openai_client.chat.completions.create(
        model="chatty", messages=messages, temperature=0, max_tokens=20, stream=True,
        stream_options={"include_usage": True}))
    text = "".join(p.choices[0].delta.content or "" for p in parts if p.choices)
    assert text == "ok" and parts[-1].usage.completion_tokens == r.usage.completion_tokens


def test_models_and_errors_raise_the_clients_exceptions(openai_client):
    openai = optional("openai")
    assert [m.id for m in openai_client.models.list()] == ["chatty"]
    with pytest.raises(openai.NotFoundError):
        openai_client.completions.create(model="gpt-4", prompt="a")
    with pytest.raises(openai.BadRequestError, match="temperature"):
        openai_client.completions.create(model="chatty", prompt="a", temperature=5)


def test_a_prompt_too_long_is_the_clients_bad_request_error(openai_client):
    """Client code written for OpenAI catches BadRequestError and reads the code; a 413 was
    raised as the generic APIStatusError, which such code misses."""
    openai = optional("openai")
    with pytest.raises(openai.BadRequestError) as caught:
        openai_client.chat.completions.create(
            model="chatty", messages=[{"role": "user", "content": "a" * 80}])
    assert caught.value.status_code == 400 and caught.value.code == "context_length_exceeded"
    assert caught.value.param == "messages"


def test_fields_the_client_sends_that_change_nothing_are_taken(openai_client):
    """store, metadata and service_tier were refused as unknown arguments."""
    r = openai_client.chat.completions.create(
        model="chatty", messages=[{"role": "user", "content": "the king"}], temperature=0,
        max_tokens=20, store=False, metadata={"app": "notes"}, service_tier="auto",
        safety_identifier="h-1", prompt_cache_key="k-1", user="u-1")
    assert r.choices[0].message.content == "ok"


def test_the_service_tier_asked_for_is_answered_with_the_one_that_served(openai_client):
    """OpenAI names the tier that served a request that gave one, in the response and in
    every chunk; the client read None."""
    messages = [{"role": "user", "content": "the king"}]
    r = openai_client.chat.completions.create(model="chatty", messages=messages,
                                              temperature=0, max_tokens=20,
                                              service_tier="auto")
    assert r.service_tier == "default" and r.choices[0].message.content == "ok"
    parts = list(openai_client.chat.completions.create(
        model="chatty", messages=messages, temperature=0, max_tokens=20, stream=True,
        service_tier="default"))
    assert len(parts) > 1 and {p.service_tier for p in parts} == {"default"}
    plain = openai_client.chat.completions.create(model="chatty", messages=messages,
                                                  temperature=0, max_tokens=20)
    assert plain.service_tier is None
