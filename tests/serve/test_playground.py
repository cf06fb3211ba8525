"""The playground in a real browser: headless Chromium (the system's, driven by Playwright)
loads ``/``, streams a completion, shows a token's alternatives on hover, draws an attention
heatmap and chats. Screenshots go to the test's tmp dir."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from tests.requires import optional

STATUS_LOG = """() => {
  window.statuses = [];
  new MutationObserver(() => window.statuses.push(document.getElementById("status").textContent))
    .observe(document.getElementById("status"), {childList: true, characterData: true,
                                                 subtree: true});
}"""
# how many pixels of the heatmap are neither white nor the grey of the hidden future
COLOURED_PIXELS = """() => {
  const c = document.getElementById("heatmap");
  const d = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
  let n = 0;
  for (let i = 0; i < d.length; i += 4) {
    const white = d[i] === 255 && d[i + 1] === 255 && d[i + 2] === 255;
    const grey = d[i] === 0xee && d[i + 1] === 0xf0 && d[i + 2] === 0xf4;
    if (!white && !grey) n++;
  }
  return n;
}"""


def chromium() -> str:
    path = os.environ.get("SCRATCHGPT_CHROMIUM") or shutil.which("chromium") or \
        shutil.which("chromium-browser")
    if not path:
        pytest.skip("no Chromium on this machine (Debian: apt-get install chromium; or set "
                    "$SCRATCHGPT_CHROMIUM to its executable)")
    return path


@pytest.fixture(scope="module")
def page(server):
    sync_api = optional("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium(), headless=True,
                                    args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1100, "height": 800})
        page.set_default_timeout(60_000)
        page.goto(server.url + "/")
        page.wait_for_function("document.getElementById('model-card').textContent"
                               ".startsWith('chatty')")
        yield page
        browser.close()


def test_a_prompt_streams_tokens_coloured_with_their_alternatives(page, client, tmp_path):
    expected = client.post("/v1/completions", json={
        "prompt": "KING:", "max_tokens": 40, "temperature": 0}).json()["choices"][0]["text"]
    page.fill("#prompt", "KING:")
    page.fill("#max-tokens", "40")
    page.fill("#temperature", "0")
    page.evaluate(STATUS_LOG)
    page.click("#generate")
    page.wait_for_function("document.getElementById('status').textContent.includes('finished')")
    shown = page.evaluate("[...document.querySelectorAll('#output .tok')]"
                          ".map((s) => s.tokenText).join('')")
    assert shown == expected  # the page shows the server's greedy text, token by token
    # the text arrived in pieces: the status counted tokens while they streamed
    assert any("tokens/s" in s for s in page.evaluate("window.statuses"))
    page.screenshot(path=tmp_path / "complete.png")

    page.hover("#output .tok >> nth=3")
    tip = page.locator("#tooltip")
    tip.wait_for(state="visible")
    assert tip.locator(".alt").count() == 5
    # greedy: the chosen token is the most likely alternative
    assert tip.locator(".alt").first.get_attribute("class") == "alt chosen"
    assert "%" in tip.inner_text()
    page.screenshot(path=tmp_path / "alternatives.png")


def test_the_attention_view_draws_a_heatmap(page, tmp_path):
    page.fill("#prompt", "ROMEO:\nThe king")
    page.fill("#max-tokens", "10")
    page.click("[data-tab=complete]")
    page.click("#generate")
    page.wait_for_function("document.getElementById('status').textContent.includes('finished')")
    page.click("[data-tab=attention]")
    assert page.locator("#layer option").count() == 3  # mean + 2 layers
    page.select_option("#layer", "1")
    page.select_option("#head", "0")
    page.click("#attention-show")
    page.wait_for_function(
        "document.getElementById('attention-status').textContent.includes('layer 1')")
    n = len("ROMEO:\nThe king") + 10
    assert page.get_attribute("#heatmap", "data-tokens") == str(n)
    assert page.evaluate(COLOURED_PIXELS) > 0
    page.locator("#heatmap").hover(position={"x": 75, "y": 150})
    assert "attention" in page.inner_text("#attention-cell") or \
        "cannot see" in page.inner_text("#attention-cell")
    page.screenshot(path=tmp_path / "attention.png")


def test_the_sampling_settings_show_on_the_tabs_that_sample_only(page):
    """The Attention tab samples nothing (it reads the Complete tab's text): the settings,
    which would change nothing there, are hidden, and come back on the other tabs."""
    for tab, shown in [("attention", False), ("complete", True), ("attention", False),
                       ("chat", True)]:
        page.click(f"[data-tab={tab}]")
        assert page.is_visible("#settings") is shown, tab
        assert page.is_visible("#temperature") is shown and page.is_visible("#top-k") is shown
    page.click("[data-tab=complete]")


def test_the_chat_tab_streams_the_reply(page, tmp_path):
    page.click("[data-tab=chat]")
    page.fill("#temperature", "0")
    page.fill("#max-tokens", "20")
    page.fill("#chat-message", "the king")
    page.click("#chat-send")
    reply = page.locator("#chat-log .msg.assistant").last
    page.wait_for_function("!document.getElementById('chat-send').disabled")
    assert reply.inner_text() == "ok"  # what the tiny model was trained to answer
    page.screenshot(path=tmp_path / "chat.png")


CONVERSATION = "JSON.stringify(messages)"


def test_a_failed_chat_request_leaves_the_conversation_as_it_was(page):
    """A message the server refuses (here one longer than the context: 400) is marked in the
    log but not kept: the next message is sent without it, and answered. It used to stay,
    with an empty reply after it, so every later request was refused too."""
    page.click("[data-tab=chat]")
    page.click("#chat-clear")
    page.fill("#temperature", "0")
    page.fill("#max-tokens", "20")
    page.fill("#chat-message", "the king " * 40)
    page.click("#chat-send")
    page.wait_for_function("!document.getElementById('chat-send').disabled")
    assert "at most" in page.inner_text("#chat-log .msg.assistant.error")
    assert page.evaluate(CONVERSATION) == "[]"
    page.fill("#chat-message", "the king")
    page.click("#chat-send")
    page.wait_for_function("!document.getElementById('chat-send').disabled")
    assert page.locator("#chat-log .msg.assistant").last.inner_text() == "ok"
    assert json.loads(page.evaluate(CONVERSATION)) == [
        {"role": "user", "content": "the king"}, {"role": "assistant", "content": "ok"}]


def test_new_chat_during_a_reply_starts_an_empty_conversation(page):
    """"New chat" pressed while a reply streams: the old exchange does not reach the new
    conversation (it used to land there when the reply ended)."""
    page.click("[data-tab=chat]")
    page.evaluate("() => { document.getElementById('chat-message').value = 'the king'; "
                  "sendChat(); document.getElementById('chat-clear').click(); }")
    page.wait_for_function("running.chat === null")
    assert page.evaluate(CONVERSATION) == "[]"
    assert page.inner_text("#chat-log") == ""


ASKED = [{"role": "user", "content": "the king"}]


@pytest.fixture(scope="module")
def long_run(server) -> dict:
    """Sampling settings (temperature 2, 4,000 tokens: seconds to stream) under which the chat
    reply to "the king" and the completion of "KING:" both run to the token limit, with the
    first such seed, and that reply: each must still stream while a test clicks its way
    through the other tab. Which seeds do depends on the CPU: the tiny model's bf16 training
    products round differently from one kind of CPU to another (seed 3 ran long on one and
    replied six characters on another)."""
    import httpx

    with httpx.Client(base_url=server.url, timeout=120) as c:
        for seed in range(40):
            settings = {"temperature": 2, "max_tokens": 4000, "seed": seed}
            reply = c.post("/v1/chat/completions",
                           json={**settings, "messages": ASKED}).json()["choices"][0]
            if reply["finish_reason"] != "length":
                continue
            text = c.post("/v1/completions", json={**settings, "prompt": "KING:"}).json()
            if text["choices"][0]["finish_reason"] == "length":
                return {"settings": settings, "reply": reply["message"]["content"]}
    pytest.fail("no seed below 40 gave both a chat reply and a completion of 4,000 tokens")


def long_settings(page, long_run: dict) -> None:
    for name, value in long_run["settings"].items():
        page.fill(f"#{name.replace('_', '-')}", str(value))


def requests_to(page, path: str) -> list[str]:
    """The URLs of the page's requests to ``path`` from now on (the list grows)."""
    seen: list[str] = []
    page.on("request", lambda r: seen.append(r.url) if r.url.endswith(path) else None)
    return seen


def enabled(page, selector: str) -> bool:
    return page.locator(selector).is_enabled()


def stop_chat(page) -> None:
    """Click the Chat tab's Stop, which a growing reply may be moving (Playwright waits for a
    still element), and wait for the reply to end."""
    assert page.locator("#chat-stop").is_visible() and enabled(page, "#chat-stop")
    page.locator("#chat-stop").dispatch_event("click")
    page.wait_for_function("running.chat === null")


def test_stop_keeps_the_partial_chat_reply_and_enables_send(page, long_run):
    """Stop in the Chat tab ends a streaming reply; what came so far stays in the
    conversation as the assistant's reply (as Ctrl-C in ``scratchgpt chat``), and Send works
    again. Only "New chat" could stop a reply before, losing the conversation."""
    full = long_run["reply"]  # long enough to stop part-way
    page.click("[data-tab=chat]")
    page.click("#chat-clear")
    long_settings(page, long_run)
    assert not enabled(page, "#chat-stop")
    page.fill("#chat-message", "the king")
    page.click("#chat-send")
    page.wait_for_function("document.querySelector('#chat-log .msg.assistant .tok')")
    assert enabled(page, "#chat-stop") and not enabled(page, "#chat-send")
    stop_chat(page)
    shown = page.evaluate("[...document.querySelectorAll('#chat-log .msg.assistant .tok')]"
                          ".map((s) => s.tokenText).join('')")
    assert 0 < len(shown) < len(full) and full.startswith(shown)
    assert json.loads(page.evaluate(CONVERSATION)) == [
        *ASKED, {"role": "assistant", "content": shown}]
    assert enabled(page, "#chat-send") and not enabled(page, "#chat-stop")


def start_long_completion(page, long_run: dict) -> None:
    """A completion in the Complete tab that streams for a while."""
    page.click("[data-tab=complete]")
    page.fill("#prompt", "KING:")
    long_settings(page, long_run)
    page.click("#generate")


def test_generate_again_while_generating_starts_nothing(page, long_run):
    """Generate, clicked or Ctrl+Enter pressed while a completion streams, starts no second
    stream into the same output (Ctrl+Enter did); Stop ends the one running."""
    completions = requests_to(page, "/v1/completions")
    start_long_completion(page, long_run)
    page.wait_for_function("document.getElementById('status').textContent.includes('/s')")
    page.click("#generate", force=True)  # disabled: the click does nothing
    page.press("#prompt", "Control+Enter")
    assert not enabled(page, "#generate") and enabled(page, "#stop-generating")
    page.click("#stop-generating")
    page.wait_for_function("!document.getElementById('generate').disabled")
    assert len(completions) == 1
    assert "stopped" in page.inner_text("#status") and not enabled(page, "#stop-generating")


def test_each_tab_runs_one_request_of_its_own(page, long_run):
    """Enter in the chat box while a reply streams sends nothing more; a completion streaming
    in the Complete tab neither blocks a chat message (it used to be dropped) nor is stopped
    by the Chat tab's Stop."""
    chats = requests_to(page, "/v1/chat/completions")
    start_long_completion(page, long_run)
    page.click("[data-tab=chat]")
    page.click("#chat-clear")
    page.fill("#chat-message", ASKED[0]["content"])
    page.click("#chat-send")
    page.wait_for_function("document.querySelector('#chat-log .msg.assistant .tok')")
    page.fill("#chat-message", "the queen")
    page.press("#chat-message", "Enter")
    assert len(chats) == 1
    assert page.input_value("#chat-message") == "the queen"  # kept for when Send is back
    stop_chat(page)
    assert page.evaluate("running.complete !== null")  # the completion streams on
    page.click("[data-tab=complete]")
    page.click("#stop-generating")
    page.wait_for_function("running.complete === null")


CUT_CHUNK = ('data: {"id": "c", "object": "text_completion", "created": 0, "model": "chatty", '
             '"choices": [{"index": 0, "text": "KING", "logprobs": null, '
             '"finish_reason": null}]}\n\n')


@pytest.mark.parametrize("answer, says", [
    # the server is gone (stopped): the page said the browser's "Failed to fetch"
    (lambda route: route.abort(), "cannot reach the server: is scratchgpt serve still running?"),
    # the stream ends without [DONE] (the server killed mid-stream): "finished (stopped)"
    (lambda route: route.fulfill(status=200, content_type="text/event-stream", body=CUT_CHUNK),
     "the connection to the server was lost before the text was finished"),
], ids=["server gone", "stream cut short"])
def test_a_server_out_of_reach_or_a_stream_cut_short_is_said_so(page, answer, says):
    page.click("[data-tab=complete]")
    page.fill("#prompt", "KING:")
    page.fill("#max-tokens", "20")
    page.route("**/v1/completions", answer)
    try:
        page.click("#generate")
        page.wait_for_function("running.complete === null")
    finally:
        page.unroute("**/v1/completions")
    assert page.inner_text("#status") == says
    assert "error" in page.get_attribute("#status", "class")


def test_a_server_that_wants_an_api_key_says_where_to_type_it(page, chat_run):
    """A page from a server started with --api-key says that it needs the key and where it
    goes, then that the key typed is not the server's, and works once it is: it said 'cannot
    reach the model: ... (Authorization: Bearer KEY)', of a server it had reached, in the
    words of an HTTP header."""
    from tests.serve.conftest import start_server

    with start_server(chat_run, api_key="sesame") as keyed:
        other = page.context.browser.new_page()
        try:
            other.goto(keyed.url + "/")
            card = "document.getElementById('model-card').textContent"
            other.wait_for_function(f"{card}.includes('API key')")
            assert other.inner_text("#model-card") == (
                "this server needs its API key (serve --api-key): type it in the box at the "
                "top right")
            for key, says in (("open", "the API key in the box at the top right is not this "
                                       "server's"), ("sesame", "chatty: ")):
                other.fill("#api-key", key)
                other.dispatch_event("#api-key", "change")
                other.wait_for_function(f"{card}.startsWith({json.dumps(says)})")
        finally:
            other.close()


def test_the_page_works_offline():
    """No CDN: the shipped files load nothing from another host."""
    optional("starlette")
    from scratchgpt.serve.app import static_files

    files = static_files()
    assert {"index.html", "playground.js", "playground.css"} <= set(files)
    for name, (content, _) in files.items():
        text = content.decode()
        assert "http://" not in text and "https://" not in text and '"//' not in text, name


def chat(page, message: str) -> None:
    page.fill("#chat-message", message)
    page.click("#chat-send")
    page.wait_for_function("running.chat === null")


def dropped_bubbles(page) -> list[str]:
    return page.evaluate("[...document.querySelectorAll('#chat-log .msg.dropped')]"
                         ".map((m) => m.textContent)")


def test_a_chat_longer_than_the_context_drops_its_oldest_turns(page, tmp_path):
    """A conversation that outgrows the model's context (64 tokens here: one earlier exchange
    of a short message fits, two do not) goes on, as in ``scratchgpt chat``: the server
    refuses it (400 context_length_exceeded), the page sends it again without its oldest
    exchange, and greys that in the log under a note. It used to end there: every later
    message was refused."""
    chats = requests_to(page, "/v1/chat/completions")
    page.click("[data-tab=chat]")
    page.click("#chat-clear")
    page.fill("#temperature", "0")
    page.fill("#max-tokens", "20")
    asked = ["I", "we", "a", "I"]
    for message in asked[:2]:
        chat(page, message)
    assert len(chats) == 2 and dropped_bubbles(page) == []  # both fit
    assert page.locator("#chat-log .note").count() == 0
    chat(page, asked[2])
    assert len(chats) == 4  # refused, then sent without the first exchange
    assert dropped_bubbles(page) == ["I", "ok"]
    chat(page, asked[3])
    assert len(chats) == 6
    assert page.locator("#chat-log .msg.assistant").last.inner_text() == "ok"
    assert dropped_bubbles(page) == ["I", "ok", "we", "ok"]
    assert page.locator("#chat-log .note").count() == 2
    assert "no longer fit" in page.locator("#chat-log .note").last.inner_text()
    kept = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "ok"},
            {"role": "user", "content": "I"}, {"role": "assistant", "content": "ok"}]
    assert json.loads(page.evaluate(CONVERSATION)) == kept
    page.screenshot(path=tmp_path / "chat-dropped.png")
    # a message too long alone: every earlier exchange is tried away, then the server's
    # error shows, and the conversation and its marks stay as they were
    chat(page, "the king " * 40)
    assert len(chats) == 9
    assert "at most" in page.inner_text("#chat-log .msg.assistant.error")
    assert json.loads(page.evaluate(CONVERSATION)) == kept
    assert dropped_bubbles(page) == ["I", "ok", "we", "ok"]


