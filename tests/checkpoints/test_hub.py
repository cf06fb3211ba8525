"""GPT-2 by hub id (``convert --from hf gpt2``, ``sample --checkpoint hf:gpt2``), tested offline:
the test lays out a Hugging Face hub cache itself (models--ID/refs/main, snapshots/REV/) holding a
tiny GPT-2 written by save_hf, points HF_HUB_CACHE at it and sets HF_HUB_OFFLINE=1, so
huggingface_hub.snapshot_download resolves from that cache exactly as it would after a download."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from scratchgpt.checkpoints import Checkpoint, save_checkpoint
from scratchgpt.checkpoints.hf import save_hf, state_dict_to_hf
from scratchgpt.cli import main
from scratchgpt.models.gpt import GPT
from scratchgpt.tokenizers import CharTokenizer
from tests.cli_errors import error_of
from tests.tiny_gpt import sharp_gpt

pytest.importorskip("huggingface_hub")

CHARS = list("abcdefghijklmnopqrstuvwxyz .,\n")
REV = "0123456789abcdef0123456789abcdef01234567"


def tiny_gpt() -> GPT:
    return sharp_gpt(scale=30, vocab_size=len(CHARS), block_size=32)


def snapshot(cache: Path, repo_id: str) -> Path:
    """The directory the hub's cache keeps ``repo_id``'s files in, with refs/main pointing at it."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(REV)
    return repo / "snapshots" / REV


@pytest.fixture()
def hub(tmp_path, monkeypatch) -> Path:
    cache = tmp_path / "hub-cache"
    save_hf(tiny_gpt(), snapshot(cache, "gpt2"), CharTokenizer(CHARS))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


@pytest.fixture()
def reference(tmp_path) -> Path:
    """The same model as our own run directory, to compare the downloaded one with."""
    run = tmp_path / "ref"
    CharTokenizer(CHARS).save(run)
    model = tiny_gpt()
    save_checkpoint(run / "best.pt", Checkpoint("gpt", model.config, model.state_dict()))
    return run


def greedy(capsys, checkpoint: str) -> str:
    code = main(["sample", "--checkpoint", checkpoint, "--prompt", "the ", "--temperature", "0",
                 "--max-new-tokens", "20"])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


def test_convert_from_a_hub_id_uses_the_cached_snapshot(hub, reference, tmp_path, capsys):
    out = tmp_path / "gpt2"
    assert main(["convert", "--from", "hf", "gpt2", "--out", str(out)]) == 0
    capsys.readouterr()
    assert (out / "best.pt").is_file() and (out / "tokenizer.json").is_file()
    assert greedy(capsys, str(out)) == greedy(capsys, str(reference))


def test_sample_reads_a_hub_id(hub, reference, capsys):
    assert greedy(capsys, "hf:gpt2") == greedy(capsys, str(reference))


def test_owner_and_name_ids_and_pytorch_bin_weights(hub, reference, tmp_path, capsys):
    """``owner/name`` lives in models--owner--name; a model with only pytorch_model.bin loads."""
    snap = snapshot(hub, "someone/tiny-gpt2")
    save_hf(tiny_gpt(), snap, CharTokenizer(CHARS))
    tensors = state_dict_to_hf(tiny_gpt().state_dict(), tie_weights=True)
    (snap / "model.safetensors").unlink()
    torch.save(tensors, snap / "pytorch_model.bin")
    assert greedy(capsys, "hf:someone/tiny-gpt2") == greedy(capsys, str(reference))


def test_offline_and_not_cached_is_one_line(hub, tmp_path, capsys):
    out = tmp_path / "medium"
    line = error_of(capsys, ["convert", "--from", "hf", "gpt2-medium", "--out", str(out)])
    assert "cannot download gpt2-medium: offline" in line and "pass a local directory" in line
    assert str(hub) in line
    assert not out.exists()
    line = error_of(capsys, ["sample", "--checkpoint", "hf:gpt2-xl", "--prompt", "a"])
    assert "cannot download gpt2-xl: offline" in line


