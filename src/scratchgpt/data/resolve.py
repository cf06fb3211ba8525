"""From what a user names to data: a text source, or a prepared dataset.

``--data FILE|DIR``, ``--dataset NAME|DIR`` and the offline default corpus are resolved here,
so every command (prepare, train, eval, fine-tuning) finds data the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from scratchgpt.data import sources
from scratchgpt.data.dataset import TokenDataset
from scratchgpt.data.prepare import META_FILE, prepare_text
from scratchgpt.errors import DataError
from scratchgpt.validation import FLAGS, did_you_mean


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
                    log: Callable[[str], None] | None = print) -> tuple[TokenDataset, str]:
    """A prepared dataset and its short name: a prepared directory, or a named dataset
    (``shakespeare``, ``python-stdlib``, ...) prepared at character level into the cache the
    first time. ``log`` (a print-like callable, or None) reports a preparation."""
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
    kind = sources.DATASETS[name].tokenizer if name in sources.DATASETS else "char"
    target = sources.cache_dir() / "datasets" / f"{name}-{kind}"
    if not (target / META_FILE).is_file():
        text, desc = load_source(None, name)
        meta = prepare_text(text, target, kind, source=desc, overwrite=True,  # (incomplete)
                            options=FLAGS)
        if log is not None:
            log(f"prepared {desc}: {meta['train_tokens']:,} train / {meta['val_tokens']:,} "
                f"val tokens in {target}")
    return TokenDataset(target), name
