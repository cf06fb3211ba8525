"""``scratchgpt serve`` as a user runs it: clear one-line errors, int8 weights, and a graceful
stop on SIGTERM while a stream is running."""

from __future__ import annotations

import argparse
import json
import signal
import socket
import subprocess
import sys
import time

import pytest

from scratchgpt.cli import main
from scratchgpt.serve.protocol import Limits
from tests.cli_errors import error_of
from tests.requires import optional


def test_help_explains_the_safety_defaults(capsys):
    with pytest.raises(SystemExit) as e:
        main(["serve", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "127.0.0.1" in out and "--api-key" in out and "/v1/completions" in out


@pytest.mark.parametrize("argv, says", [
    (["--host", "0.0.0.0"], "--api-key"),
    (["--max-batch", "0"], "--max-batch"),
    (["--port", "70000"], "--port"),
    (["--timeout", "-1"], "--timeout"),
    (["--timeout", "nan"], "--timeout"),  # never timed out: a NaN deadline is never reached
    (["--timeout", "inf"], "--timeout"),  # /api/limits could not write it as JSON: a 500
    (["--threads", "-2"], "--threads"),
    (["--api-key", ""], "--api-key"),  # served, every API route refusing every client
    (["--model-name", ""], "--model-name"),  # the run's name was served instead
])
def test_bad_flags_are_one_line_errors(capsys, monkeypatch, plain_run, argv, says):
    optional("starlette")
    monkeypatch.setattr("scratchgpt.serve.server._uvicorn_server",
                        lambda *a, **k: pytest.fail(f"served with {argv}"))
    assert says in error_of(capsys, ["serve", "--checkpoint", str(plain_run), *argv])


def test_a_max_batch_whose_kv_caches_cannot_fit_is_refused_naming_what_fits(capsys,
                                                                             monkeypatch,
                                                                             plain_run):
    """The tiny GPT's KV cache is 2 (keys, values) x 2 layers x 64 positions x 64 wide fp32
    numbers a row: 64 KiB. With 1 MiB available, 16 rows fit and 17 are refused, in one
    line that names the figures and the limit; nothing is served or left listening."""
    optional("starlette")
    from scratchgpt import memory

    monkeypatch.setenv(memory.MEMORY_LIMIT_ENV, "1MiB")
    monkeypatch.setattr("scratchgpt.serve.server._uvicorn_server",
                        lambda *a, **k: pytest.fail("served a batch that cannot fit"))
    says = error_of(capsys, ["serve", "--checkpoint", str(plain_run), "--port", "0",
                             "--max-batch", "17"])
    assert "--max-batch 17, a batch of 17 sequences of 64 tokens, needs about 1.1 MiB (kv " \
        "cache 1.1), more than the 1.0 MiB of memory available; lower --max-batch (at most " \
        "16 fit)" in says
    served = []
    monkeypatch.setattr("scratchgpt.serve.server._uvicorn_server",
                        lambda service, *a, **k: served.append(service) or
                        argparse.Namespace(run=lambda sockets: None))
    for argv in (["--max-batch", "16"], ["--max-batch", "32", "--dtype", "bf16"]):
        assert main(["serve", "--checkpoint", str(plain_run), "--port", "0", *argv]) == 0
    assert [s.engine.max_rows for s in served] == [16, 32]  # bf16 keeps half the cache


def test_a_recurrent_models_batch_is_not_counted_over_a_context_it_lacks():
    """A recurrent model keeps one state a row, whatever its length: its refusal names no
    context (its config's block_size is the training window), and a row costs its state."""
    from scratchgpt.errors import ConfigError
    from scratchgpt.serve.server import check_batch_memory
    from tests.generation.test_decode import MODELS

    config = MODELS["lstm"].config
    with pytest.raises(ConfigError) as e:
        check_batch_memory(config, 10**15, available=2**30)
    assert "a batch of 1,000,000,000,000,000 sequences, needs" in str(e.value)
    assert "tokens" not in str(e.value)


def test_help_names_the_limit_of_max_batch(capsys):
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    assert "fit in the memory available" in " ".join(capsys.readouterr().out.split())


def test_an_empty_api_key_in_the_environment_is_refused(capsys, monkeypatch, plain_run):
    optional("starlette")
    monkeypatch.setenv("SCRATCHGPT_API_KEY", "")
    monkeypatch.setattr("scratchgpt.serve.server._uvicorn_server",
                        lambda *a, **k: pytest.fail("served with an empty key"))
    assert "SCRATCHGPT_API_KEY" in error_of(capsys, ["serve", "--checkpoint", str(plain_run)])


@pytest.mark.parametrize("typed", [".", "best.pt", "./", "../shakes", "runs/shakes",
                                   "runs/shakes/best.pt", "hf:openai-community/gpt2"])
def test_the_model_id_is_the_run_directorys_name_however_the_run_is_named(tmp_path,
                                                                        monkeypatch, typed):
    """Served from inside its run directory (``--checkpoint .`` or ``best.pt``), a run is
    still named by its directory, as README says: it was "model", so a client that sent the
    run's name was answered 404."""
    from scratchgpt.serve.server import model_id

    run = tmp_path / "runs" / "shakes"
    run.mkdir(parents=True)
    monkeypatch.chdir(tmp_path if typed.startswith("runs/") else run)
    assert model_id(typed) == ("openai-community/gpt2" if typed.startswith("hf:")
                               else "shakes")


def test_a_missing_checkpoint_is_a_one_line_error(capsys, tmp_path):
    optional("starlette")
    assert str(tmp_path / "nothing") in error_of(
        capsys, ["serve", "--checkpoint", str(tmp_path / "nothing"), "--port", "0"])


def test_a_classifier_is_refused_in_one_line(capsys, tmp_path):
    """A classifier continues no text: it was an AttributeError traceback ('vocab_size')."""
    optional("starlette")
    from scratchgpt.checkpoints import Checkpoint, save_checkpoint
    from scratchgpt.models import build_model
    from scratchgpt.models.classifier import GPTClassifierConfig
    from scratchgpt.models.gpt import GPTConfig
    from scratchgpt.tokenizers import CharTokenizer

    CharTokenizer(list("abc \n")).save(tmp_path)
    cfg = GPTClassifierConfig(GPTConfig(vocab_size=5, block_size=8, n_layer=1, n_head=1,
                                        n_embd=8), 2)
    save_checkpoint(tmp_path / "cls.pt", Checkpoint("gpt-classifier", cfg,
                                                    build_model(cfg).state_dict()))
    assert "scratchgpt classify" in error_of(
        capsys, ["serve", "--checkpoint", str(tmp_path / "cls.pt"), "--port", "0"])


def test_int8_serves_and_sigterm_finishes_the_running_stream(plain_run):
    """The child serves int8 weights; SIGTERM mid-stream lets the stream end properly (its
    ``[DONE]`` arrives) and the process ends cleanly."""
    httpx = optional("httpx")
    optional("uvicorn")
    from scratchgpt.bench.serve import ServerProcess

    args = argparse.Namespace(dtype="int8", threads=1, clients=1, soak_clients=1)
    with ServerProcess(str(plain_run), args) as server:
        card = httpx.get(server.url + "/v1/models").json()["data"][0]
        assert card["dtype"] == "int8"
        # the prompt limit, lowered from its default to the model's context, is announced
        assert any(f"prompts of up to {card['context_length']} tokens (the model's context)"
                   in line for line in server.log), server.log
        body = {"prompt": "KING:", "max_tokens": 400, "temperature": 0, "stream": True}
        with httpx.stream("POST", server.url + "/v1/completions", json=body,
                          timeout=60) as r:
            lines = r.iter_lines()
            first = next(line for line in lines if line.startswith("data: "))
            assert '"text_completion"' in first
            server.proc.send_signal(signal.SIGTERM)
            rest = [line for line in lines if line.startswith("data: ")]
        assert rest[-1] == "data: [DONE]"
        # uvicorn re-raises the signal once it has shut down; the CLI then ends as every
        # command does on SIGTERM: one line and exit code 143
        assert server.proc.wait(30) == 143
        assert "Traceback" not in "".join(server.log)


def _as_at_a_terminal() -> None:
    """In the child: Ctrl-C raises KeyboardInterrupt, as at a terminal (a background job
    started from a shell ignores SIGINT, and a child inherits that)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_a_second_ctrl_c_ends_the_running_stream_at_once_and_cleanly(plain_run):
    """The first Ctrl-C gives running requests their grace; a second one (the user in a
    hurry, as uvicorn's 'CTRL+C to force quit' invites) ends them now, as a stopping server
    does: the stream gets its error event and [DONE]. It was uvicorn's force quit: every
    stream cut mid-chunk and a traceback for each request in the log."""
    httpx = optional("httpx")
    optional("uvicorn")
    from scratchgpt.bench.serve import ServerProcess

    args = argparse.Namespace(dtype="fp32", threads=1, clients=16, soak_clients=1)
    popen = subprocess.Popen
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(subprocess, "Popen",
                   lambda *a, **k: popen(*a, **k, preexec_fn=_as_at_a_terminal))
        server = ServerProcess(str(plain_run), args).__enter__()
    try:
        body = {"prompt": "KING:", "max_tokens": 4096, "n": 16, "stream": True}
        with httpx.stream("POST", server.url + "/v1/completions", json=body,
                          timeout=60) as r:
            lines = r.iter_lines()
            next(line for line in lines if '"text_completion"' in line)
            server.proc.send_signal(signal.SIGINT)
            time.sleep(0.5)
            server.proc.send_signal(signal.SIGINT)
            rest = [line for line in lines if line.startswith("data: ")]
        assert rest[-1] == "data: [DONE]"
        # still generating when it stopped: it ends as a request to a stopping server does
        assert "shutting down" in json.loads(rest[-2][len("data: "):])["error"]["message"]
        assert server.proc.wait(30) == 130
        assert "Traceback" not in "".join(server.log), "".join(server.log)
    finally:
        server.__exit__(None, None, None)


def test_the_serve_extra_is_named_when_missing(monkeypatch, capsys, plain_run):
    monkeypatch.setitem(sys.modules, "uvicorn", None)  # import uvicorn -> ImportError
    assert "pip install 'scratchgpt[serve]'" in error_of(
        capsys, ["serve", "--checkpoint", str(plain_run)])


def test_python_dash_m_runs_the_command():
    out = subprocess.run([sys.executable, "-m", "scratchgpt", "serve", "--help"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "--max-queue" in out.stdout


def test_bench_serve_measures_both_phases(capsys, plain_run):
    """A small run of the bench against a child server: every request of both phases is
    answered with all its tokens."""
    optional("httpx")
    optional("uvicorn")
    import json

    assert main(["bench", "serve", "--checkpoint", str(plain_run), "--clients", "3",
                 "--requests", "6", "--max-tokens", "8", "--prompt-tokens", "5",
                 "--json"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for phase, clients in (("one_at_a_time", 1), ("concurrent", 3)):
        r = result[phase]
        assert (r["clients"], r["requests"], r["tokens"]) == (clients, 6, 48), r
        assert r["ttft_p50_s"] <= r["ttft_p99_s"]
    assert result["speedup"] > 0


def test_bench_serve_url_names_the_model_the_server_serves(capsys, plain_run):
    """With --url the report names the running server's model and dtype, not the random
    model --shape would have started."""
    import json

    from tests.serve.conftest import start_server

    with start_server(plain_run) as server:
        assert main(["bench", "serve", "--url", server.url, "--clients", "2", "--requests",
                     "2", "--max-tokens", "4", "--prompt-tokens", "3", "--json",
                     "--no-sequential"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["model"].startswith("plain ") and "random" not in result["model"]
    assert result["dtype"] == "fp32"


def test_bench_serve_url_takes_the_api_address_and_names_what_answered(capsys, plain_run):
    """The API's address, which the server prints and OpenAI clients take, was a KeyError
    traceback ('data'): its /v1/v1/models is a 404. So was a server that wants an API key,
    which is named as such."""
    import json

    from tests.serve.conftest import start_server

    bench = ["bench", "serve", "--clients", "1", "--requests", "1", "--max-tokens", "2",
             "--prompt-tokens", "2", "--json", "--no-sequential"]
    with start_server(plain_run) as server:
        assert main([*bench, "--url", server.url + "/v1/"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["concurrent"]
    with start_server(plain_run, api_key="k") as server:
        says = error_of(capsys, [*bench, "--url", server.url])
    assert "GET /v1/models answered 401" in says and server.url in says
    # it named the right address, not the key it lacked: "give the address 'scratchgpt
    # serve' prints"
    assert "wants an API key" in says and "give the address" not in says


def test_bench_serve_url_of_another_openai_server_is_one_line(capsys):
    """Another OpenAI-compatible server lists its models but has no /api/limits, which the
    bench reads: that was a KeyError traceback ('max_prompt_tokens')."""
    import http.server
    import threading

    class OtherServer(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            found = self.path == "/v1/models"
            body = (json.dumps({"object": "list", "data": [{"id": "other"}]}) if found
                    else '{"detail": "Not Found"}').encode()
            self.send_response(200 if found else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), OtherServer)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{httpd.server_address[1]}"
        says = error_of(capsys, ["bench", "serve", "--url", url, "--requests", "1"])
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert "GET /api/limits answered 404" in says


def test_bench_serve_engine_only_runs_every_request_to_its_length(capsys, plain_run):
    import json

    assert main(["bench", "serve", "--checkpoint", str(plain_run), "--clients", "3",
                 "--requests", "5", "--max-tokens", "7", "--prompt-tokens", "4",
                 "--engine-only", "--json"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["tokens"] == [35, 35] and result["clients"] == 3
    assert result["engine_speedup"] == pytest.approx(
        result["engine_concurrent_tokens_per_s"] / result["engine_one_at_a_time_tokens_per_s"],
        abs=0.01)


@pytest.mark.parametrize("argv, says", [
    (["--engine-only", "--soak"], "--engine-only"),
    (["--clients", "0"], "--clients"),
    (["--soak-clients", "100000"], "--soak-clients"),
    (["--max-tokens", "0"], "--max-tokens"),
    # more than the server it starts takes, or than could finish: they ran for ever
    (["--max-tokens", str(10**30)], f"--max-tokens must be in [1, {Limits().max_tokens}]"),
    (["--engine-only", "--prompt-tokens", str(10**30)], "--prompt-tokens must be in [1, "),
    (["--requests", str(10**30)], "--requests must be in [1, "),
    (["--url", "http://example.com:8000"], "--url"),
    # NaN passed '<= 0': no request was sent, and the report was 0 tokens/s and nan times
    (["--time-limit", "nan"], "--time-limit must be > 0 seconds, got nan"),
    (["--time-limit", "0"], "--time-limit must be > 0 seconds, got 0.0"),
])
def test_bench_serve_bad_flags_are_one_line_errors(capsys, argv, says):
    assert says in error_of(capsys, ["bench", "serve", *argv])


def test_bench_serve_report_counts_one_client_as_one(capsys):
    """--clients 1 was reported as '1 clients', in the table and the speedup line."""
    from scratchgpt.bench.serve import print_throughput

    row = {"tokens_per_s": 10.0, "ttft_p50_s": 0.1, "ttft_p99_s": 0.2, "itl_p50_s": 0.01,
           "itl_p99_s": 0.02, "requests": 2, "tokens": 8}
    for n in (1, 3):
        print_throughput({"one_at_a_time": {**row, "clients": 1},
                          "concurrent": {**row, "clients": n}, "speedup": 1.0})
        lines = capsys.readouterr().out.splitlines()
        label = "1 client" if n == 1 else f"{n} clients"
        assert [line[:16].strip() for line in lines[1:3]] == ["1 client", label]
        assert lines[3].startswith(f"aggregate tokens/s, {label} vs one at a time")


def test_bench_serve_soak_at_a_url_says_its_memory_is_not_measured(capsys):
    """The soak of a --url server printed 'memory 0.0 MB -> 0.0 MB (xNone)', figures it
    never measured."""
    from scratchgpt.bench.serve import print_soak

    result = {"requests": 4, "clients": 2, "seconds": 1.0, "statuses": {}, "server_errors": 0,
              "unexpected": [], "queue_depth_after": 0, "batch_rows_after": 0,
              "rss_before_mb": None, "rss_after_mb": None, "rss_ratio": None, "passed": True}
    print_soak(result)
    after = capsys.readouterr().out.splitlines()[-2]
    assert after.endswith("memory not measured (only that of a server the bench starts is "
                          "read)") and "MB" not in after
    print_soak({**result, "rss_before_mb": 100.0, "rss_after_mb": 105.0, "rss_ratio": 1.05})
    assert capsys.readouterr().out.splitlines()[-2].endswith(
        "memory 100.0 MB -> 105.0 MB (x1.05)")


def test_bench_serve_gives_no_figures_for_a_phase_that_sent_no_request():
    """A --time-limit up before the first request was sent printed a row of 0 tokens/s and
    nan for every time, as if measured."""
    from collections import Counter

    from scratchgpt.bench.serve import answered
    from scratchgpt.errors import GenerationError
    from scratchgpt.serve.loadtest import LoadResult

    with pytest.raises(GenerationError, match="no request was sent before the --time-limit"):
        answered(LoadResult(4, 0, 0.001, 0, [], [], Counter()))
    sent = answered(LoadResult(1, 1, 0.5, 8, [0.1], [0.05] * 7, Counter({200: 1})))
    assert sent["requests"] == 1 and sent["tokens_per_s"] == 16.0


def test_bench_serve_says_why_the_server_did_not_start(capsys, tmp_path):
    optional("uvicorn")
    assert "did not start" in error_of(capsys, ["bench", "serve", "--checkpoint",
                                                str(tmp_path / "nothing")])


def test_bench_serve_stopped_while_its_server_starts_leaves_no_server(monkeypatch):
    """Ctrl-C (or SIGTERM) once the child server printed its address but before it answered
    /health left that server running, serving a port no one knew, after the bench ended."""
    import argparse

    from scratchgpt.bench import serve as bench_serve

    def interrupted(url: str) -> dict:
        raise KeyboardInterrupt

    monkeypatch.setattr(bench_serve, "wait_healthy", interrupted)
    server = bench_serve.ServerProcess("run", argparse.Namespace(
        dtype="fp32", threads=0, clients=1, soak_clients=1))
    server.cmd = [sys.executable, "-c", "import time; print('serving m on "
                  "http://127.0.0.1:1', flush=True); time.sleep(600)"]
    try:
        with pytest.raises(KeyboardInterrupt), server:
            pass
        assert server.proc.poll() is not None  # ended, not left running
    finally:
        if server.proc.poll() is None:
            server.proc.kill()


def test_bench_serve_url_with_no_server_is_one_line(capsys):
    """It was httpx's ConnectError traceback."""
    optional("httpx")
    with socket.socket() as s:  # a port nothing listens on once closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert "no server answers" in error_of(capsys, ["bench", "serve", "--url",
                                                    f"http://127.0.0.1:{port}"])


def _random_char_run(out, alphabet: str):
    """A random-weight GPT run over a character vocabulary of ``alphabet``."""
    import torch

    from scratchgpt.models import build_model, model_config
    from scratchgpt.tokenizers.char import CharTokenizer
    from tests.serve.models import save_run

    tok = CharTokenizer(list(alphabet))
    torch.manual_seed(0)
    model = build_model(model_config("gpt", vocab_size=tok.vocab_size, block_size=32,
                                     n_layer=1, n_head=1, n_embd=8))
    return save_run(model.eval(), tok, out, chat=False)


def test_bench_serve_soak_prompts_with_words_the_model_can_encode(capsys, tmp_path):
    """The soak's prompts were fixed words ('king', 'love', ...): against a model whose
    characters lack some of them, every good request was a 400, and the soak FAILED the
    server for the bench's own prompts."""
    import json

    from scratchgpt.bench.serve import prompt_words
    from tests.serve.conftest import start_server

    with start_server(_random_char_run(tmp_path / "few", "the a\n")) as server:
        assert prompt_words(server.url) == ["the", "a"]
        assert main(["bench", "serve", "--url", server.url, "--soak", "--soak-requests",
                     "40", "--soak-clients", "2", "--json"]) == 0
        result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["soak"]
        assert result["passed"] and not result["unexpected"], result
        # a server the bench did not start: its memory is not read, nor reported as 0 MB
        assert (result["rss_before_mb"], result["rss_after_mb"], result["rss_ratio"]) == (
            None, None, None)
    with start_server(_random_char_run(tmp_path / "none", "xyz\n")) as server:
        assert "takes none of the soak's prompt words" in error_of(
            capsys, ["bench", "serve", "--url", server.url, "--soak"])


def test_bench_serve_refuses_prompts_the_server_refuses(capsys, plain_run):
    """Prompts past the server's limit were all answered 400, and the table showed 0 tokens/s
    and nan latencies as the figures; a load with failed requests gives no figures."""
    from collections import Counter

    from scratchgpt.bench.serve import answered
    from scratchgpt.errors import GenerationError
    from scratchgpt.serve.loadtest import LoadResult
    from tests.serve.conftest import start_server

    with start_server(plain_run) as server:
        assert "--prompt-tokens 100000" in error_of(
            capsys, ["bench", "serve", "--url", server.url, "--prompt-tokens", "100000"])
    with pytest.raises(GenerationError, match="2 of 3 requests failed"):
        answered(LoadResult(1, 3, 1.0, 4, [0.1], [], Counter({200: 1, 400: 2})))