def test_unreachable_hub_is_one_line(monkeypatch, tmp_path, capsys):
    """Online but no network: huggingface_hub finds nothing cached and raises
    LocalEntryNotFoundError; we say the hub cannot be reached. Only one weights file is asked
    for (gpt2 ships both safetensors and a .bin, 0.5 GB each)."""
    import huggingface_hub
    from huggingface_hub.errors import LocalEntryNotFoundError

    asked = []

    def no_network(repo_id, **kwargs):
        asked.append(kwargs)
        raise LocalEntryNotFoundError("connection error")

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", no_network)
    line = error_of(capsys, ["convert", "--from", "hf", "gpt2", "--out", str(tmp_path / "o")])
    assert "cannot download gpt2: the hub cannot be reached" in line
    patterns = asked[0]["allow_patterns"]
    assert "config.json" in patterns and "model.safetensors" in patterns
    assert "pytorch_model.bin" not in patterns and asked[0]["local_files_only"] is False


def test_a_cached_model_whose_hub_listing_holds_other_forms_loads_offline(hub, reference,
                                                                          capsys):
    """A newer huggingface_hub keeps the hub's listing of a model beside its cache and, offline,
    refuses a request whose patterns match a listed file the cache lacks. A model that ships
    its weights in more than one form (model.safetensors, shards, a .bin) is cached in one:
    the request for it may name no file of the others, or the cached model is refused."""
    tree_cache = pytest.importorskip("huggingface_hub._tree_cache")
    snap = hub / "models--gpt2" / "snapshots" / REV
    listed = [p.relative_to(snap).as_posix() for p in snap.rglob("*") if p.is_file()]
    listed += ["model.safetensors.index.json", "model-00001-of-00002.safetensors",
               "pytorch_model.bin"]
    tree_cache.write_tree_cache(str(hub / "models--gpt2"), REV, {
        name: tree_cache.TreeCacheEntry(size=1, blob_id=f"{i:040x}")
        for i, name in enumerate(listed)})
    assert greedy(capsys, "hf:gpt2") == greedy(capsys, str(reference))


def test_a_cached_copy_cut_short_is_named_so_offline(hub, tmp_path, monkeypatch, capsys):
    """huggingface_hub finds, offline, that its cache lacks files its listing of the model
    names (a download stopped part-way): that was 'it is not in CACHE', of a model that is."""
    import huggingface_hub
    from huggingface_hub import errors

    if not hasattr(errors, "IncompleteSnapshotError"):
        pytest.skip("this huggingface_hub does not check a cached copy is whole")

    def cut_short(repo_id, **kwargs):
        raise errors.IncompleteSnapshotError("1 file(s) are missing", snapshot_path=str(hub))

    monkeypatch.setattr(huggingface_hub, "snapshot_download", cut_short)
    line = error_of(capsys, ["convert", "--from", "hf", "gpt2", "--out", str(tmp_path / "o")])
    assert line.endswith(f"cannot download gpt2: offline (HF_HUB_OFFLINE is set) and its copy "
                         f"in {hub} lacks files (a download cut short?); download it again "
                         "online, or pass a local directory"), line
    assert not (tmp_path / "o").exists()


