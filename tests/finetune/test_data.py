"""Fine-tuning data: parsing with errors that name the line or record, seeded splits, and the
loss mask of instruction tuning (only reply tokens carry the loss)."""

from __future__ import annotations

import json
import re

import pytest
import torch

from scratchgpt.chat import DEFAULT_TEMPLATE, TEMPLATES
from scratchgpt.errors import DataError
from scratchgpt.finetune.data import (
    check_labels_are_spelt_one_way,
    parse_conversations,
    parse_labelled,
    random_split,
    stratified_split,
)
from scratchgpt.finetune.instruct import (
    IGNORE,
    InstructSpec,
    collate,
    encode_conversation,
    inputs_and_targets,
    load_data,
    response_loss,
)
from scratchgpt.tokenizers import CharTokenizer

TEMPLATE = TEMPLATES[DEFAULT_TEMPLATE]


def test_tsv_csv_and_label_first():
    assert parse_labelled("a b\tx\nc\td\ty\n", "f") == [("a b", "x"), ("c\td", "y")]
    assert parse_labelled('text,label\n"a, b",x\nc,y\n', "f", csv_format=True) == \
        [("a, b", "x"), ("c", "y")]
    assert parse_labelled("ham\tGo until\nspam\tWIN now\n", "f", label_first=True) == \
        [("Go until", "ham"), ("WIN now", "spam")]


def test_a_csv_text_may_be_as_long_as_a_tsv_one():
    """The csv module caps a field at 131,072 characters: that was a csv.Error traceback."""
    long = "word " * 40_000
    rows = f'text,label\n"{long}",pos\nshort,neg\n'
    assert parse_labelled(rows, "f", csv_format=True) == [(long, "pos"), ("short", "neg")]


@pytest.mark.parametrize("text", ["[" * 100_000, '{"messages": ' + "[" * 100_000])
def test_json_nested_too_deeply_is_a_data_error(text):
    """Python's parser recurses once per level: that was a RecursionError traceback."""
    with pytest.raises(DataError, match="nested too deeply"):
        parse_conversations(text, "f")


@pytest.mark.parametrize("text, needle", [
    ("good\tpos\nbad\t\n", "f line 2: the label is missing"),
    ("good\tpos\nbad\n", "line 2: no tab"),
    ("good\tpos\nfine\tpos\n", "at least two labels, found 1 (pos)"),
    ("\tpos\nbad\tneg\n", "f line 1: the text is empty"),
])
def test_bad_labelled_data(text, needle):
    with pytest.raises(DataError, match=re.escape(needle)):
        parse_labelled(text, "f")


@pytest.mark.parametrize("char", ["\x0b", "\x0c", "\x1c", "\x85", "\u2028", "\u2029"])
def test_labelled_lines_end_where_an_editor_ends_them(char):
    """A text may hold a character ``str.splitlines`` takes for a line break: the line was
    cut in two ('line 1: no tab'), and each line after it named one number too far."""
    assert parse_labelled(f"a{char}b\tpos\r\nc\tneg\rd\tneg\n", "f") == \
        [(f"a{char}b", "pos"), ("c", "neg"), ("d", "neg")]
    with pytest.raises(DataError, match=re.escape("line 3: no tab")):
        parse_labelled(f"a{char}b\tpos\nc\tneg\nno tab here\n", "f")


@pytest.mark.parametrize("char", ["\x85", "\u2028", "\u2029"])  # (JSON escapes the others)
def test_jsonl_records_end_where_an_editor_ends_lines(char):
    """A JSON string may hold these characters unescaped: a record holding one was cut in
    two ('line 1 is not valid JSON'), and later records named by the wrong line."""
    record = json.dumps({"instruction": f"a{char}b", "output": "c"}, ensure_ascii=False)
    assert char in record
    chats = parse_conversations(f"{record}\r\n{record}\n", "f")
    assert [chat[0]["content"] for chat in chats] == [f"a{char}b"] * 2
    with pytest.raises(DataError, match=re.escape("f line 3 is not valid JSON")):
        parse_conversations(f"{record}\n{record}\nnot json\n", "f")


