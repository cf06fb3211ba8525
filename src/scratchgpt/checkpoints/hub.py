"""GPT-2 from the Hugging Face hub: a model id such as ``gpt2`` becomes a local directory.

:func:`download` asks ``huggingface_hub.snapshot_download`` for just the files a GPT-2
directory needs (``config.json``, ``model.safetensors`` -- or, for a model saved in shards,
``model.safetensors.index.json`` and the shard files it names, or ``pytorch_model.bin`` when a
model has no safetensors, or ``pytorch_model.bin.index.json`` and its shards when it has
neither --, and the tokenizer files) and returns the snapshot directory in the
hub's own cache, which :func:`~scratchgpt.checkpoints.hf.load_hf` reads. The cache is the one
``transformers`` uses (``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else
``~/.cache/huggingface/hub``), so a model is downloaded once.

Offline (``HF_HUB_OFFLINE=1``, or no network) the model is taken from that cache; a model that
is not there is a one-line :class:`~scratchgpt.errors.CheckpointError` that says so. So is a
download stopped partway, by the connection (reset, timed out: errors of huggingface_hub's HTTP
library, which are no OSError), by the hub (HTTP 5xx, to a file's download or to the listing
of the model's files that comes first: the hub answered, and was not out of reach) or in
``hf_xet``, huggingface_hub's Xet transfer backend (whose failures are plain RuntimeErrors).

Ids are the hub's: ``gpt2``, ``gpt2-medium``, ``gpt2-large``, ``gpt2-xl``, ``distilgpt2``,
``openai-community/gpt2``, or ``owner/name`` for any GPT-2 shaped model.
"""

from __future__ import annotations

import glob
import importlib
import os
import re
import traceback
from pathlib import Path

from scratchgpt.checkpoints.hf import (
    DIRECTORY_FILES,
    OUR_TOKENIZER_DIR,
    SHARD_INDEXES,
    WEIGHT_FILES,
    is_hf_dir,
    listed_shards,
)
from scratchgpt.errors import CheckpointError

HF_PREFIX = "hf:"  # "--checkpoint hf:gpt2" names a hub model where a path is expected
# Everything a GPT-2 directory may need besides its weights.
DOWNLOAD_PATTERNS = (*DIRECTORY_FILES, f"{OUR_TOKENIZER_DIR}/*")
_TRUE = ("1", "true", "yes", "on")
COMMIT = re.compile(r"[0-9a-f]{40}")  # the name of a snapshot directory in the hub's cache


def hub_spelling(name: str) -> str:
    """How a hub model is named where a path is expected, for a refusal of ``name``: a bare
    name (no path separator, such as ``gpt2``) as ``hf:NAME``, anything else as ``hf:ID``.

    >>> hub_spelling("gpt2"), hub_spelling("runs/x")
    ('a Hugging Face model is hf:gpt2', 'a Hugging Face model is hf:ID')
    """
    return f"a Hugging Face model is {HF_PREFIX}{name if is_bare(name) else 'ID'}"


def is_bare(name: str) -> bool:
    """Whether ``name`` has no path separator, as a hub id without an owner has none."""
    return bool(name) and not any(sep in name for sep in ("/", os.sep, os.altsep or "/"))