def test_a_mistyped_local_path_is_said_to_be_no_directory(monkeypatch, tmp_path, capsys):
    """A path that is not there is asked of the hub as an owner/name id; offline, the refusal
    said only 'cannot download runs/gpt2-locl: ...; pass a local directory' to a user who had
    given one, mistyped. When its folder is here it says first that no such directory is; an
    id whose owner is no folder here is refused as before."""
    import huggingface_hub
    from huggingface_hub.errors import LocalEntryNotFoundError

    def no_network(repo_id, **kwargs):
        raise LocalEntryNotFoundError("connection error")

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    for name in ("HF_HUB_CACHE", "HF_HOME"):  # (the cache named in words)
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", no_network)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    line = error_of(capsys, ["convert", "--from", "hf", "runs/gpt2-locl", "--out", "o"])
    assert line.endswith("error: runs/gpt2-locl is no local directory (runs holds no "
                         "'gpt2-locl'), and as a hub model id: cannot download runs/gpt2-locl: "
                         "the hub cannot be reached and it is not in the Hugging Face cache; "
                         "pass a local directory"), line
    line = error_of(capsys, ["convert", "--from", "hf", "someone/gpt2", "--out", "o"])
    assert line.endswith("error: cannot download someone/gpt2: the hub cannot be reached and "
                         "it is not in the Hugging Face cache; pass a local directory"), line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs"]


@pytest.mark.parametrize("source, message", [
    ("bad//id", "neither a local directory nor a Hugging Face hub model id"),
    ("hf:", "'hf:' names no model; give a hub id after it, such as hf:gpt2"),  # not " is ..."
])
def test_invalid_ids(hub, tmp_path, capsys, source, message):
    assert message in error_of(capsys, ["convert", "--from", "hf", source, "--out",
                                          str(tmp_path / "o")])
    if source.startswith("hf:"):  # (a path without it is a path to sample)
        assert message in error_of(capsys, ["sample", "--checkpoint", source])


def test_a_local_path_after_hf_is_not_called_missing(tmp_path, monkeypatch, capsys):
    """hf: before a folder that is there asks the hub for it, which refused it as 'neither a
    local directory nor a Hugging Face hub model id' (or '... nor a model on the hub'): the
    user, looking at the folder, is told to drop the hf:."""
    import huggingface_hub
    from huggingface_hub.errors import RepositoryNotFoundError

    (tmp_path / "mine").mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    drop = "hf: names a hub model: give a local directory without it"
    line = error_of(capsys, ["sample", "--checkpoint", "hf:./mine", "--prompt", "a"])
    assert line.endswith(f"./mine is not a Hugging Face hub model id; {drop}"), line
    line = error_of(capsys, ["sample", "--checkpoint", "hf:./elsewhere", "--prompt", "a"])
    assert line.endswith("./elsewhere is neither a local directory nor a Hugging Face hub "
                         "model id"), line

    def not_on_the_hub(repo_id, **kwargs):
        e = RepositoryNotFoundError.__new__(RepositoryNotFoundError)  # (its response unneeded)
        Exception.__init__(e, "404 Client Error")
        raise e

    monkeypatch.setattr(huggingface_hub, "snapshot_download", not_on_the_hub)
    line = error_of(capsys, ["sample", "--checkpoint", "hf:mine", "--prompt", "a"])
    assert line.endswith("mine is not a model on the Hugging Face hub (a private model needs hf "
                         f"auth login; {drop})"), line


def test_snapshot_without_weights(hub, tmp_path, capsys):
    snap = snapshot(hub, "someone/config-only")
    snap.mkdir(parents=True)
    (snap / "config.json").write_text("{}")
    line = error_of(capsys, ["convert", "--from", "hf", "someone/config-only", "--out",
                               str(tmp_path / "o")])
    assert ("has no config.json with model.safetensors, model.safetensors.index.json, "
            "pytorch_model.bin or pytorch_model.bin.index.json") in line


def test_a_local_directory_wins_over_a_hub_id(hub, reference, tmp_path, monkeypatch, capsys):
    local = tmp_path / "work"
    save_hf(tiny_gpt(), local / "gpt2", CharTokenizer(CHARS))
    monkeypatch.chdir(local)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))  # the hub has nothing
    assert main(["convert", "--from", "hf", "gpt2", "--out", str(tmp_path / "o")]) == 0
    capsys.readouterr()
    assert greedy(capsys, str(tmp_path / "o")) == greedy(capsys, str(reference))