def test_a_file_holding_a_label_first_dataset_is_read_as_that_dataset(tmp_path,
                                                                      monkeypatch):
    """--data sms-spam.tsv (the file $SCRATCHGPT_DATA_DIR holds, given by its path) was read
    text<TAB>label, and refused as labels nearly one a text: a file with the dataset's bytes
    is read label<TAB>text, as --dataset sms-spam is; another file is not."""
    import dataclasses
    import hashlib

    from scratchgpt.data import sources
    from scratchgpt.finetune.data import read_labelled

    path = tmp_path / "sms-spam.tsv"
    path.write_text("ham\tGo until jurong\nspam\tWIN a prize\n")
    assert read_labelled(str(path), None)[0] == [("ham", "Go until jurong"),
                                                 ("spam", "WIN a prize")]
    pinned = dataclasses.replace(sources.DATASETS["sms-spam"],
                                 sha256=hashlib.sha256(path.read_bytes()).hexdigest())
    monkeypatch.setitem(sources.DATASETS, "sms-spam", pinned)
    assert read_labelled(str(path), None)[0] == [("Go until jurong", "ham"),
                                                 ("WIN a prize", "spam")]


def test_labels_that_differ_only_in_case_are_refused():
    """Read as they are, they were four classes, the texts of each label split between two."""
    pairs = parse_labelled("good\tpos\nbad\tneg\nfine\tPos \nugly\tNEG\n", "f")
    with pytest.raises(DataError, match=re.escape(
            "f: labels 'NEG' and 'neg' differ only in case, and would be different classes")):
        check_labels_are_spelt_one_way(pairs, "f")
    check_labels_are_spelt_one_way(pairs[:2], "f")  # one spelling each: nothing to refuse


@pytest.mark.parametrize("min_labels", [1, 2])
def test_a_file_without_labelled_text_says_so(min_labels):
    """classify --eval needs one label, not two: an empty file is refused for what it lacks."""
    for text, csv_format, form in (("text\tlabel\n\n", False, "line of text<TAB>label"),
                                   ("", True, "text,label row")):
        with pytest.raises(DataError, match=re.escape(f"f holds no labelled text (a {form}")):
            parse_labelled(text, "f", csv_format, min_labels=min_labels)


@pytest.mark.parametrize("name", ["l.tsv", "l.csv", "c.json", "c.jsonl"])
@pytest.mark.parametrize("encoding", ["utf-16-le", "utf-16-be"])
def test_utf16_without_a_byte_order_mark_is_refused_naming_the_file(tmp_path, name,
                                                                    encoding):
    """A TSV or CSV saved as UTF-16 without a byte-order mark is valid UTF-8 with a NUL
    beside every letter: it was read in silence, texts and labels with NULs in them (a JSON
    file was "not valid JSON" at a column of a line that looks right). Each is refused as
    prepare refuses such a text, naming the file; a stray NUL in a text passes."""
    from scratchgpt.finetune.data import read_conversations, read_labelled

    rows = [(f"text number {i} is good", "ab"[i % 2]) for i in range(10)]
    records = [{"instruction": f"say {i}", "output": str(i)} for i in range(4)]
    body = {"l.tsv": "".join(f"{t}\t{label}\n" for t, label in rows),
            "l.csv": "".join(f"{t},{label}\n" for t, label in rows),
            "c.json": json.dumps(records),
            "c.jsonl": "".join(json.dumps(r) + "\n" for r in records)}[name]
    path = tmp_path / name
    read = read_labelled if name.startswith("l.") else read_conversations
    path.write_bytes(body.encode(encoding))
    with pytest.raises(DataError, match=re.escape(f"{path} is 50% NUL characters: UTF-16 "
                                                  "text saved without a byte-order mark")):
        read(str(path), None)
    path.write_bytes(body.encode("utf-16"))  # with its byte-order mark: named as UTF-16
    with pytest.raises(DataError, match=re.escape(f"{path} is not valid UTF-8 text (byte 0): "
                                                  "it is UTF-16 text; save it as UTF-8")):
        read(str(path), None)
    if read is read_labelled:  # a few NULs in a text are kept (JSON has none unescaped)
        path.write_text(body.replace("1", "1\0"), encoding="utf-8")
        assert any("\0" in text for text, _ in read_labelled(str(path), None)[0])


def test_alpaca_and_chat_records():
    alpaca = [{"instruction": "Add", "input": "1 2", "output": "3"},
              {"instruction": "Say hi", "output": "hi"}]
    chats = parse_conversations(json.dumps(alpaca), "f")
    assert chats[0] == [{"role": "user", "content": "Add\n\n1 2"},
                        {"role": "assistant", "content": "3"}]
    assert chats[1][0]["content"] == "Say hi"
    jsonl = "\n".join(json.dumps({"messages": m}) for m in [
        [{"role": "system", "content": "terse"}, {"role": "user", "content": "q"},
         {"role": "assistant", "content": "a"}]])
    assert parse_conversations(jsonl, "f")[0][0]["role"] == "system"