def test_dropping_turns_keeps_the_system_message_and_the_newest_message(page):
    roles = page.evaluate("""() => {
      const sent = [{role: "system", content: "s"}, {role: "user", content: "u"},
                    {role: "assistant", content: "a"}, {role: "user", content: "new"}];
      const dropped = [dropOldestTurn(sent), dropOldestTurn(sent)];
      return [dropped, sent.map((m) => m.content)];
    }""")
    assert roles == [[True, False], ["s", "new"]]


SETTINGS = {"max-tokens": "12", "temperature": "0", "top-p": "1", "top-k": "0", "seed": ""}


def setting_errors(page) -> str:
    box = page.locator("#settings-error")
    return box.inner_text() if box.is_visible() else ""


def marked(page) -> list[str]:
    return page.evaluate("[...document.querySelectorAll('#settings input.invalid')]"
                         ".map((i) => i.id)")


@pytest.mark.parametrize("field, name", [("max-tokens", "max tokens"),
                                         ("temperature", "temperature"), ("top-p", "top-p"),
                                         ("top-k", "top-k"), ("seed", "seed")])
def test_an_empty_or_invalid_number_field_is_named_and_nothing_is_sent(page, field, name):
    """Every number field alike: empty (but the seed's, which means random) or holding text
    that is no number, it is marked and named under the settings, and Generate and Send send
    nothing. An empty temperature was sent as 0 (greedy) and an empty max tokens as 16, in
    silence."""
    completions = requests_to(page, "/v1/completions")
    chats = requests_to(page, "/v1/chat/completions")
    for other, value in SETTINGS.items():
        page.fill(f"#{other}", value)
    assert setting_errors(page) == "" and marked(page) == []
    page.click("[data-tab=complete]")
    page.fill("#prompt", "KING:")
    page.fill(f"#{field}", "")
    if field == "seed":  # empty: a random seed, as its placeholder says
        assert setting_errors(page) == "" and marked(page) == []
    else:
        assert setting_errors(page) == f"{name} is empty: write " + page.evaluate(
            f"NUMBER_FIELDS.find((f) => f.id === '{field}').takes")
        assert marked(page) == [field]
    page.type(f"#{field}", "1e-")  # a number field takes the keys, but it is no number
    assert setting_errors(page).startswith(f"{name} is not a number: write ")
    assert marked(page) == [field]
    page.click("#generate")
    page.click("[data-tab=chat]")
    page.click("#chat-clear")
    page.fill("#chat-message", "the king")
    page.click("#chat-send")
    assert page.input_value("#chat-message") == "the king"  # kept, unsent
    page.press("#chat-message", "Enter")
    assert page.evaluate("running.complete === null && running.chat === null")
    assert completions == [] and chats == [] and page.inner_text("#chat-log") == ""
    page.fill(f"#{field}", SETTINGS[field])
    assert setting_errors(page) == "" and marked(page) == []
    page.click("#chat-send")
    page.wait_for_function("running.chat === null")
    assert len(chats) == 1 and page.input_value("#chat-message") == ""