def test_from_takes_a_hub_model_spelt_as_checkpoint_readers_spell_it(hub, reference, tmp_path,
                                                                     capsys):
    """--from hf:gpt2, as sample --checkpoint names the model, was refused as 'argument
    --from: expected 2 arguments'; it is --from hf gpt2."""
    out = tmp_path / "gpt2"
    assert main(["convert", "--from", "hf:gpt2", "--out", str(out)]) == 0
    capsys.readouterr()
    assert greedy(capsys, str(out)) == greedy(capsys, str(reference))


@pytest.mark.parametrize("given, example", [(["gpt2"], "--from hf gpt2"),
                                            (["hf"], "--from hf DIR"),
                                            (["hf", "gpt2", "x"], "--from hf DIR")])
def test_from_without_its_format_says_what_to_write(tmp_path, capsys, given, example):
    """--from gpt2 (the format left out) was 'expected 2 arguments', which named no format."""
    line = error_of(capsys, ["convert", "--from", *given, "--out", str(tmp_path / "o")])
    assert f"--from takes a FORMAT and a PATH, as in {example} (or --from hf:ID for a hub " \
           f"model); got --from {' '.join(given)}" in line, line
    assert not (tmp_path / "o").exists()


def tiny_transformers_gpt2():
    """A GPT-2 of transformers' own, the reference the downloaded model's logits must equal."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_layer=2, n_head=2, n_embd=32, vocab_size=len(CHARS), n_positions=32)).eval()


def fake_hub(monkeypatch, remote: Path, cache: Path, fetched: list[str], fail=None) -> None:
    """Play the hub with ``snapshot_download``: it copies what the patterns match, by the hub's
    own filter, out of the folder ``remote`` into a cache laid out as the hub's, naming each
    file copied in ``fetched``; ``fail(name)``, when given, may raise before a file is copied,
    as a download stopped partway would."""
    from huggingface_hub.utils import filter_repo_objects

    def hub(repo_id, revision=None, cache_dir=None, allow_patterns=None, local_files_only=False):
        assert repo_id == "someone/sharded" and revision in (None, REV) and not local_files_only
        snap = cache / "models--someone--sharded" / "snapshots" / REV
        snap.mkdir(parents=True, exist_ok=True)
        (snap.parent.parent / "refs").mkdir(exist_ok=True)
        (snap.parent.parent / "refs" / "main").write_text(REV)
        names = sorted(p.name for p in remote.iterdir())
        for name in filter_repo_objects(names, allow_patterns=allow_patterns):
            if fail is not None:
                fail(name)
            (snap / name).write_bytes((remote / name).read_bytes())
            fetched.append(name)
        return str(snap)

    import huggingface_hub

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(huggingface_hub, "snapshot_download", hub)


def downloads_whole(monkeypatch, capsys, tmp_path, ref) -> None:
    """convert --from hf:someone/sharded, then the run it wrote and the cached model read
    offline by the real snapshot_download, give transformers' logits (within 1e-5)."""
    import huggingface_hub
    from huggingface_hub._snapshot_download import snapshot_download

    from scratchgpt.checkpoints import load_model

    out = tmp_path / "run"
    assert main(["convert", "--from", "hf", "hf:someone/sharded", "--out", str(out)]) == 0, \
        capsys.readouterr().err
    x = torch.randint(0, len(CHARS), (2, 20))
    with torch.no_grad():
        want = ref(x).logits
        for source in (out, "hf:someone/sharded"):
            if source != out:  # the cache as a download left it, read offline by the hub's code
                monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
                monkeypatch.setenv("HF_HUB_OFFLINE", "1")
            model, _ = load_model(source)
            assert (model(x) - want).abs().max().item() <= 1e-5, source