@pytest.mark.parametrize("records, needle", [
    ([{"instruction": "a", "output": "b"}, {"instruction": "c", "input": ""}],
     "f record 2: missing key 'output'"),
    ([{"messages": [{"role": "user", "content": "x"}, {"role": "bot", "content": "y"}]}],
     "unknown role 'bot'"),
    ([{"messages": [{"role": "user", "content": "x"}]}], "f record 1: no assistant message"),
    ([["not", "a", "record"]], "f record 1: expected a JSON object, got an array"),
    # (Python's names for JSON's values: 'got NoneType', 'got str')
    ([{"instruction": "a", "output": "b"}, None], "f record 2: expected a JSON object, got null"),
    (["a record?"], "f record 1: expected a JSON object, got a string"),
    # keys that are not read were left out in silence: the input of this record was lost
    ([{"instruction": "a", "output": "b"}, {"instruction": "c", "Input": "d", "output": "e"}],
     "f record 2: key 'Input' is not read .*; did you mean 'input'\\?"),
    ([{"instruction": "a", "outputs": "b"}], "f record 1: key 'outputs' is not read"),
    # a blank reply or prompt was trained on: an empty output taught a reply of <|end|> alone
    ([{"instruction": "a", "output": "b"}, {"instruction": "c", "output": ""}],
     "f record 2: 'output' is empty: it would teach the model to reply with nothing; give it "
     "text or leave the record out"),
    ([{"instruction": " \n", "input": "x", "output": "b"}],
     "f record 1: 'instruction' is blank \\(whitespace only\\): it would teach the model to "
     "answer an empty prompt"),
    ([{"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": " "}]}],
     "f record 1, messages\\[1\\]: the assistant's content is blank"),
    ([{"messages": [{"role": "user", "content": ""}, {"role": "assistant", "content": "y"}]}],
     "f record 1, messages\\[0\\]: the user's content is empty"),
    # OpenAI's fine-tuning files mark a reply to learn nothing from with weight 0
    ([{"messages": [{"role": "user", "content": "x"},
                    {"role": "assistant", "content": "y", "weight": 0.5}]}],
     "f record 1, messages\\[1\\]: 'weight' must be 0 \\(no loss on this reply\\) or 1, got 0.5"),
    ([{"messages": [{"role": "user", "content": "x"},
                    {"role": "assistant", "content": "y", "weight": "0"}]}],
     "'weight' must be 0 .* got \"0\""),
    ([{"messages": [{"role": "user", "content": "x", "weight": 0},
                    {"role": "assistant", "content": "y"}]}],
     "f record 1, messages\\[0\\]: 'weight' is read on an assistant message only"),
    ([{"messages": [{"role": "user", "content": "x"},
                    {"role": "assistant", "content": "y", "weight": 0}]}],
     "f record 1: every assistant message has weight 0 \\(nothing to learn\\)"),
])
def test_bad_instruction_records_name_the_record(records, needle):
    with pytest.raises(DataError, match=needle):
        parse_conversations(json.dumps(records), "f")


def test_a_blank_system_message_or_input_passes():
    """Only a prompt and a reply must hold text: an Alpaca 'input' is often empty, and so
    may a system message be."""
    records = [{"instruction": "a", "input": "", "output": "b"},
               {"messages": [{"role": "system", "content": ""},
                             {"role": "user", "content": "x"},
                             {"role": "assistant", "content": "y"}]}]
    assert len(parse_conversations(json.dumps(records), "f")) == 2


