"""From what a user names to data: a text source, or a prepared dataset.

``--data FILE|DIR``, ``--dataset NAME|DIR`` and the offline default corpus are resolved here,
so every command (prepare, train, eval, fine-tuning) finds data the same way.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path

from scratchgpt.data import sources
from scratchgpt.data.dataset import TokenDataset, dataset_tokenizer
from scratchgpt.data.prepare import META_FILE, prepare_text
from scratchgpt.errors import DataError
from scratchgpt.paths import cache_dir
from scratchgpt.tokenizers import Tokenizer
from scratchgpt.validation import FLAGS, did_you_mean
from scratchgpt.wording import plural


def load_source(data: str | None, dataset: str | None) -> tuple[str, str]:
    """(text, description) from a file or folder (``data``), a named dataset, or, with
    neither, the offline default corpus (this Python's standard library sources)."""
    if data is not None:  # (an empty one too: it is not the default corpus)
        return sources.read_text_source(data)
    if dataset is not None and dataset != sources.DEFAULT_CORPUS:
        path = sources.fetch_named(dataset)
        text = sources.read_files([path])
        if sources.DATASETS[dataset].gutenberg:
            text = sources.strip_gutenberg(text)
        return text, f"{dataset} ({path})"
    files = sources.default_corpus_files()
    return sources.read_files(files), (f"{sources.DEFAULT_CORPUS}: {len(files)} standard-library "
                                       f"modules from {files[0].parent}")


def dataset_name(name_or_path: str | None) -> str:
    """The short name :func:`resolve_dataset` gives a dataset (a run started without --out
    goes to ``runs/NAME``), found without preparing anything: a prepared directory's own
    name, else the named dataset's (the default corpus for None).

    >>> dataset_name("data/mytext/"), dataset_name("shakespeare")
    ('mytext', 'shakespeare')
    """
    name = name_or_path or sources.DEFAULT_CORPUS
    if name in sources.DATASET_NAMES and not (Path(name) / META_FILE).is_file():
        return name
    # (resolved: "--dataset ." names the folder, not "", which put the default run
    # directory at runs/ itself)
    return Path(name).resolve().name or "dataset"


def resolve_dataset(name_or_path: str | None,
                    log: Callable[[str], None] | None = print,
                    tokenizer: Tokenizer | None = None) -> tuple[TokenDataset, str]:
    """A prepared dataset and its short name: a prepared directory, or a named dataset
    (``shakespeare``, ``python-stdlib``, ...) prepared into the cache the first time. A named
    dataset is prepared with ``tokenizer`` where one is given (a run's, for a reader of the
    run: eval, resume, continued pretraining), else with the dataset's own kind, learned from
    its text; each tokenizer has its own cache entry. ``log`` (a print-like callable, or None)
    reports a preparation."""
    name = name_or_path or sources.DEFAULT_CORPUS
    path = Path(name)
    if path.is_dir():
        if name not in sources.DATASET_NAMES or (path / META_FILE).is_file():
            return TokenDataset(path), dataset_name(name)
        if log is not None:  # a folder of the user's own, named like a dataset
            log(f"note: the folder {path} is not a prepared dataset; using the named "
                f"dataset {name!r}")
    if path.is_file() and name not in sources.DATASET_NAMES:
        raise DataError(f"--dataset {name} is a file, not a prepared dataset directory; "
                        f"prepare it first: scratchgpt prepare --data {name} --out DIR")
    if name not in sources.DATASET_NAMES:
        raise DataError(f"--dataset {name}: no such prepared dataset directory, and not a named "
                        f"dataset ({', '.join(sources.DATASET_NAMES)})"
                        + did_you_mean(name, sources.DATASET_NAMES))
    return TokenDataset(_prepared_named(name, tokenizer, log)), name


def _prepared_named(name: str, tokenizer: Tokenizer | None,
                    log: Callable[[str], None] | None) -> Path:
    """The cache's entry of named dataset ``name`` (prepared now if missing): ``NAME-KIND``,
    tokenized by the dataset's own kind, unless ``tokenizer`` is given and tokenizes
    differently: then ``NAME-KIND-DIGEST``, by that tokenizer (the digest is of its state)."""
    kind = sources.DATASETS[name].tokenizer if name in sources.DATASETS else "char"
    target = cache_dir() / "datasets" / f"{name}-{kind}"
    if tokenizer is not None and not _tokenized_by(target, tokenizer):
        state = json.dumps(tokenizer.state(), sort_keys=True, ensure_ascii=False)
        digest = hashlib.sha256(state.encode("utf-8")).hexdigest()[:12]
        target = target.with_name(f"{name}-{tokenizer.kind}-{digest}")
    if (target / META_FILE).is_file() and (tokenizer is None or _tokenized_by(target, tokenizer)):
        return target
    text, desc = load_source(None, name)
    meta = prepare_text(text, target, tokenizer or kind, source=desc,  # (an incomplete one too)
                        overwrite=True, options=FLAGS)
    if log is not None:
        log(f"prepared {desc}: {meta['train_tokens']:,} train / {meta['val_tokens']:,} "
            f"val tokens in {target}")
        unknown = meta.get("train_unknown_chars", 0) + meta.get("val_unknown_chars", 0)
        if unknown:
            one = unknown == 1
            log(f"note: {plural(unknown, 'character', grouped=True)} of {name} "
                f"{'is' if one else 'are'} not in the tokenizer's vocabulary and "
                f"{'was' if one else 'were'} written as a stand-in character")
    return target


def _tokenized_by(directory: Path, tokenizer: Tokenizer) -> bool:
    """``directory`` holds a prepared dataset whose tokenizer is ``tokenizer``, entry for entry."""
    if not (directory / META_FILE).is_file():
        return False
    return dataset_tokenizer(directory).same_as(tokenizer)