def test_a_model_in_shards_is_downloaded_with_every_shard(tmp_path, monkeypatch, capsys):
    """A model that transformers saved in shards (model.safetensors.index.json and the files it
    names) has no model.safetensors nor pytorch_model.bin, all the download asked for: it got
    config.json alone and was refused. The hub is played by fake_hub; the cached model is then
    read offline by the real snapshot_download."""
    ref = tiny_transformers_gpt2()
    remote = tmp_path / "on-the-hub"
    ref.save_pretrained(remote, max_shard_size="40KB")
    torch.save(ref.state_dict(), remote / "pytorch_model.bin")  # the other form, not wanted
    shards = sorted(p.name for p in remote.glob("model-*.safetensors"))
    assert len(shards) > 1 and not (remote / "model.safetensors").exists()
    fetched: list[str] = []
    fake_hub(monkeypatch, remote, tmp_path / "hub-cache", fetched)
    downloads_whole(monkeypatch, capsys, tmp_path, ref)
    assert sorted(n for n in fetched if n.startswith("model-")) == shards
    assert "pytorch_model.bin" not in fetched


def test_a_model_in_bin_shards_is_downloaded_with_every_shard(tmp_path, monkeypatch, capsys):
    """A model saved as .bin shards (pytorch_model.bin.index.json and the
    pytorch_model-0000N-of-0000M.bin it names: what transformers wrote with
    safe_serialization=False and a max_shard_size) was refused, read neither from the hub nor
    from a directory. Each form of the weights is still asked for alone, preferred first."""
    from huggingface_hub import save_torch_state_dict

    ref = tiny_transformers_gpt2()
    remote = tmp_path / "on-the-hub"
    ref.config.save_pretrained(remote)
    save_torch_state_dict(ref.state_dict(), remote, safe_serialization=False,
                          max_shard_size="40KB")
    capsys.readouterr()  # (its note on unsafe serialization)
    shards = sorted(p.name for p in remote.glob("pytorch_model-*.bin"))
    assert len(shards) > 1 and (remote / "pytorch_model.bin.index.json").is_file()
    assert not list(remote.glob("*.safetensors")) and not (remote / "pytorch_model.bin").exists()
    fetched: list[str] = []
    fake_hub(monkeypatch, remote, tmp_path / "hub-cache", fetched)
    downloads_whole(monkeypatch, capsys, tmp_path, ref)
    assert sorted(n for n in fetched if n.startswith("pytorch_model-")) == shards


def _http_library():
    """The HTTP library the installed huggingface_hub downloads with (httpx2, httpx)."""
    import importlib

    from huggingface_hub.errors import HfHubHTTPError

    http = importlib.import_module(HfHubHTTPError.__bases__[0].__module__.split(".")[0])
    if not hasattr(http, "ReadError"):
        pytest.skip("this huggingface_hub's HTTP errors are OSErrors (requests)")
    return http


def _failure(kind: str):
    """(an error huggingface_hub lets out of a download cut short, what our one line says)."""
    from huggingface_hub import errors

    http = _http_library()
    url = "https://huggingface.co/someone/sharded/resolve/main/model-00002-of-00004.safetensors"
    if kind == "5xx":
        reply = http.Response(503, request=http.Request("GET", url))
        return (errors.HfHubHTTPError(f"503 Server Error: Service Unavailable for url: {url}",
                                      response=reply),
                f"the Hugging Face hub failed (503 Server Error: Service Unavailable for url: "
                f"{url}); try again later, or pass a local directory")
    if kind == "xet":
        if not hasattr(errors, "XetDownloadError"):
            pytest.skip("this huggingface_hub has no XetDownloadError")
        return errors.XetDownloadError("reconstruction failed"), "reconstruction failed"
    name, message = {"reset": ("ReadError", "[Errno 104] Connection reset by peer"),
                     "timeout": ("ReadTimeout", "The read operation timed out"),
                     "cut off": ("RemoteProtocolError", "peer closed connection without "
                                 "sending complete message body"),
                     "proxy": ("ProxyError", "407 Proxy Authentication Required")}[kind]
    return (getattr(http, name)(message),
            f"the connection to the Hugging Face hub failed ({name}: {message}); try again, "
            "or pass a local directory")