def offline() -> bool:
    """True when the environment turns the hub off (read now, not when huggingface_hub was
    imported): ``HF_HUB_OFFLINE`` or ``TRANSFORMERS_OFFLINE`` set to 1/true/yes/on."""
    return any(os.environ.get(v, "").strip().lower() in _TRUE
               for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def cache_dir() -> Path | None:
    """The hub cache named by the environment now (``HF_HUB_CACHE``, else ``HF_HOME``/hub);
    None leaves huggingface_hub's default."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    return None


def _why(repo_id: str, e: Exception) -> str:
    """One line saying why ``repo_id`` could not be had, for each way the hub fails."""
    from huggingface_hub import errors
    from huggingface_hub.errors import (
        GatedRepoError,
        HFValidationError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    # a path that is there reaches the hub only after hf:, which names a hub model
    local = Path(repo_id).exists()
    nor = "not" if local else "neither a local directory nor"
    drop = f"; {HF_PREFIX} names a hub model: give a local directory without it" if local else ""
    if isinstance(e, HFValidationError):
        return f"{repo_id} is {nor} a Hugging Face hub model id{drop}"
    if isinstance(e, GatedRepoError):
        return (f"{repo_id} is gated on the Hugging Face hub: accept its terms on the hub and "
                "log in (hf auth login)")
    if isinstance(e, RepositoryNotFoundError):
        return (f"{repo_id} is {nor} a model on the Hugging Face hub (a private model needs "
                f"hf auth login{drop})")
    if isinstance(e, RevisionNotFoundError):
        return f"{repo_id}: no such revision on the Hugging Face hub"
    # huggingface_hub raises that the model is not cached (LocalEntryNotFoundError) from the
    # hub's answer to its listing of the model's files: a 5xx or a 4xx there is an answer,
    # not a hub out of reach
    answered = _hub_failed(repo_id, e.__cause__) if isinstance(e, LocalEntryNotFoundError) else None
    if answered is not None:
        return answered
    where = cache_dir() or "the Hugging Face cache"
    how = "offline (HF_HUB_OFFLINE is set)" if offline() else "the hub cannot be reached"
    # (a newer huggingface_hub's: the cache's listing of the model names files it lacks)
    if isinstance(e, getattr(errors, "IncompleteSnapshotError", ())):
        return (f"cannot download {repo_id}: {how} and its copy in {where} lacks files (a "
                "download cut short?); download it again online, or pass a local directory")
    if isinstance(e, LocalEntryNotFoundError):
        return (f"cannot download {repo_id}: {how} and it is not in {where}; pass a local "
                "directory")
    return _failed_midway(repo_id, e) or f"cannot download {repo_id}: {_first_line(e)}"


def _failed_midway(repo_id: str, e: Exception) -> str | None:
    """Why a download that had begun stopped, where the hub failed (HTTP 5xx) or the connection
    did (reset, timed out, cut off mid-file, a proxy refusing), or None."""
    if isinstance(getattr(getattr(e, "response", None), "status_code", None), int):
        return _hub_failed(repo_id, e)  # the hub answered: its failure (5xx) or refusal (4xx)
    if isinstance(e, (ConnectionError, TimeoutError, *_http_errors())):
        return (f"cannot download {repo_id}: the connection to the Hugging Face hub failed "
                f"({type(e).__name__}: {_first_line(e)}); try again, or pass a local directory")
    if _is_xet_failure(e):
        return (f"cannot download {repo_id}: the Xet transfer from the Hugging Face hub failed "
                f"({_first_line(e)}); try again, or pass a local directory")
    return None


def _is_xet_failure(e: BaseException) -> bool:
    """Whether ``e`` is a failure of huggingface_hub's Xet transfer backend (``hf_xet``), which
    raises a plain RuntimeError from its native code: one whose last Python frame is in
    ``hf_xet`` or in huggingface_hub's Xet code (its ``xet_get``, its ``utils._xet``). Other
    RuntimeErrors are not taken for the hub's."""
    if not isinstance(e, RuntimeError) or e.__traceback__ is None:
        return False
    *_, (frame, _) = traceback.walk_tb(e.__traceback__)
    module, function = frame.f_globals.get("__name__", ""), frame.f_code.co_name
    package = module.split(".")[0]
    return package == "hf_xet" or (package == "huggingface_hub"
                                   and "xet" in f"{module}.{function}".lower())


def _hub_failed(repo_id: str, e: BaseException | None) -> str | None:
    """Why ``repo_id`` could not be had where the hub answered ``e``, a request of the download
    or of its listing of the model's files, with an HTTP error (its status in ``e``'s first
    line): a 5xx is the hub's own failure, a 4xx its refusal (429: too many requests); else
    None."""
    status = getattr(getattr(e, "response", None), "status_code", None)
    if e is None or not isinstance(status, int) or status < 400:
        return None
    what = "failed" if status >= 500 else "refused the request"
    then = {429: "too many requests, try again later, or "}.get(
        status, "try again later, or " if status >= 500 else "")
    return (f"cannot download {repo_id}: the Hugging Face hub {what} ({_first_line(e)}); "
            f"{then}pass a local directory")


def _first_line(e: BaseException) -> str:
    """The first line of ``e``'s message (200 characters at most), else its type's name."""
    return str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__


def _http_errors() -> tuple[type[Exception], ...]:
    """The base error of the HTTP library huggingface_hub downloads with, where installed:
    httpx2 (2.x), httpx (1.x). Neither is an OSError, as requests' errors (0.x) were."""
    found = []
    for name in ("httpx2", "httpx"):
        try:
            found.append(importlib.import_module(name).HTTPError)
        except (ImportError, AttributeError):
            continue
    return tuple(found)


def _hub_failures() -> tuple[type[Exception], ...]:
    """What ``snapshot_download`` raises when a model cannot be had: its own errors (OSError,
    ValueError), and since huggingface_hub 1.x also its HTTP library's (a connection reset or a
    read timing out partway through a file) and a failed Xet download's."""
    from huggingface_hub import errors

    xet = getattr(errors, "XetDownloadError", None)
    return (OSError, ValueError, *_http_errors(), *([xet] if xet is not None else []))


def download(repo_id: str, revision: str | None = None) -> Path:
    """The local snapshot directory of the hub model ``repo_id`` (downloaded if needed).

    Raises :class:`CheckpointError` when huggingface_hub is missing, the id is unknown, the hub
    is unreachable (or ``HF_HUB_OFFLINE`` is set) and the model is not cached, or the model has
    no weights in a format we read."""
    if not repo_id.strip():  # 'hf:' alone (the hub's refusal would name a blank id)
        raise CheckpointError(f"'{HF_PREFIX}' names no model; give a hub id after it, such as "
                              f"{HF_PREFIX}gpt2")
    try:
        import huggingface_hub  # noqa: F401 - its absence is said here, before any download
    except ImportError:
        raise CheckpointError(f"downloading {repo_id} needs the huggingface_hub package (pip "
                              "install huggingface_hub); or pass a local directory") from None
    # only one form of the weights: gpt2 ships both model.safetensors and pytorch_model.bin,
    # 0.5 GB each. Each request names the files of one form alone (WEIGHT_FILES, preferred
    # first), as the hub's cache, offline, holds a model whole only when it holds every file a
    # request's patterns match
    commit, path = revision, None
    for weights in WEIGHT_FILES:
        path = _snapshot(repo_id, commit, weights)
        # the rest from the same commit, should the model change on the hub meanwhile
        commit = path.name if COMMIT.fullmatch(path.name) else commit
        if (path / weights).is_file():
            if weights in SHARD_INDEXES:  # and the shards it names
                shards = map(glob.escape, listed_shards(path / weights))
                path = _snapshot(repo_id, commit, weights, *shards)
            break
    if path is not None and is_hf_dir(path):
        return path
    raise CheckpointError(f"{repo_id} on the Hugging Face hub has no config.json with "
                          f"{', '.join(WEIGHT_FILES[:-1])} or {WEIGHT_FILES[-1]} (in {path})")


def _snapshot(repo_id: str, revision: str | None, *weights: str) -> Path:
    """The snapshot directory of ``repo_id`` holding its files besides the weights and those
    of ``weights`` (file name patterns) the model has."""
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id, revision=revision, cache_dir=cache_dir(),
                                      allow_patterns=[*DOWNLOAD_PATTERNS, *weights],
                                      local_files_only=offline()))
    except Exception as e:  # noqa: BLE001 - the hub's and hf_xet's failures, decided once raised
        if not isinstance(e, _hub_failures()) and not _is_xet_failure(e):
            raise
        raise CheckpointError(_why(repo_id, e)) from None


def resolve_hf_source(source: str | Path) -> Path:
    """A Hugging Face GPT-2 directory from ``source``: a local directory as it is, otherwise a
    hub model id (optionally prefixed ``hf:``), downloaded with :func:`download`."""
    text = str(source)
    if text.startswith(HF_PREFIX):
        return download(text[len(HF_PREFIX):])
    if Path(text).exists():
        return Path(text)
    try:
        return download(text)
    except CheckpointError as e:
        raise CheckpointError(_no_such_folder(text, str(e))) from None


def _no_such_folder(text: str, why: str) -> str:
    """``why`` the hub model ``text`` could not be had, saying first that no such folder is
    here when ``text`` reads as a path mistyped (``runs/gpt2`` where ``runs`` is a folder):
    'cannot download runs/gpt2: ...; pass a local directory' left the user, who had given
    one, to guess. A refusal that says so already, or an id like no path here, is ``why``."""
    folder = Path(text).parent
    if is_bare(text) or not folder.is_dir() or "neither a local directory" in why:
        return why
    return (f"{text} is no local directory ({folder} holds no {Path(text).name!r}), and as a "
            f"hub model id: {why}")