def test_bad_instruction_records_are_named_in_a_users_words():
    """A JSONL line's error gave the decoder's place, 'line 1 column 43', after the file's
    'line 2'; a chat's message was 'record 1[0]'; two missing keys were 'missing key', and
    nothing said which keys the record had (Dolly's 'response', a completion's 'prompt')."""
    good, cut = json.dumps({"instruction": "a", "output": "b"}), '{"instruction": "c"'
    with pytest.raises(DataError) as caught:  # (the '}' it lacks is after its last column)
        parse_conversations(f"{good}\n{cut}\n", "f")
    assert str(caught.value) == "f line 2 is not valid JSON (Expecting ',' delimiter at " \
                                f"column {len(cut) + 1})"
    chat = {"messages": [{"role": "user", "content": "x"}, {"role": "bot", "content": "y"}]}
    with pytest.raises(DataError, match=re.escape("f record 1, messages[1]: unknown role")):
        parse_conversations(json.dumps([chat]), "f")
    with pytest.raises(DataError, match=re.escape(
            "f record 1: missing keys 'instruction' and 'output' (its keys: 'prompt', "
            "'completion'; an Alpaca record")):
        parse_conversations(json.dumps([{"prompt": "a", "completion": "b"}]), "f")
    with pytest.raises(DataError, match=re.escape(
            "f record 1: missing key 'output' (its keys: 'instruction', 'response';")):
        parse_conversations(json.dumps([{"instruction": "a", "response": "b"}]), "f")


def test_data_of_the_other_task_is_named_as_such():
    """Labelled text given to --task instruct was 'not valid JSON (Expecting value: line 1
    column 1 (char 0))', and a JSONL file given to --task classify 'no tab between the text
    and its label': each now says what the file reads as."""
    with pytest.raises(DataError, match=re.escape(
            "f line 1 is not valid JSON (Expecting value at column 1; a line of text<TAB>label "
            "is labelled text, for --task classify?)")):
        parse_conversations("good film\tpos\nawful\tneg\n", "f")
    with pytest.raises(DataError, match=re.escape(
            "line 1: no tab between the text and its label; it reads as JSON (instruction "
            "data, for --task instruct?)")):
        parse_labelled(json.dumps({"instruction": "a", "output": "b"}) + "\n", "f")
    with pytest.raises(DataError) as caught:  # a line that is neither has no hint
        parse_labelled("good film\n", "f")
    assert str(caught.value) == "line 1: no tab between the text and its label"


def test_a_dataset_s_own_keys_pass():
    """Keys unlike Alpaca's are a dataset's own (Hugging Face's Alpaca has 'text')."""
    records = [{"instruction": "a", "input": "b", "output": "c", "text": "a b c", "id": 7}]
    assert parse_conversations(json.dumps(records), "f")[0][0]["content"] == "a\n\nb"


@pytest.mark.parametrize("indent", [None, 2])
def test_a_file_that_is_one_json_object_is_named_so(indent):
    """Records wrapped in an object were 'line 1 is not valid JSON' (its first line read as
    JSONL), or, on one line, a record missing 'instruction' and 'output'."""
    records = [{"instruction": "a", "output": "b"}] * 2
    wrapped = json.dumps({"data": records}, indent=indent)
    with pytest.raises(DataError, match=re.escape(
            "f is one JSON object (keys: 'data'), not records: give a JSON list of records")
            + ".*is 'data' the list of records"):
        parse_conversations(wrapped, "f")
    # one record alone, written over several lines, is that record
    one = json.dumps(records[0], indent=indent)
    assert parse_conversations(one, "f") == parse_conversations(json.dumps(records[:1]), "f")


def test_a_marker_the_base_cannot_write_names_its_missing_characters():
    from scratchgpt.finetune.instruct import check_template_spelling

    tokenizer = CharTokenizer.train("abcdefghijklmnopqrstuvwxyz<>\n")
    with pytest.raises(DataError, match=re.escape("marker '<|system|>' (its vocabulary lacks "
                                                  "'|'); pretrain on text that contains")):
        check_template_spelling(tokenizer, TEMPLATE)


def test_splits_are_seeded_disjoint_and_stratified():
    labels = ["a"] * 90 + ["b"] * 10
    one = stratified_split(labels, (0.7, 0.1, 0.2), seed=3)
    assert one == stratified_split(labels, (0.7, 0.1, 0.2), seed=3)
    assert one != stratified_split(labels, (0.7, 0.1, 0.2), seed=4)
    assert sorted(i for s in one for i in s) == list(range(100))
    assert [sum(labels[i] == "b" for i in s) for s in one] == [7, 1, 2]
    train, held = random_split(50, 0.1, seed=0)
    assert len(held) == 5 and not set(train) & set(held)