@pytest.mark.parametrize("kind", ["reset", "timeout", "cut off", "proxy", "5xx", "xet"])
def test_a_download_cut_short_is_one_line(tmp_path, monkeypatch, capsys, kind):
    """Since huggingface_hub 1.x, a connection reset or a timeout partway through a file raises
    its HTTP library's error, which is no OSError: that was a traceback. The error stops the
    fake hub at the second shard; convert and sample both say it in one line, and convert
    leaves no --out. (An HTTP 5xx, an OSError, was one line, which named no cause.)"""
    error, says = _failure(kind)
    ref = tiny_transformers_gpt2()
    remote = tmp_path / "on-the-hub"
    ref.save_pretrained(remote, max_shard_size="40KB")
    capsys.readouterr()
    second = sorted(p.name for p in remote.glob("model-*.safetensors"))[1]

    def fail(name):
        if name == second:
            raise error

    fetched: list[str] = []
    fake_hub(monkeypatch, remote, tmp_path / "hub-cache", fetched, fail)
    out = tmp_path / "o"
    line = error_of(capsys, ["convert", "--from", "hf:someone/sharded", "--out", str(out)])
    assert line.endswith(f"error: cannot download someone/sharded: {says}"), line
    assert not out.exists() and len([n for n in fetched if n.startswith("model-")]) == 1
    line = error_of(capsys, ["sample", "--checkpoint", "hf:someone/sharded", "--prompt", "a"])
    assert line.endswith(f"error: cannot download someone/sharded: {says}"), line