@pytest.mark.parametrize("field, value", [("max-tokens", "0"), ("max-tokens", "2.5"),
                                          ("temperature", "2.5"), ("temperature", "-1"),
                                          ("top-p", "0"), ("top-p", "1.5"), ("top-k", "-1"),
                                          ("top-k", "1.5"), ("seed", "-1"), ("seed", "0.5")])
def test_a_number_out_of_a_fields_range_is_named(page, field, value):
    """A fractional top-k or seed was rounded, a top-p of 0 or above 1 dropped, in silence."""
    for other, v in SETTINGS.items():
        page.fill(f"#{other}", v)
    page.fill(f"#{field}", value)
    assert f"{value} is out of range: write" in setting_errors(page)
    assert marked(page) == [field]
    assert page.evaluate("settings()") is None
    page.fill(f"#{field}", SETTINGS[field])
    assert page.evaluate("settings()")["max_tokens"] == 12


def test_the_settings_errors_show_in_the_page(page, tmp_path):
    for other, v in SETTINGS.items():
        page.fill(f"#{other}", v)
    page.fill("#temperature", "")
    page.fill("#top-k", "2.5")
    assert marked(page) == ["temperature", "top-k"]
    assert page.locator("#settings-error").is_visible()
    page.screenshot(path=tmp_path / "settings-errors.png")
    for other, v in SETTINGS.items():
        page.fill(f"#{other}", v)
    assert setting_errors(page) == ""