def test_only_reply_tokens_are_targets():
    tok = CharTokenizer.train("<|system|>\n<|user|>\n<|assistant|>\n<|end|> "
                              "abcdefghijklmnopqrstuvwxyz?0123456789")
    messages = [{"role": "system", "content": "be brief"},
                {"role": "user", "content": "what is 2 plus 2?"},
                {"role": "assistant", "content": "4"},
                {"role": "user", "content": "and 3 plus 3?"},
                {"role": "assistant", "content": "6"}]
    example, replaced = encode_conversation(tok, TEMPLATE, messages)
    assert not replaced and tok.decode(example[0]) == TEMPLATE.render(messages, False)
    x, y = inputs_and_targets(example)
    assert x == example[0][:-1]
    targets = [t for t in y if t != IGNORE]
    assert tok.decode(targets) == "4<|end|>6<|end|>"  # the replies and their end markers
    # the prompt positions carry no loss: changing the logits there changes nothing
    torch.manual_seed(0)
    xb, yb = collate([example])
    logits = torch.randn(1, xb.size(1), tok.vocab_size, requires_grad=True)
    loss = response_loss(logits, yb)
    loss.backward()
    prompt_positions = yb[0] == IGNORE
    assert bool((logits.grad[0, prompt_positions] == 0).all())
    assert bool((logits.grad[0, ~prompt_positions].abs().sum(-1) > 0).all())
    moved = logits.detach().clone()
    moved[0, prompt_positions] += 5.0
    assert torch.equal(response_loss(moved, yb), loss.detach())


def test_a_reply_of_weight_0_is_in_the_text_but_no_target():
    """OpenAI's fine-tuning files keep a reply in the conversation but out of the loss with
    ``"weight": 0``: the key was not read, and such a reply was trained on in silence."""
    tok = CharTokenizer.train("<|system|>\n<|user|>\n<|assistant|>\n<|end|> "
                              "abcdefghijklmnopqrstuvwxyz?0123456789")
    turns = [{"role": "user", "content": "what is 2 plus 2?"},
             {"role": "assistant", "content": "5", "weight": 0},
             {"role": "user", "content": "and 3 plus 3?"},
             {"role": "assistant", "content": "6", "weight": 1}]
    chat = parse_conversations(json.dumps({"messages": turns}), "f")[0]
    assert [m.get("weight", 1) for m in chat if m["role"] == "assistant"] == [0, 1]
    example, _ = encode_conversation(tok, TEMPLATE, chat)
    plain = [{"role": m["role"], "content": m["content"]} for m in chat]
    assert tok.decode(example[0]) == TEMPLATE.render(plain, False)  # the text is unchanged
    targets = [t for t in inputs_and_targets(example)[1] if t != IGNORE]
    assert tok.decode(targets) == "6<|end|>"  # the weight-1 reply alone carries the loss
    assert tok.decode([t for t in inputs_and_targets(encode_conversation(
        tok, TEMPLATE, plain)[0])[1] if t != IGNORE]) == "5<|end|>6<|end|>"


def test_padding_is_no_target():
    tok = CharTokenizer.train("<|system|>\n<|user|>\n<|assistant|>\n<|end|> abcdefgh")
    short = encode_conversation(tok, TEMPLATE, [{"role": "user", "content": "a"},
                                                {"role": "assistant", "content": "b"}])[0]
    long = encode_conversation(tok, TEMPLATE, [{"role": "user", "content": "abcdefgh"},
                                               {"role": "assistant", "content": "hgfedcba"}])[0]
    x, y = collate([short, long], pad_id=0)
    n = len(short[0]) - 1
    assert bool((y[0, n:] == IGNORE).all()) and bool((x[0, n:] == 0).all())
    assert x.shape == y.shape == (2, len(long[0]) - 1)


@pytest.mark.parametrize("long_side, needle", [
    ("train", "none of the 2 training conversations has a reply within the first 64 tokens"),
    ("held", "none of the 2 held-out conversations has a reply within the first 64 tokens"),
    ("both", "no conversation has a reply within the first 64 tokens"),
])
def test_a_side_of_the_split_without_a_reply_is_named(tmp_path, long_side, needle):
    """Only the side whose prompts leave no reply in the context is blamed (the message said
    no conversation at all had one when the other side did)."""
    train, held = random_split(4, 0.5, seed=0)
    long = set(train) if long_side == "train" else set(held) if long_side == "held" \
        else set(range(4))
    records = [{"instruction": "a" * (80 if i in long else 1), "output": "b"} for i in range(4)]
    (tmp_path / "i.json").write_text(json.dumps(records))
    tok = CharTokenizer.train("<|system|>\n<|user|>\n<|assistant|>\n<|end|> ab")
    spec = InstructSpec(str(tmp_path / "i.json"), held_out=0.5)
    with pytest.raises(DataError, match=re.escape(needle)):
        load_data(spec, tok, block_size=64)


