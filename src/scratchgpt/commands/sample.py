"""``scratchgpt sample``: generate text from a trained checkpoint."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from scratchgpt.errors import ConfigError, DataError, GenerationError


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "sample", help="generate text from a checkpoint (streams to the terminal)",
        description="Generate text. Sampling knobs combine: temperature, then top-k, then top-p. "
                    "--temperature 0 is greedy; --beam N runs beam search instead of sampling.")
    p.add_argument("--checkpoint", required=True,
                   help="run directory, .pt file, Hugging Face GPT-2 directory, or hf:ID "
                        "for a hub model (hf:gpt2), downloaded once into the Hugging Face cache")
    p.add_argument("--which", choices=("best", "last"), default="best",
                   help="checkpoint of a run directory to use (default: best)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--prompt", default=None, help="text to continue (default: a newline)")
    src.add_argument("--prompt-file", default=None, help="read the prompt from this file")
    p.add_argument("--max-new-tokens", type=int, default=500, help="tokens to generate (500)")
    p.add_argument("--max-new-tokens-limit", type=int, default=100_000,
                   help="refuse --max-new-tokens above this (default 100000)")
    p.add_argument("--temperature", type=float, default=0.8,
                   help="softmax temperature; 0 = greedy (default 0.8)")
    p.add_argument("--top-k", type=int, default=None, help="keep the k most likely tokens")
    p.add_argument("--top-p", type=float, default=None,
                   help="nucleus: keep the most likely tokens up to this mass, in (0, 1]")
    p.add_argument("--beam", type=int, default=None, help="beam search with N beams")
    p.add_argument("--length-penalty", type=float, default=1.0,
                   help="beam score = logprob / length**penalty (default 1.0)")
    p.add_argument("--num-samples", type=int, default=1, help="independent samples (1)")
    p.add_argument("--seed", type=int, default=None, help="seed for reproducible samples")
    p.add_argument("--stop", action="append", default=[],
                   help="stop when this string is generated (repeatable); it is not printed")
    p.add_argument("--unknown", choices=("error", "replace"), default="error",
                   help="prompt characters missing from the vocabulary: error or replace")
    p.add_argument("--no-stream", action="store_true", help="print only when finished")
    p.add_argument("--threads", type=int, default=0,
                   help="CPU threads for torch (0 = torch's default, one per core)")
    p.add_argument("--batch-prompts", action="store_true",
                   help="with --prompt-file: every non-empty line is a separate prompt; all are "
                        "generated together as one left-padded batch, each row stopping on its "
                        "own (end-of-text or --stop), and printed in order, separated by lines "
                        "of dashes")
    p.add_argument("--dtype", choices=("fp32", "bf16", "int8"), default="fp32",
                   help="weights and KV cache precision; bf16 halves the memory traffic; int8 "
                        "stores weights as per-channel int8 (a quarter of fp32's bytes, "
                        "activations and KV cache fp32) (default fp32)")
    p.add_argument("--draft", default=None,
                   help="speculative sampling: a smaller model's run directory or .pt file, "
                        "trained with the same tokenizer; the output is distributed exactly as "
                        "the --checkpoint model's own samples")
    p.add_argument("--speculate", type=int, default=None, metavar="K",
                   help="draft tokens proposed per round with --draft (default 4)")
    p.set_defaults(func=run)


def read_prompt(args: argparse.Namespace) -> str:
    if args.prompt_file:
        try:
            return Path(args.prompt_file).read_text(encoding="utf-8")
        except FileNotFoundError:
            raise DataError(f"prompt file {args.prompt_file} does not exist") from None
        except UnicodeDecodeError:
            raise DataError(f"prompt file {args.prompt_file} is not UTF-8 text") from None
    return "\n" if args.prompt is None else args.prompt


def cut_at_stop(text: str, stops: list[str]) -> tuple[str, bool]:
    """Text up to the first stop string (exclusive), and whether one was found."""
    hits = [text.find(s) for s in stops if s and s in text]
    return (text[: min(hits)], True) if hits else (text, False)


class StreamPrinter:
    """Prints decoded text as tokens arrive. It holds back what could still become a stop
    string, or an incomplete multi-byte character, so nothing printed needs taking back."""

    def __init__(self, tokenizer, stops: list[str], out=None):
        self.tok, self.stops, self.out = tokenizer, stops, out or sys.stdout
        self.ids: list[int] = []
        self.printed = 0
        self.hold = max((len(s) for s in stops), default=1) - 1

    def text(self) -> str:
        return self.tok.decode(self.ids)

    def add(self, token: int) -> bool:
        """Add a token; returns True when a stop string has been reached."""
        self.ids.append(token)
        text, stopped = cut_at_stop(self.text(), self.stops)
        if stopped:
            self._emit(text)
            return True
        safe = len(text) - self.hold
        while safe > self.printed and text[safe - 1] == "\ufffd":
            safe -= 1  # an incomplete UTF-8 sequence decodes to U+FFFD: wait for more bytes
        if safe > self.printed:
            self._emit(text[:safe])
        return False

    def finish(self) -> str:
        text, _ = cut_at_stop(self.text(), self.stops)
        self._emit(text)
        return text

    def _emit(self, text: str) -> None:
        self.out.write(text[self.printed:])
        self.out.flush()
        self.printed = len(text)


def run(args: argparse.Namespace) -> int:
    import torch

    from scratchgpt.checkpoints import checkpoint_tokenizer, load_model
    from scratchgpt.generation.generate import beam_search, generate, stream
    from scratchgpt.generation.sampling import SamplingConfig
    from scratchgpt.models.fast_decode import prepare_for_decode

    if args.max_new_tokens < 1:
        raise ConfigError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    if args.max_new_tokens > args.max_new_tokens_limit:
        raise ConfigError(f"--max-new-tokens {args.max_new_tokens} exceeds the allowed "
                        f"{args.max_new_tokens_limit} (raise --max-new-tokens-limit)")
    if args.num_samples < 1:
        raise ConfigError(f"--num-samples must be >= 1, got {args.num_samples}")
    cfg = SamplingConfig(args.temperature, args.top_k, args.top_p)  # validates
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.batch_prompts and not args.prompt_file:
        raise ConfigError("--batch-prompts needs --prompt-file (one prompt per line)")
    if args.batch_prompts and args.beam:
        raise ConfigError("--batch-prompts does not combine with --beam")
    model, state = load_model(args.checkpoint, args.which)
    prepare_for_decode(model, args.dtype)  # cast or quantize, fast layout (models/fast_decode.py)
    tok = checkpoint_tokenizer(state)
    prompt_text = read_prompt(args)
    gen = torch.Generator().manual_seed(args.seed) if args.seed is not None else None
    if gen is not None:
        torch.manual_seed(args.seed)
    if args.batch_prompts:
        return run_batch(model, tok, [line for line in prompt_text.splitlines() if line.strip()],
                         cfg, gen, args)
    ids = tok.encode(prompt_text, unknown=args.unknown)
    if not ids:
        raise GenerationError("the prompt is empty after tokenization")
    prompt = torch.tensor([ids], dtype=torch.long)

    if args.draft is not None or args.speculate is not None:
        return run_speculative(args, model, tok, prompt_text, prompt, cfg, gen)

    if args.beam:
        hyps = beam_search(model, prompt, args.beam, args.max_new_tokens, args.length_penalty,
                           eos_id=tok.eot_id)
        for new_ids, score in hyps[: args.num_samples]:
            text, _ = cut_at_stop(tok.decode(new_ids), args.stop)
            print(prompt_text + text)
            print(f"--- beam score {score:.4f}", file=sys.stderr)
        return 0

    if args.num_samples == 1 and not args.no_stream:
        sys.stdout.write(prompt_text)
        printer = StreamPrinter(tok, args.stop)
        for token in stream(model, prompt, args.max_new_tokens, cfg, gen):
            if printer.add(int(token[0])) or token[0].item() == tok.eot_id:
                break
        printer.finish()
        sys.stdout.write("\n")
        return 0

    batch = prompt.expand(args.num_samples, -1)
    stopped = torch.zeros(args.num_samples, dtype=torch.bool)
    generated: list[list[int]] = [[] for _ in range(args.num_samples)]

    def on_token(token: torch.Tensor) -> bool:
        for i, t in enumerate(token.tolist()):
            if stopped[i]:
                continue
            generated[i].append(t)
            if t == tok.eot_id or cut_at_stop(tok.decode(generated[i]), args.stop)[1]:
                stopped[i] = True
        return bool(stopped.all())

    generate(model, batch, args.max_new_tokens, cfg, gen, on_token=on_token)
    for i, new_ids in enumerate(generated):
        if i:
            print("\n---------------")
        text, _ = cut_at_stop(tok.decode(new_ids), args.stop)
        print(prompt_text + text)
    return 0


def run_batch(model, tok, prompts: list[str], cfg, gen, args: argparse.Namespace) -> int:
    """Generate for every prompt (each ``--num-samples`` times) in one batch; print in order."""
    from scratchgpt.generation.generate import generate_batch

    if not prompts:
        raise DataError(f"prompt file {args.prompt_file} has no non-empty line")
    rows = [text for text in prompts for _ in range(args.num_samples)]
    ids = [tok.encode(text, unknown=args.unknown) for text in rows]
    if not all(ids):
        raise GenerationError("a prompt is empty after tokenization")

    def stop_check(b: int, new_ids: list[int]) -> bool:
        return bool(args.stop) and cut_at_stop(tok.decode(new_ids), args.stop)[1]

    out = generate_batch(model, ids, args.max_new_tokens, cfg, gen, eos_id=tok.eot_id,
                         stop_check=stop_check)
    for i, (text, new_ids) in enumerate(zip(rows, out, strict=True)):
        if i:
            print("\n---------------")
        if new_ids and new_ids[-1] == tok.eot_id:
            new_ids = new_ids[:-1]
        print(text + cut_at_stop(tok.decode(new_ids), args.stop)[0])
    return 0


def run_speculative(args: argparse.Namespace, model, tok, prompt_text: str, prompt,
                    cfg, gen) -> int:
    """``--draft``: stream one sample with speculative sampling; statistics go to stderr."""
    from scratchgpt.checkpoints import checkpoint_tokenizer, load_model
    from scratchgpt.generation.speculative import SpeculativeStats, check_pair, speculative_stream
    from scratchgpt.models.fast_decode import prepare_for_decode

    if args.draft is None:
        raise ConfigError("--speculate needs --draft (a smaller model with the same tokenizer)")
    if args.beam or args.num_samples != 1:
        raise ConfigError("--draft samples one sequence; it does not combine with --beam or "
                        "--num-samples")
    k = 4 if args.speculate is None else args.speculate
    if k < 1:
        raise ConfigError(f"--speculate must be >= 1, got {k}")
    draft, draft_state = load_model(args.draft, args.which)
    prepare_for_decode(draft, args.dtype)
    check_pair(model, draft, tok, checkpoint_tokenizer(draft_state))
    stats = SpeculativeStats(k)
    printer = StreamPrinter(tok, args.stop, out=_NullOut() if args.no_stream else None)
    if not args.no_stream:
        sys.stdout.write(prompt_text)
    for token in speculative_stream(model, draft, prompt, args.max_new_tokens, k, cfg, gen,
                                    stats):
        if printer.add(int(token[0])) or token[0].item() == tok.eot_id:
            break
    text = printer.finish()
    if args.no_stream:
        sys.stdout.write(prompt_text + text)
    sys.stdout.write("\n")
    print(f"--- speculative K={k}: {stats.rounds} rounds, {stats.mean_accepted:.2f} of {k} draft "
          f"tokens accepted per round, acceptance rate {stats.acceptance_rate:.2f}",
          file=sys.stderr)
    return 0


class _NullOut:
    def write(self, text: str) -> None:
        pass

    def flush(self) -> None:
        pass
