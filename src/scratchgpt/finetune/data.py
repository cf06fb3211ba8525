"""Fine-tuning data: labelled texts, instructions and chats, read with one-line errors, split
with a fixed seed, and turned into token ids.

* Labelled texts (``--task classify``): a TSV of ``text<TAB>label`` lines (the last tab
  separates the label; an optional ``text<TAB>label`` header line), a CSV of ``text,label``
  rows (optional header), or the named dataset ``sms-spam`` (``label<TAB>text``, as a file
  holding its bytes is read).
* Instructions (``--task instruct``): a JSON list or JSONL of Alpaca records (``instruction``,
  optional ``input``, ``output``) or of chats (``{"messages": [{"role": ..., "content": ...},
  ...]}``), or the named dataset ``instruction-data``. An Alpaca record is the chat
  ``user: instruction [+ blank line + input]``, ``assistant: output``.

Splits are drawn with a seeded ``torch.Generator`` (the same on every machine); a labelled
set is split per class (stratified), so every split has every class in proportion.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import torch

from scratchgpt.chat import ROLES, Message, check_messages
from scratchgpt.data import sources
from scratchgpt.errors import DataError
from scratchgpt.validation import did_you_mean, json_loads
from scratchgpt.wording import first_of

LABEL_FIRST_DATASETS = {"sms-spam"}  # named datasets whose lines are label<TAB>text
TASK_DATASETS = {"classify": "sms-spam", "instruct": "instruction-data"}  # the named data each
Log = Callable[[str], None] | None


def check_named_for(dataset: str | None, task: str) -> None:
    """A named dataset of another task, or a corpus to pretrain on, is refused before it is
    fetched (read as this task's data, its first line would be the error)."""
    if dataset in sources.DATASET_NAMES and dataset != TASK_DATASETS[task]:
        other = next((t for t, name in TASK_DATASETS.items() if name == dataset), None)
        what = f"data for --task {other}" if other else "a corpus to pretrain on"
        raise DataError(f"--dataset {dataset} is {what}; --task {task} takes --dataset "
                        f"{TASK_DATASETS[task]} or --data FILE")


def check_unchanged(where: str, sha: str, recorded: str | None) -> None:
    """A run's data file read again (``--resume``, the test report at a run's end) must hold
    the bytes the run began with, ``recorded`` (None: nothing to compare): another file's
    split would not be the run's. Refused saying what to do, which the sha256s alone did
    not."""
    if recorded and sha != recorded:
        raise DataError(f"{where} changed since the run started (sha256 {sha[:12]}…, "
                        f"recorded {recorded[:12]}…), and its split would not be the run's: "
                        "put the run's file back to go on with it, or fine-tune a new run on "
                        "this one (another --out, or --overwrite)")


def read_source(data: str | None, dataset: str | None,
                stdin: bool = False) -> tuple[str, str, str]:
    """(text, where it came from, sha256 of its bytes) of ``--data FILE`` or a named dataset;
    with ``stdin``, ``-`` reads standard input. Read as a prompt file is
    (:func:`~scratchgpt.data.sources.read_text_file`), so a bad file is refused in its words."""
    if bool(data) == bool(dataset):
        raise DataError("give the fine-tuning data as --data FILE or --dataset NAME (one)")
    if stdin and data == sources.STDIN:
        source: str | Path = sources.STDIN
        where = "standard input"
    else:  # (a Path: a file named -, where standard input is not read)
        source = sources.fetch_named(dataset) if dataset else Path(data)
        where = str(source)
    text, raw = sources.read_text_file(source, "data file")
    return text, where, hashlib.sha256(raw).hexdigest()


# ---- labelled texts


def parse_labelled(text: str, where: str, csv_format: bool = False, label_first: bool = False,
                   min_labels: int = 2) -> list[tuple[str, str]]:
    """(text, label) pairs of a TSV (or CSV) file; an empty text or label is an error naming
    its line, and fewer than ``min_labels`` distinct labels too.

    >>> parse_labelled("text\\tlabel\\ngood film\\tpos\\nawful\\tneg\\n", "f.tsv")
    [('good film', 'pos'), ('awful', 'neg')]
    """
    rows = _csv_rows(text) if csv_format else _tsv_rows(text, label_first)
    pairs = []
    for line, (body, label) in rows:
        if line == 1 and (body.strip().lower(), label.strip().lower()) == ("text", "label"):
            continue  # a header
        if not label.strip():
            raise DataError(f"{where} line {line}: the label is missing")
        if not body.strip():
            raise DataError(f"{where} line {line}: the text is empty")
        pairs.append((body, label.strip()))
    if not pairs:
        form = "a text,label row" if csv_format else "a line of text<TAB>label"
        raise DataError(f"{where} holds no labelled text ({form})")
    labels = {label for _, label in pairs}
    if len(labels) < min_labels:
        raise DataError(f"{where}: a classifier needs at least two labels, found "
                        f"{len(labels)}{' (' + next(iter(labels)) + ')' if labels else ''}")
    return pairs


def check_labels_are_spelt_one_way(pairs: Sequence[tuple[str, str]], where: str) -> None:
    """Labels that differ only in case (``pos`` and ``Pos``) are refused: read as they are,
    each would be a class of its own, and the texts of one label split among them. (Checked
    after ``classify.check_labels_come_last``: texts read as labels differ so too.)"""
    labels = {label for _, label in pairs}
    spellings: dict[str, list[str]] = {}
    for label in sorted(labels):
        spellings.setdefault(label.casefold(), []).append(label)
    clash = next((s for s in spellings.values() if len(s) > 1), None)
    if clash:
        raise DataError(f"{where}: labels {' and '.join(repr(s) for s in clash)} differ only "
                        "in case, and would be different classes; write each label one way")


def _tsv_rows(text: str, label_first: bool) -> list[tuple[int, tuple[str, str]]]:
    rows = []
    for n, line in enumerate(sources.text_lines(text), 1):
        if not line.strip():
            continue
        if "\t" not in line:
            json_hint = ("; it reads as JSON (instruction data, for --task instruct?)"
                         if line.lstrip().startswith(("{", "[")) else "")
            raise DataError(f"line {n}: no tab between the text and its label{json_hint}")
        if label_first:
            label, body = line.split("\t", 1)
        else:
            body, label = line.rsplit("\t", 1)
        rows.append((n, (body, label)))
    return rows


def _csv_rows(text: str) -> list[tuple[int, tuple[str, str]]]:
    # a text as long as a TSV line may hold: the csv module's default cap is 131,072 characters
    csv.field_size_limit(max(csv.field_size_limit(), len(text)))
    reader = csv.reader(io.StringIO(text))
    try:
        numbered = [(reader.line_num, row) for row in reader]  # (the line each row ends on)
    except csv.Error as e:
        raise DataError(f"line {reader.line_num}: not valid CSV ({e})") from None
    rows = []
    for n, row in numbered:
        if not any(cell.strip() for cell in row):
            continue
        if len(row) != 2:
            raise DataError(f"line {n}: expected 2 columns (text, label), got {len(row)}")
        rows.append((n, (row[0], row[1])))
    return rows


def read_labelled(data: str | None, dataset: str | None, min_labels: int = 2,
                  stdin: bool = False) -> tuple[list[tuple[str, str]], str, str]:
    """(pairs, where, sha256) of labelled data (see the module docstring); with ``stdin``,
    ``-`` reads them from standard input (as TSV)."""
    check_named_for(dataset, "classify")
    text, where, sha = read_source(data, dataset, stdin)
    csv_format = bool(data) and Path(data).suffix.lower() == ".csv"
    try:
        pairs = parse_labelled(text, where, csv_format, _label_first(dataset, sha), min_labels)
    except DataError as e:
        message = str(e)
        raise DataError(message if message.startswith(where) else f"{where} {message}") from None
    return pairs, where, sha


def _label_first(dataset: str | None, sha: str) -> bool:
    """Whether labelled data is written ``label<TAB>text``: a named dataset written so, or a
    file holding one's very bytes (``--data sms-spam.tsv``, the copy ``$SCRATCHGPT_DATA_DIR``
    holds, given by its path, was refused as labels nearly one a text)."""
    return dataset in LABEL_FIRST_DATASETS or any(
        sources.DATASETS[name].sha256 == sha for name in LABEL_FIRST_DATASETS)


def stratified_split(labels: Sequence[str], fractions: Sequence[float],
                     seed: int) -> list[list[int]]:
    """Indices of each split (in ``fractions``' order; the first takes the remainder), drawn
    per class with a seeded generator. Every class keeps at least one example in the first
    split.

    >>> [len(s) for s in stratified_split(["a"] * 10 + ["b"] * 10, (0.7, 0.1, 0.2), 0)]
    [14, 2, 4]
    """
    gen = torch.Generator().manual_seed(seed)
    splits: list[list[int]] = [[] for _ in fractions]
    for label in sorted(set(labels)):
        members = [i for i, x in enumerate(labels) if x == label]
        order = [members[j] for j in torch.randperm(len(members), generator=gen).tolist()]
        start = 0
        for k in range(len(fractions) - 1, 0, -1):
            take = min(round(fractions[k] * len(order)), len(order) - start - 1)
            splits[k] += order[start:start + take]
            start += take
        splits[0] += order[start:]
    return [sorted(s) for s in splits]


def random_split(n: int, held_out: float, seed: int) -> tuple[list[int], list[int]]:
    """(train, held-out) indices: a seeded permutation, ``held_out`` of it (at least one)
    held out."""
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
    k = max(1, round(held_out * n)) if n > 1 else 0
    return sorted(order[k:]), sorted(order[:k])


def split_digest(splits: Sequence[Sequence[int]]) -> str:
    """A short checksum of a split's indices (recorded with the run)."""
    return hashlib.sha256(json.dumps([list(s) for s in splits]).encode()).hexdigest()[:16]


# ---- instructions and chats


def alpaca_messages(record: dict[str, Any]) -> list[Message]:
    """An Alpaca record as a chat: the instruction (and input, after a blank line) from the
    user, the output from the assistant."""
    prompt = record["instruction"]
    if record.get("input"):
        prompt = f"{prompt}\n\n{record['input']}"
    return [{"role": "user", "content": prompt},
            {"role": "assistant", "content": record["output"]}]


def conversation(record: Any, where: str) -> list[Message]:
    """One record of an instruction or chat file as messages; errors name the record."""
    if not isinstance(record, dict):
        raise DataError(f"{where}: expected a JSON object, got {json_kind(record)}")
    if "messages" in record:
        messages = record["messages"]
        if not isinstance(messages, list):
            raise DataError(f"{where}: 'messages' must be a list of messages")
        check_messages(messages, f"{where}, messages")  # (as the template's check names them)
        if not any(m["role"] == "assistant" for m in messages):
            raise DataError(f"{where}: no assistant message (nothing to learn); roles are "
                            f"{', '.join(ROLES)}")
        for i, m in enumerate(messages):
            _check_not_blank(m["content"], f"{where}, messages[{i}]: the {m['role']}'s content",
                             m["role"])
        return _weighed_messages(messages, where)
    _check_no_key_is_misspelt(record, where)
    missing = [k for k in ("instruction", "output") if k not in record]
    if missing:
        keys = " and ".join(repr(k) for k in missing)
        has = ", ".join(repr(k) for k in list(record)[:5]) or "none"
        raise DataError(f"{where}: missing {'key' if len(missing) == 1 else 'keys'} {keys} "
                        f"(its keys: {has}; an Alpaca record has 'instruction', 'input' and "
                        "'output'; a chat has 'messages')")
    for key in ("instruction", "input", "output"):
        if key in record and not isinstance(record[key], str):
            raise DataError(f"{where}: {key!r} must be a string")
    _check_not_blank(record["instruction"], f"{where}: 'instruction'", "user")
    _check_not_blank(record["output"], f"{where}: 'output'", "assistant")
    return alpaca_messages(record)


def _weighed_messages(messages: list[dict[str, Any]], where: str) -> list[Message]:
    """A chat's messages as the template reads them: role and content, and an assistant
    message's ``weight`` of 0 (OpenAI's fine-tuning files: the reply stays in the
    conversation but carries no loss) kept as ``"weight": 0``; a weight of 1 is the default.
    Any other weight, or one on another role's message, is refused."""
    out: list[Message] = []
    for i, m in enumerate(messages):
        message = {"role": m["role"], "content": m["content"]}
        if "weight" in m:
            weight, at = m["weight"], f"{where}, messages[{i}]"
            if m["role"] != "assistant":
                raise DataError(f"{at}: 'weight' is read on an assistant message only (the "
                                f"{m['role']}'s carries no loss)")
            if weight not in (0, 1) or isinstance(weight, bool):
                raise DataError(f"{at}: 'weight' must be 0 (no loss on this reply) or 1, got "
                                f"{json.dumps(weight)}")
            if weight == 0:
                message["weight"] = 0
        out.append(message)
    if all(m.get("weight") == 0 for m in out if m["role"] == "assistant"):
        raise DataError(f"{where}: every assistant message has weight 0 (nothing to learn)")
    return out


BLANK_TEACHES = {"user": "the model to answer an empty prompt",
                 "assistant": "the model to reply with nothing"}


def _check_not_blank(text: str, what: str, role: str) -> None:
    """A user's or an assistant's text that is empty or whitespace is refused: it was trained
    on as it is (an empty 'output' taught the reply that is its end marker alone). A system
    message and an Alpaca 'input' may be blank."""
    if role in BLANK_TEACHES and not text.strip():
        blank = "empty" if not text else "blank (whitespace only)"
        raise DataError(f"{what} is {blank}: it would teach {BLANK_TEACHES[role]}; give it "
                        "text or leave the record out")


def json_kind(value: Any) -> str:
    """What a decoded JSON value is, in JSON's words (a message named Python's: 'got
    NoneType' for ``null``, 'got str', 'got list').

    >>> [json_kind(v) for v in (None, True, "a", 1.5, [1])]
    ['null', 'true', 'a string', 'a number', 'an array']
    """
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    kinds = ((str, "a string"), ((int, float), "a number"), (list, "an array"))
    return next((kind for t, kind in kinds if isinstance(value, t)), "an object")


ALPACA_KEYS = ("instruction", "input", "output")


def _check_no_key_is_misspelt(record: dict[str, Any], where: str) -> None:
    """A key that reads as an Alpaca key the record lacks (``Input``, ``inputs``) is refused:
    other keys are not read, so its text would be left out of the conversation in silence.
    Keys unlike them (``text``, ``id``, ``category``) are a dataset's own, and pass."""
    lacking = [k for k in ALPACA_KEYS if k not in record]
    for key in record:
        if key not in ALPACA_KEYS and isinstance(key, str):
            tail = did_you_mean(key.lower(), lacking)
            if tail:
                raise DataError(f"{where}: key {key!r} is not read (an Alpaca record has "
                                f"'instruction', 'input' and 'output'){tail}")


def parse_conversations(text: str, where: str) -> list[list[Message]]:
    """Every record of a JSON list or a JSONL file, as messages (records counted from 1)."""
    stripped = text.lstrip()
    if stripped.startswith("["):
        try:
            records = json_loads(text)
        except ValueError as e:
            raise DataError(f"{where} is not valid JSON ({e})") from None
    elif (whole := _one_object(stripped)) is not None:
        records = [_object_as_record(whole, where)]
    else:
        records = []
        for n, line in enumerate(sources.text_lines(text), 1):
            if line.strip():
                try:
                    records.append(json_loads(line))
                except ValueError as e:
                    raise DataError(f"{where} line {n} is not valid JSON "
                                    f"({_line_problem(e, line)})") from None
    if not records:
        raise DataError(f"{where} holds no records")
    return [conversation(r, f"{where} record {i}") for i, r in enumerate(records, 1)]


def _line_problem(error: ValueError, line: str) -> str:
    """Why a line of JSONL is not JSON, placed by its column (the decoder's 'line 1' is the
    line's own first line, not the file's), with a hint where the line is labelled text.

    >>> _line_problem(json.JSONDecodeError("Expecting value", "good film\tpos", 0), "")
    'Expecting value at column 1'
    """
    if not isinstance(error, json.JSONDecodeError):
        return str(error)
    tsv = ("; a line of text<TAB>label is labelled text, for --task classify?"
           if "\t" in line and not line.lstrip().startswith(("{", "[")) else "")
    return f"{error.msg} at column {error.colno}{tsv}"


def _one_object(text: str) -> dict[str, Any] | None:
    """``text`` read as one JSON object, or None when it is not one (JSONL is read line by
    line: a file of one record a line is no single document)."""
    if not text.startswith("{"):
        return None
    try:
        document = json_loads(text)
    except ValueError:
        return None
    return document if isinstance(document, dict) else None


RECORD_KEYS = ("messages", "instruction", "output")


def _object_as_record(document: dict[str, Any], where: str) -> dict[str, Any]:
    """A file that is one JSON object: a record on its own, or (say ``{"data": [...]}``) a
    wrapper around the records, refused in words that say so (its first line was read as a
    line of JSONL: 'not valid JSON', though it is)."""
    if any(key in document for key in RECORD_KEYS):
        return document
    keys = ", ".join(repr(k) for k in list(document)[:5]) or "none"
    lists = [k for k, v in document.items() if isinstance(v, list)]
    hint = f" (is {lists[0]!r} the list of records? write it alone)" if lists else ""
    raise DataError(f"{where} is one JSON object (keys: {keys}), not records: give a JSON list "
                    f"of records, [{{...}}, ...], or JSONL, one record a line{hint}")


def read_conversations(data: str | None, dataset: str | None) -> tuple[list[list[Message]],
                                                                       str, str]:
    """(conversations, where, sha256) of instruction data (see the module docstring)."""
    check_named_for(dataset, "instruct")
    text, where, sha = read_source(data, dataset)
    return parse_conversations(text, where), where, sha


def lacking_characters(tokenizer: Any, texts: Iterable[str]) -> list[str]:
    """The characters of ``texts`` the tokenizer cannot write (that :func:`encode_plain`
    replaces), sorted: what a warning about replaced characters names."""
    chars = sorted(set().union(*map(set, texts)))
    return [c for c in chars if encode_plain(tokenizer, c)[1]]


def shown_characters(chars: Sequence[str], most: int = 10) -> str:
    """``'0', '1' and 3 more``: characters as a message names them.

    >>> shown_characters(["0", "1", "2"], most=2)
    "'0', '1' and 1 more"
    """
    return first_of([repr(c) for c in chars], most)


def encode_plain(tokenizer: Any, text: str) -> tuple[list[int], bool]:
    """(ids, whether characters the vocabulary lacks were replaced) of ``text`` read as plain
    text: a special token's spelling (``<|endoftext|>``) in the data is ordinary text."""
    from scratchgpt.errors import TokenizerError

    if hasattr(tokenizer, "encode_ordinary"):
        return tokenizer.encode_ordinary(text), False
    try:
        return tokenizer.encode(text), False
    except TokenizerError:
        return tokenizer.encode(text, unknown="replace"), True