def _refusal(read, *args) -> str:
    with pytest.raises(DataError) as caught:
        read(*args)
    return str(caught.value)


def _bad_files(tmp_path):
    """A file of each kind a reader refuses, by name."""
    (tmp_path / "a-dir").mkdir()
    (tmp_path / "latin1.txt").write_bytes("café\n".encode("latin-1"))
    (tmp_path / "utf16.txt").write_bytes("café\n".encode("utf-16"))
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    (tmp_path / "dir-link").symlink_to(tmp_path / "a-dir")
    return ["missing.txt", "a-dir", "latin1.txt", "utf16.txt", "loop", "dir-link"]


def test_a_prompt_file_and_fine_tuning_data_are_refused_in_the_same_words(tmp_path,
                                                                         monkeypatch):
    """--prompt-file and --data (classify --file, --eval) read a file through one reader: a
    missing file, a directory, a symlink loop, bytes that are not UTF-8 were worded apart
    ('is a directory; name a text file' against 'is a directory, not a file', and the data's
    decoding error did not say 'data file')."""
    import argparse
    import io

    from scratchgpt.commands.prompts import read_prompt
    from scratchgpt.finetune.data import read_source

    def through_both(name: str) -> tuple[str, str]:
        prompt = _refusal(read_prompt, argparse.Namespace(prompt=None, prompt_file=name))
        return prompt.replace("prompt file", "data file", 1), _refusal(read_source, name, None)

    for name in _bad_files(tmp_path):
        as_prompt, as_data = through_both(str(tmp_path / name))
        assert as_prompt == as_data
        assert as_data.count(f"data file {tmp_path / name}") == 1
    # a link is read where it leads: to a folder, it is named as the folder is
    assert through_both(str(tmp_path / "dir-link"))[1].endswith("is a directory, not a file")
    assert "Too many levels of symbolic links" in through_both(str(tmp_path / "loop"))[1]
    monkeypatch.setattr("pathlib.Path.read_bytes", lambda self: (_ for _ in ()).throw(
        PermissionError(13, "Permission denied")))  # (tests run as root: chmod would not do)
    as_prompt, as_data = through_both(str(tmp_path / "latin1.txt"))
    assert as_prompt == as_data == f"cannot read data file {tmp_path / 'latin1.txt'}: " \
                                   "Permission denied"
    monkeypatch.undo()
    for raw in (b"ha\xffte\n", "hate\n".encode("utf-16")):  # standard input, read twice
        monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(raw)))
        as_prompt = _refusal(read_prompt, argparse.Namespace(prompt=None, prompt_file="-"))
        monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(raw)))
        assert as_prompt == _refusal(read_source, "-", None, True)
        assert as_prompt.startswith("standard input is not valid UTF-8 text")


@pytest.mark.parametrize(("spec", "setting", "says"), [
    ("classify", dict(class_weights="balance"), "{} must be one of none, balanced, got "
                                                "'balance'"),
    ("classify", dict(max_length=-1), "{} must be >= 0, got -1"),
    ("instruct", dict(held_out=1.5), "{} must be in (0, 1), got 1.5"),
    ("instruct", dict(max_length=-1), "{} must be >= 0, got -1"),
    ("instruct", dict(eval_generate=-2), "{} must be >= 0, got -2"),
])
def test_a_data_spec_names_the_setting_as_its_caller_gives_it(spec, setting, says):
    """ClassifySpec and InstructSpec named finetune's flags (--class-weights, --max-length,
    --held-out) to a Python caller, who gives keywords: they name the keyword by default and
    the flag where finetune builds them (options=FLAGS, as the run directory's refusals do);
    neither the record a run saves nor the comparison of two specs holds the options."""
    from dataclasses import asdict

    from scratchgpt.errors import ConfigError
    from scratchgpt.finetune.classify import ClassifySpec
    from scratchgpt.validation import FLAGS, flag_of

    cls = ClassifySpec if spec == "classify" else InstructSpec
    [(name, _)] = setting.items()
    for options, shown in (({}, name), ({"options": FLAGS}, flag_of(name))):
        with pytest.raises(ConfigError) as refused:
            cls(**setting, **options)
        assert str(refused.value) == says.format(shown)
    assert "options" not in asdict(cls(options=FLAGS)) and cls(options=FLAGS) == cls()
