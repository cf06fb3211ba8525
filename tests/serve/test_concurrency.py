"""Many clients at once: each request's greedy text is what it is alone, whenever it joins and
leaves the running batch; a short soak of good and bad requests leaves no 5xx and no rows."""

from __future__ import annotations

import asyncio
import random
import threading
import time

import pytest

from tests.requires import optional

# (prompt, max_tokens): short and long prompts (up to the context of 64 tokens); several
# outgrow the context while generating and slide
REQUESTS = [("ROMEO:\nThe king", 120), ("a", 90), ("KING:", 20), ("the night is long and", 150),
            ("QUEEN MARGARET:\nI will not " * 2, 60), ("O", 5), ("JULIET:\nMy lord, the", 200),
            ("and", 45)]


def complete(url: str, prompt: str, max_tokens: int, stream: bool) -> str:
    import httpx

    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    if not stream:
        return httpx.post(url + "/v1/completions", json=body, timeout=120).json()[
            "choices"][0]["text"]
    from tests.serve.test_api import events

    with httpx.stream("POST", url + "/v1/completions", json={**body, "stream": True},
                      timeout=120) as r:
        return "".join(c["choices"][0]["text"] for c in events(r))


def test_greedy_text_alone_equals_text_in_a_busy_batch(server):
    """Alone, a request decodes in the C step where this machine builds it; in a batch, in
    PyTorch: the same text either way."""
    from scratchgpt.models import native

    engine = server.service.engine
    assert isinstance(engine.batch.model, native.NativeGPT) == (native.load() is not None)
    alone = [complete(server.url, p, n, stream=False) for p, n in REQUESTS]
    busy, widest, done = {}, [0], threading.Event()

    def watch():
        while not done.is_set():
            widest[0] = max(widest[0], engine.batch_rows)
            time.sleep(0.002)

    def noise(i):  # sampled requests with several choices keep the batch full
        import httpx

        httpx.post(server.url + "/v1/completions", timeout=120, json={
            "prompt": "the", "max_tokens": 80, "temperature": 1.0, "n": 2, "seed": i})

    def client(i, prompt, n):
        time.sleep(0.03 * i)  # arrive one after another: each joins a running batch
        busy[i] = complete(server.url, prompt, n, stream=bool(i % 2))

    threads = [threading.Thread(target=watch)]
    threads += [threading.Thread(target=noise, args=(i,)) for i in range(3)]
    threads += [threading.Thread(target=client, args=(i, p, n))
                for i, (p, n) in enumerate(REQUESTS)]
    for t in threads:
        t.start()
    for t in threads[1:]:
        t.join()
    done.set()
    threads[0].join()
    assert [busy[i] for i in range(len(REQUESTS))] == alone
    assert widest[0] >= 4
    assert (engine.batch_rows, engine.queue_depth) == (0, 0)


def test_a_short_soak_gets_no_5xx_and_leaves_no_rows(server):
    optional("httpx")
    from scratchgpt.serve.loadtest import KINDS, SoakSetup, soak

    limits = server.service.limits
    setup = SoakSetup(["the", "king", "night", "love", "a"], limits.max_prompt_tokens,
                      limits.max_body_bytes, chat=True)
    report = asyncio.run(soak(server.url, 150, 24, setup, seed=random.randrange(1000)))
    assert report.requests == 150 and report.server_errors == 0
    assert report.unexpected == []
    assert set(report.by_kind) == set(KINDS)  # every kind of request was sent
    engine = server.service.engine
    deadline = time.monotonic() + 10
    while (engine.batch_rows, engine.queue_depth) != (0, 0) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (engine.batch_rows, engine.queue_depth) == (0, 0)


@pytest.mark.parametrize("kind", ["bigram", "lstm"])
def test_other_models_serve_too(tmp_path, kind):
    """Their caches implement the same joining interface: concurrent greedy requests get what
    they get alone."""
    import httpx
    import torch

    from scratchgpt.checkpoints import Checkpoint, save_checkpoint
    from scratchgpt.models import build_model, model_config
    from scratchgpt.tokenizers.char import CharTokenizer
    from tests.serve.conftest import start_server

    tok = CharTokenizer(list("abcdefgh ."))
    extra = {"hidden": 16, "n_layer": 1} if kind == "lstm" else {}
    cfg = model_config(kind, vocab_size=tok.vocab_size, **extra)
    torch.manual_seed(0)
    model = build_model(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(4.0)
    save_checkpoint(tmp_path / "best.pt", Checkpoint(kind, cfg, model.state_dict(),
                                                     {"text": tok.state()}))
    with start_server(tmp_path) as s:
        card = httpx.get(s.url + "/v1/models").json()["data"][0]
        assert card["model_type"] == kind and card["attention"] is False
        r = httpx.post(s.url + "/api/attention", json={"text": "ab"})
        assert r.status_code == 400  # (with the article its name is spoken with: 'a lstm')
        assert r.json()["error"]["message"] == \
            f"{'a bigram' if kind == 'bigram' else 'an lstm'} model has no attention to show"
        prompts = ["abc", "h", "badge ca", "."]
        alone = [complete(s.url, p, 30, stream=False) for p in prompts]
        out = {}
        threads = [threading.Thread(target=lambda i=i, p=p: out.update(
            {i: complete(s.url, p, 30, stream=bool(i % 2))})) for i, p in enumerate(prompts)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert [out[i] for i in range(len(prompts))] == alone