@pytest.fixture()
def failing_hub(tmp_path, monkeypatch, request):
    """The hub played by an HTTP server on 127.0.0.1 that answers every request 503 (or the
    status a test parametrizes it with, indirectly); its ``paths`` list what was asked. The
    cache is empty and the hub online."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from huggingface_hub import constants

    paths: list[str] = []
    status = getattr(request, "param", 503)

    class Unavailable(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (the name http.server calls)
            paths.append(self.path)
            self.send_error(status)

        do_HEAD = do_GET

        def log_message(self, format, *args) -> None:  # noqa: A002 (http.server's signature)
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Unavailable)
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")  # a proxy set for the internet must not apply
    monkeypatch.setenv("no_proxy", "127.0.0.1")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{httpd.server_address[1]}")
    # (read from the environment when huggingface_hub was imported, maybe by an offline test)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    yield paths
    httpd.shutdown()
    httpd.server_close()
    thread.join()


def test_a_hub_listing_answered_5xx_says_the_hub_failed(failing_hub, tmp_path, capsys):
    """huggingface_hub lists a model's files before it downloads them; a 503 to that listing
    read 'the hub cannot be reached', of a hub that had answered. It is said as a 5xx to a
    download is: the hub failed, with its status, and to try again later."""
    out = tmp_path / "o"
    line = error_of(capsys, ["convert", "--from", "hf", "gpt2", "--out", str(out)])
    assert "cannot download gpt2: the Hugging Face hub failed (" in line, line
    assert "503" in line and line.endswith("); try again later, or pass a local directory")
    assert "cannot be reached" not in line
    assert any(p.startswith("/api/models/gpt2") for p in failing_hub), failing_hub
    assert not out.exists()


@pytest.mark.parametrize(("failing_hub", "then"), [
    (429, "too many requests, try again later, or pass a local directory"),
    (403, "pass a local directory")], indirect=["failing_hub"])
def test_a_hub_listing_answered_4xx_says_the_hub_refused(failing_hub, tmp_path, capsys, then,
                                                         request):
    """A 4xx other than those huggingface_hub names (401, 404: no such model) to the listing
    also read 'the hub cannot be reached', of a hub that had refused the request: it says so,
    with the status, and for a 429 to try again later."""
    out = tmp_path / "o"
    line = error_of(capsys, ["convert", "--from", "hf", "gpt2", "--out", str(out)])
    status = request.node.callspec.params["failing_hub"]
    assert f"cannot download gpt2: the Hugging Face hub refused the request ({status}" in line, \
        line
    assert line.endswith(f"); {then}"), line
    assert "cannot be reached" not in line and "hub failed" not in line
    assert any(p.startswith("/api/models/gpt2") for p in failing_hub), failing_hub
    assert not out.exists()


def _xet_transfer_to_nowhere(monkeypatch, tmp_path):
    """``fetch(name)``: a download through huggingface_hub's Xet backend (its ``xet_get``, and
    hf_xet for real) from a storage address where nothing listens, which fails as hf_xet fails:
    a plain RuntimeError out of its native code."""
    import socket
    import time

    pytest.importorskip("hf_xet")
    from huggingface_hub import file_download
    from huggingface_hub.utils import _xet as xet

    if not hasattr(file_download, "xet_get") or not hasattr(xet, "XetSessionHolder"):
        pytest.skip("this huggingface_hub has no Xet download to fail")
    with socket.socket() as s:  # a port of this machine that nothing listens on
        s.bind(("127.0.0.1", 0))
        nowhere = f"http://127.0.0.1:{s.getsockname()[1]}"
    # one attempt (hf_xet retries for two minutes), in a session of this test's own
    monkeypatch.setenv("HF_XET_CLIENT_RETRY_MAX_ATTEMPTS", "1")
    monkeypatch.setenv("HF_XET_CLIENT_RETRY_MAX_DURATION", "1")
    monkeypatch.setattr(xet, "_GLOBAL_XET_HOLDER", xet.XetSessionHolder())
    storage = xet.XetConnectionInfo(access_token="token", endpoint=nowhere,
                                    expiration_unix_epoch=int(time.time()) + 3600)
    monkeypatch.setattr(xet, "refresh_xet_connection_info", lambda **kwargs: storage)

    def fetch(name: str) -> None:
        file_download.xet_get(incomplete_path=tmp_path / f"{name}.incomplete",
                              xet_file_data=xet.XetFileData("0" * 64, f"{nowhere}/refresh"),
                              headers={}, expected_size=1)

    return fetch


def test_a_failed_xet_transfer_is_one_line(tmp_path, monkeypatch, capsys):
    """hf_xet, huggingface_hub's Xet transfer backend, raises its failures as plain
    RuntimeErrors, which were no hub failure here: a traceback. The fake hub downloads its
    second shard through the real Xet code, which fails; convert says it in one line."""
    fetch = _xet_transfer_to_nowhere(monkeypatch, tmp_path)
    ref = tiny_transformers_gpt2()
    remote = tmp_path / "on-the-hub"
    ref.save_pretrained(remote, max_shard_size="40KB")
    capsys.readouterr()
    second = sorted(p.name for p in remote.glob("model-*.safetensors"))[1]
    fake_hub(monkeypatch, remote, tmp_path / "hub-cache", [],
             lambda name: fetch(name) if name == second else None)
    out = tmp_path / "o"
    line = error_of(capsys, ["convert", "--from", "hf:someone/sharded", "--out", str(out)])
    assert "error: cannot download someone/sharded: the Xet transfer from the Hugging Face " \
           "hub failed (" in line, line
    assert line.endswith("); try again, or pass a local directory") and not out.exists()


def test_a_runtime_error_not_of_the_hub_is_not_taken_for_one(tmp_path, monkeypatch):
    """Only hf_xet's RuntimeErrors are the hub's: one raised elsewhere (here by the fake hub
    itself) goes on as it was raised, a bug to see whole."""
    from scratchgpt.checkpoints.hub import download

    def fail(name):
        raise RuntimeError("not the hub's")

    remote = tmp_path / "on-the-hub"
    tiny_transformers_gpt2().save_pretrained(remote)
    fake_hub(monkeypatch, remote, tmp_path / "hub-cache", [], fail)
    with pytest.raises(RuntimeError, match="not the hub's"):
        download("someone/sharded")
