"""``scratchgpt sample``: generate text from a trained checkpoint."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable, Iterable, Sequence

from scratchgpt.commands.argtypes import (
    add_unknown_flag,
    add_which_flag,
    encode,
    finite_float,
    positive_int,
    seed_int,
    thread_count,
)
from scratchgpt.commands.prompts import (
    note_long_prompts,
    note_same_samples,
    note_wide_top_k,
    prompt_source,
    read_prompt,
    refuse_greedy_filters,
    unknown_characters,
)
from scratchgpt.errors import ConfigError, DataError, GenerationError
from scratchgpt.generation.printer import StreamPrinter, line_ended_if_stopped
from scratchgpt.generation.stopping import MAX_NEW_TOKENS
from scratchgpt.wording import plural

TEMPERATURE = 0.8  # when --temperature is not given (beam search takes none)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "sample", help="generate text from a checkpoint (streams to the terminal)",
        description="Generate text. Sampling knobs combine: temperature, then top-k, then top-p. "
                    "--temperature 0 is greedy; --beam N runs beam search instead of sampling. "
                    "Without a prompt, generation starts from the beginning-of-text token "
                    "(GPT-2's <|endoftext|>) or, for character models, a newline (a space if "
                    "the vocabulary has no newline).")
    p.add_argument("--checkpoint", required=True,
                   help="run directory, .pt file, Hugging Face GPT-2 directory, or hf:ID "
                        "for a hub model (hf:gpt2), downloaded once into the Hugging Face cache")
    add_which_flag(p)
    src = p.add_mutually_exclusive_group()
    src.add_argument("--prompt", default=None,
                     help="text to continue (default: none, unconditional generation)")
    src.add_argument("--prompt-file", default=None,
                     help="read the prompt from this UTF-8 file (-: standard input)")
    p.add_argument("--max-new-tokens", type=int, default=500, help="tokens to generate (500)")
    p.add_argument("--max-new-tokens-limit", type=positive_int, default=MAX_NEW_TOKENS,
                   help="refuse --max-new-tokens above this (default 100000)")
    p.add_argument("--temperature", type=float, default=None,
                   help=f"softmax temperature; 0 = greedy (default {TEMPERATURE})")
    p.add_argument("--top-k", type=int, default=None,
                   help="keep the k most likely tokens (0, not given, or more than the "
                        "vocabulary: all of them)")
    p.add_argument("--top-p", type=float, default=None,
                   help="nucleus: keep the most likely tokens up to this mass, in (0, 1]")
    p.add_argument("--beam", type=int, default=None,
                   help="beam search with N >= 1 beams (deterministic; prints the best "
                        "--num-samples hypotheses, at most N, separated by lines of dashes, "
                        "each one's score on stderr)")
    p.add_argument("--length-penalty", type=finite_float, default=None,
                   help="with --beam: beam score = logprob / length**penalty, from -20 to 20 "
                        "(default 1.0)")
    p.add_argument("--num-samples", type=int, default=1,
                   help="independent samples, generated together as one batch (1)")
    p.add_argument("--num-samples-limit", type=positive_int, default=1000,
                   help="refuse --num-samples above this (default 1000)")
    p.add_argument("--seed", type=seed_int, default=None, help="seed for reproducible samples")
    p.add_argument("--stop", action="append", default=[],
                   help="stop when this string is generated (repeatable); it is not printed")
    p.add_argument("--chat", action="store_true",
                   help="the prompt is a user message to an instruction-tuned model: it is "
                        "written with the model's chat template and generation stops at the "
                        "end of the reply")
    p.add_argument("--system", default=None, help="with --chat: a system message first")
    add_unknown_flag(p, "prompt")
    p.add_argument("--no-stream", action="store_true", help="print only when finished")
    p.add_argument("--threads", type=thread_count, default=0,
                   help="CPU threads for torch (0 = automatic: 1 for a small model, whose "
                        "decode steps are too short to share out, else torch's default, one "
                        "per core)")
    p.add_argument("--batch-prompts", action="store_true",
                   help="with --prompt-file: every non-empty line is a separate prompt; all are "
                        "generated together as one left-padded batch, each row stopping on its "
                        "own (end-of-text or --stop), and printed in order, separated by lines "
                        "of dashes")
    p.add_argument("--dtype", choices=("fp32", "bf16", "int8"), default="fp32",
                   help="weights and KV cache precision; bf16 halves the memory traffic; int8 "
                        "stores weights as per-channel int8 (a quarter of fp32's bytes, "
                        "activations and KV cache fp32) (default fp32). On CPUs with AVX-512 "
                        "each decode step runs as one C call in any of them "
                        "(SCRATCHGPT_DECODE_KERNEL=torch: PyTorch's step)")
    p.add_argument("--compile", action="store_true",
                   help="run each one-token decode step as one torch.compile'd graph instead "
                        "of the default step: one sequence at a time; small fp32 GPT models "
                        "(at most 16 MiB of weights); needs a C++ compiler. For CPUs without "
                        "AVX-512, where the default step is PyTorch's: ~1.7x faster steps "
                        "after a one-time compile of ~10-25 s (a few seconds once cached). "
                        "With AVX-512 the default step (one C call a token) is faster still. "
                        "With --draft DIR it compiles whichever of the pair can be (a large "
                        "target stays eager, its small draft compiles)")
    p.add_argument("--engine", choices=("torch", "numpy"), default="torch",
                   help="torch (default), or numpy: the plain NumPy forward pass of "
                        "models/gpt_numpy.py, GPT checkpoints only, no KV cache (slow; the "
                        "readable specification; same greedy text)")
    p.add_argument("--draft", default=None,
                   help="speculative sampling: a smaller model's run directory or .pt file, "
                        "trained with the same tokenizer, or 'ngram' (prompt lookup: draft "
                        "tokens copied from an earlier occurrence of the last few tokens; no "
                        "model). The output is distributed exactly as the --checkpoint model's "
                        "own samples")
    p.add_argument("--draft-dtype", choices=("fp32", "bf16", "int8"), default=None,
                   help="the draft model's precision (default: --dtype); e.g. a bf16 target "
                        "with an fp32 draft whose steps --compile compiles")
    p.add_argument("--speculate", default=None, metavar="K|auto",
                   help="draft tokens proposed per round with --draft (default 4); 'auto' "
                        "picks K every round from the running acceptance rate and the measured "
                        "draft and scoring costs (then a --seed run is exact in distribution "
                        "but not reproducible token for token, except greedy)")
    p.set_defaults(func=run)


def check_args(args: argparse.Namespace) -> None:
    """Flag values and combinations that cannot work (ConfigError)."""
    _check_counts(args)
    if any(stop == "" for stop in args.stop):
        raise ConfigError("--stop needs a non-empty string (an empty one would stop at once)")
    if args.batch_prompts and not args.prompt_file:
        raise ConfigError("--batch-prompts needs --prompt-file (one prompt per line)")
    if args.system and not args.chat:
        raise ConfigError("--system goes with --chat")
    if args.chat and args.batch_prompts:
        raise ConfigError("--chat takes one prompt; it does not combine with --batch-prompts")
    if args.batch_prompts and (args.beam or args.draft):
        raise ConfigError("--batch-prompts does not combine with --beam or --draft")
    if args.engine == "numpy" and args.dtype != "fp32":
        raise ConfigError("--engine numpy computes in float64; it takes no --dtype")
    if args.compile and args.engine == "numpy":
        raise ConfigError("--compile compiles the torch engine; it takes no --engine numpy")
    if args.compile and (args.num_samples != 1 or args.batch_prompts or args.beam):
        raise ConfigError("--compile speeds up one sequence at a time (batch 1); it does not "
                          "combine with --num-samples, --batch-prompts or --beam")
    if args.speculate is not None and args.draft is None:
        raise ConfigError("--speculate needs --draft (a smaller model with the same "
                          "tokenizer, or 'ngram')")
    if args.draft_dtype is not None and args.draft in (None, "ngram"):
        raise ConfigError("--draft-dtype needs --draft with a draft model")
    if args.draft is not None and (args.beam or args.num_samples != 1):
        raise ConfigError("--draft samples one sequence; it does not combine with --beam or "
                          "--num-samples")
    speculate_k(args)


def _check_counts(args: argparse.Namespace) -> None:
    if args.max_new_tokens < 1:
        raise ConfigError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    if args.max_new_tokens > args.max_new_tokens_limit:
        raise ConfigError(f"--max-new-tokens {args.max_new_tokens} exceeds the allowed "
                          f"{args.max_new_tokens_limit} (raise --max-new-tokens-limit)")
    if args.num_samples < 1:
        raise ConfigError(f"--num-samples must be >= 1, got {args.num_samples}")
    if args.num_samples > args.num_samples_limit:
        raise ConfigError(f"--num-samples {args.num_samples} exceeds the allowed "
                          f"{args.num_samples_limit} (raise --num-samples-limit)")
    if args.beam is not None:
        _check_beam(args)
    elif args.length_penalty is not None:
        raise ConfigError("--length-penalty scores beam search's hypotheses; it goes with --beam")
    else:
        refuse_greedy_filters(args.temperature, args.top_k, args.top_p)


def _check_beam(args: argparse.Namespace) -> None:
    from scratchgpt.generation.beam import check_length_penalty

    if args.length_penalty is not None:
        check_length_penalty(args.length_penalty, "--length-penalty")
    if args.beam < 1:
        raise ConfigError(f"--beam must be >= 1, got {args.beam} (leave it out to sample)")
    if args.num_samples > args.beam:
        raise ConfigError(f"--num-samples {args.num_samples} exceeds --beam {args.beam}: beam "
                          "search keeps that many hypotheses (raise --beam)")
    if args.temperature is not None or args.top_k or args.top_p is not None:
        raise ConfigError("--beam searches for the likeliest text and draws nothing: "
                          "--temperature, --top-k and --top-p do not apply to it")


def speculate_k(args: argparse.Namespace):
    """``--speculate`` as a K policy: FixedK(K) or AutoK()."""
    from scratchgpt.generation.policy import AutoK, FixedK

    if args.speculate == "auto":
        return AutoK()
    try:
        k = 4 if args.speculate is None else int(args.speculate)
    except ValueError:
        raise ConfigError(f"--speculate takes a number or 'auto', got {args.speculate!r}") from None
    if k < 1:
        raise ConfigError(f"--speculate must be >= 1, got {k}")
    return FixedK(k)


def load_for_decoding(path: str, args: argparse.Namespace, engine: str = "torch",
                      dtype: str | None = None, compile_required: bool = True):
    """(model ready to decode, tokenizer) of a checkpoint: dtype, decode layout or engine."""
    return load_source_for_decoding(path, args, engine, dtype, compile_required)[:2]


def load_source_for_decoding(path: str, args: argparse.Namespace, engine: str = "torch",
                             dtype: str | None = None, compile_required: bool = True):
    """(model ready to decode, tokenizer, ModelSource) of a checkpoint, in ``dtype`` (default
    ``--dtype``). With ``--compile`` a model that cannot decode compiled is refused, or, if
    not ``compile_required``, decodes eager. A model with NaN or infinite weights is refused."""
    from scratchgpt.checkpoints import checkpoint_tokenizer
    from scratchgpt.checkpoints.io import load_for_generation
    from scratchgpt.generation.numpy_engine import NumpyGPT
    from scratchgpt.models.compiled import prepare_compiled
    from scratchgpt.models.fast_decode import prepare_for_decode

    model, source = load_for_generation(path, args.which, "sample")
    check_finite(model, source.path)
    if engine == "numpy":
        return NumpyGPT(model), checkpoint_tokenizer(source), source
    # cast or quantize, then the fastest weight layout (models/fast_decode.py)
    dtype = dtype or args.dtype
    if getattr(args, "compile", False):
        model = prepare_compiled(model, dtype, compile_required)
    else:
        model = prepare_for_decode(model, dtype)
    return model, checkpoint_tokenizer(source), source


def chat_prompt(args: argparse.Namespace, source, tok, text: str | None, rule):
    """``--chat``: (prompt text, its ids, the stop rule, the model's chat template)."""
    import dataclasses

    from scratchgpt.chat import system_message, template_for
    from scratchgpt.finetune.instruct import encode_conversation

    template = template_for(source)
    if template is None:
        raise ConfigError(f"--chat: {args.checkpoint} was not instruction-tuned (it names "
                          "no chat template)")
    if not text:
        raise ConfigError("--chat needs a prompt (the user's message)")
    args.system = system_message(args.system)  # (a blank one: no system turn)
    for what, content in (("--system", args.system), ("the prompt", text)):
        if content and (problem := chat_text_problem(tok, template, content, args.unknown)):
            raise ConfigError(f"--chat: {what} {problem}")
    messages = ([{"role": "system", "content": args.system}] if args.system else []) + \
        [{"role": "user", "content": text}]
    (ids, _), _ = encode_conversation(tok, template, messages, add_generation_prompt=True)
    # the end marker, or another turn's marker a model that has not learned to end its turn
    # goes on to write: its reply ends there, as chat's and serve's do
    rule = dataclasses.replace(rule, stop_strings=(*rule.stop_strings, *template.reply_stops))
    return template.render(messages), ids, rule, template


def chat_text_problem(tok, template, content: str, unknown: str) -> str | None:
    """What keeps ``content`` out of a ``--chat`` prompt, as chat finds it (a marker of the
    template, or, unless ``--unknown replace``, characters the tokenizer cannot write), or
    None."""
    if problem := template.marker_in(content):
        return problem
    if unknown == "error" and (problem := unknown_characters(tok, content)):
        return f"{problem} (or use --unknown replace to substitute them)"
    return None


def check_finite(model, where) -> None:
    import torch

    if not all(bool(torch.isfinite(p).all()) for p in model.parameters()):
        raise GenerationError(f"{where}: the model's weights hold NaN or infinite values (a "
                              "run that diverged?); sampling it would give no text")


def check_memory(model, rows: int, length: int) -> None:
    """The KV caches of ``rows`` sequences of ``length`` tokens fit in memory (see
    scratchgpt.memory), before a batch is built."""
    from scratchgpt import memory

    estimate = memory.inference_estimate(model.config, rows, length)
    memory.check_fits(estimate, f"generating {plural(rows, 'sequence', grouped=True)}",
                      error=GenerationError)


def run(args: argparse.Namespace) -> int:
    import torch

    from scratchgpt.generation.prompt import start_of_text
    from scratchgpt.generation.sampling import SamplingConfig
    from scratchgpt.generation.stopping import StopRule
    from scratchgpt.models.fast_decode import decode_threads

    check_args(args)
    cfg = SamplingConfig(TEMPERATURE if args.temperature is None else args.temperature,
                         args.top_k, args.top_p)  # validates
    text = read_prompt(args)  # (a prompt file it cannot read is refused before any work)
    if args.threads:
        torch.set_num_threads(args.threads)
    pair = args.draft not in (None, "ngram")  # with a draft model, either may compile
    model, tok, source = load_source_for_decoding(args.checkpoint, args, args.engine,
                                                  compile_required=not pair)
    check_stops(tok, args.stop)
    if not args.threads:
        torch.set_num_threads(decode_threads(model))
    warm_up(model)
    if args.seed is not None:
        torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed) if args.seed is not None else None
    rule = StopRule(args.max_new_tokens, tok.eot_id, tuple(args.stop), tok.decode)
    if args.batch_prompts:
        from scratchgpt.data.sources import text_lines  # (lines as an editor ends them)

        return run_batch(model, tok, text_lines(text), rule, cfg, gen, args)
    template = None
    if args.chat:
        text, ids, rule, template = chat_prompt(args, source, tok, text, rule)
    else:
        ids = encode(tok, text, args.unknown) if text else []
    if not ids:
        ids, text = start_of_text(tok)  # unconditional
    check_memory(model, max(args.num_samples, args.beam or 1), len(ids) + args.max_new_tokens)
    job = Job(model, tok, text, ids, rule, cfg, gen, template)
    note_long_prompts(model, [len(ids)])  # (beam search, too, reads the last context tokens)
    if args.draft is not None:
        return run_speculative(job, args)
    if args.beam:
        return run_beam(job, args)
    note_wide_top_k(model, args.top_k)  # (after every refusal: a refusal is one line)
    note_same_samples(args.temperature, args.num_samples)
    if args.num_samples == 1 and not args.no_stream:
        return run_stream(job)
    return run_samples(job, args.num_samples)


def check_stops(tok, stops: list[str]) -> None:
    """A ``--stop`` string with characters the vocabulary lacks can never be generated."""
    for stop in stops:
        if tok.unknown_count(stop):
            raise ConfigError(f"--stop {stop!r} can never be generated: the model's vocabulary "
                              "lacks some of its characters")


def warm_up(model) -> None:
    """Compile a ``--compile`` model's step now (with the threads it will run on), saying so,
    rather than pausing at its first token."""
    from scratchgpt.models.compiled import CompiledGPT

    if isinstance(model, CompiledGPT):
        print("compiling the decode step (once per process: ~10-25 s, a few once cached)",
              file=sys.stderr, flush=True)
        model.warm_up()


class Job:
    """What every way of sampling needs: the model, the tokenizer, the prompt (text and ids),
    the stop rule, the sampling settings, the random generator and, with ``--chat``, the chat
    ``template``: then a row's new tokens are a reply, shown as ``chat`` and ``serve`` show
    it, streamed or whole (serve/reply.py: a reply cut short while writing a marker of the
    template leaves out the part of it that it wrote)."""

    def __init__(self, model, tok, text: str, ids: list[int], rule, cfg, gen, template=None):
        self.model, self.tok, self.text, self.ids = model, tok, text, ids
        self.rule, self.cfg, self.gen, self.template = rule, cfg, gen, template

    def text_of(self, new_ids: Sequence[int]) -> str:
        """The text a row's new tokens are shown as."""
        from scratchgpt.serve.reply import reply_text

        return self.rule.text(new_ids) if self.template is None else \
            reply_text(self.rule, self.template, new_ids)

    def printer(self) -> StreamPrinter:
        """A printer that streams a row's text as :meth:`text_of` shows it whole."""
        from scratchgpt.serve.reply import ReplyText

        return StreamPrinter(self.rule, text=None if self.template is None else
                             ReplyText(self.rule, self.template))

    def prompt(self):
        import torch

        return torch.tensor([self.ids], dtype=torch.long)


def run_stream(job: Job) -> int:
    """One sample, printed as it is generated."""
    from scratchgpt.generation.generate import stream

    tokens = stream(job.model, job.prompt(), job.rule, job.cfg, job.gen)
    print_streamed(job, (int(t[0]) for t in tokens))
    return 0


def print_streamed(job: Job, tokens: Iterable[int]) -> None:
    """The prompt, then the text of ``tokens`` as they come. Ctrl-C or SIGTERM writes the
    text held back for a stop string too before it ends the line."""
    sys.stdout.write(job.text)
    printer = job.printer()
    with line_ended_if_stopped(printer):
        for token in tokens:
            printer.add(token)
    printer.finish()
    sys.stdout.write("\n")


def print_all(texts: list[str], notes: Sequence[str | None] | None = None) -> None:
    """The texts, separated by lines of dashes; each one's note (if any) on stderr after it."""
    for i, text in enumerate(texts):
        if i:
            print("\n---------------")
        print(text, flush=notes is not None)
        if notes is not None and notes[i] is not None:
            print(notes[i], file=sys.stderr, flush=True)


def print_samples(texts: list[str], fill: Callable[[list[list[int]]], object], rule,
                  text_of: Callable[[list[int]], str] | None = None) -> None:
    """Each prompt text with its row's new tokens, which ``fill`` appends to the lists it is
    given (one a text) as they are generated, printed once all rows have stopped, as
    ``text_of`` shows them (default ``rule.text``). Ctrl-C or SIGTERM prints what there is
    before the command ends: finished samples as they are, the others as far as they got,
    each with a note on stderr that it was cut off."""
    out: list[list[int]] = [[] for _ in texts]
    shown = text_of or rule.text
    try:
        fill(out)
    except KeyboardInterrupt:
        if any(out):
            print_all([text + shown(ids) for text, ids in zip(texts, out, strict=True)],
                      [None if rule.done(ids) else
                       f"--- cut off after {plural(len(ids), 'new token')}" for ids in out])
        raise
    print_all([text + shown(ids) for text, ids in zip(texts, out, strict=True)])


def run_samples(job: Job, n: int) -> int:
    """``n`` samples of one prompt, generated as one batch; each stops on its own."""
    from scratchgpt.generation.generate import generate_batch

    print_samples([job.text] * n, lambda out: generate_batch(
        job.model, [job.ids] * n, job.rule, job.cfg, job.gen, out=out), job.rule, job.text_of)
    return 0


def run_beam(job: Job, args: argparse.Namespace) -> int:
    from scratchgpt.generation.beam import beam_search

    penalty = 1.0 if args.length_penalty is None else args.length_penalty
    so_far: list[tuple[list[int], float]] = []
    try:
        hyps = beam_search(job.model, job.prompt(), args.beam, job.rule, penalty,
                           out=so_far)[: args.num_samples]
    except KeyboardInterrupt:
        print_so_far(job, so_far[: args.num_samples])
        raise
    if len(hyps) < args.num_samples:
        note_few_hypotheses(job.model, len(hyps), args)
    print_all([job.text + job.text_of(new_ids) for new_ids, _ in hyps],
              [f"--- beam score {score:.4f}" for _, score in hyps])
    return 0


def print_so_far(job: Job, hyps: list[tuple[list[int], float]]) -> None:
    """Ctrl-C or SIGTERM stopped the search: its --num-samples best hypotheses so far (the
    ended ones, best first, then the live beams, best first, each noted as cut off on
    stderr), as ``print_samples`` prints samples stopped part-way; nothing before the first
    step."""
    notes = []
    for rank, (new_ids, score) in enumerate(hyps):
        cut = "" if job.rule.done(new_ids) else \
            f", cut off after {plural(len(new_ids), 'new token')}"
        notes.append(f"--- beam score {score:.4f}, the {'next ' if rank else ''}best so "
                     f"far{cut}")
    print_all([job.text + job.text_of(new_ids) for new_ids, _ in hyps], notes)


def note_few_hypotheses(model, found: int, args: argparse.Namespace) -> None:
    """Beam search found fewer hypotheses than --num-samples asks for: say so on stderr,
    and why when the vocabulary holds no more continuations of --max-new-tokens tokens (a
    --beam wider than the vocabulary, over few tokens)."""
    from scratchgpt.generation.decode import vocab_size

    vocab, n, why = vocab_size(model), args.max_new_tokens, ""
    # (vocab ** n is computed only where it is small: n may be 100,000)
    if vocab is not None and n * math.log(vocab) <= math.log(args.num_samples) + 1 and \
            vocab ** n < args.num_samples:
        why = (f": a vocabulary of {vocab} tokens has only {vocab ** n} continuations of "
               f"{plural(n, 'token')}")
    print(f"note: beam search found {plural(found, 'hypothesis', 'hypotheses')}, fewer than "
          f"--num-samples {args.num_samples}{why}", file=sys.stderr)


def run_batch(model, tok, lines: list[str], rule, cfg, gen, args: argparse.Namespace) -> int:
    """Generate for every prompt line (each ``--num-samples`` times) in one left-padded batch;
    print in order."""
    from scratchgpt.generation.generate import generate_batch
    from scratchgpt.generation.prompt import start_of_text

    numbered = [(n, line) for n, line in enumerate(lines, 1) if line.strip()]
    if not numbered:
        raise DataError(f"{prompt_source(args.prompt_file)} has no non-empty line")
    encoded = [encode_line(tok, line, args, n) or start_of_text(tok)[0] for n, line in numbered]
    rows = [line for _, line in numbered for _ in range(args.num_samples)]
    ids = [x for x in encoded for _ in range(args.num_samples)]
    check_memory(model, len(rows), max(map(len, ids)) + args.max_new_tokens)
    note_long_prompts(model, [len(x) for x in ids])
    note_wide_top_k(model, args.top_k)
    note_same_samples(args.temperature, args.num_samples)
    print_samples(rows, lambda out: generate_batch(model, ids, rule, cfg, gen, out=out), rule)
    return 0


def encode_line(tok, line: str, args: argparse.Namespace, n: int) -> list[int]:
    """A prompt file's line ``n`` as token ids (``--unknown``); a refusal names the line."""
    from scratchgpt.errors import TokenizerError

    try:
        return encode(tok, line, args.unknown)
    except TokenizerError as e:
        raise TokenizerError(f"{prompt_source(args.prompt_file)}, line {n}: {e}") from None


def run_speculative(job: Job, args: argparse.Namespace) -> int:
    """``--draft``: one sample with speculative sampling; statistics go to stderr."""
    from scratchgpt.generation.drafters import NgramDrafter
    from scratchgpt.generation.speculative import SpeculativeDecoder, check_pair

    policy = speculate_k(args)
    if args.draft == "ngram":
        draft = NgramDrafter()
    else:
        draft, draft_tok = load_draft(args)
        check_pair(job.model, draft, job.tok, draft_tok)
        check_compiled_pair(job.model, draft, args)
        warm_up(draft)
    dec = SpeculativeDecoder(job.model, draft, job.prompt(), policy, job.cfg, job.gen)
    note_wide_top_k(job.model, args.top_k)
    if args.no_stream:
        def fill(out: list[list[int]]) -> None:
            for t in dec.stream(job.rule):
                out[0].append(t)

        print_samples([job.text], fill, job.rule, job.text_of)
    else:
        print_streamed(job, dec.stream(job.rule))
    st = dec.stats
    picked = getattr(policy, "history", None)
    chosen = (f"K picked per round: mean {sum(picked) / max(len(picked), 1):.2f}"
              if picked is not None else f"K={policy.k}")
    print(f"--- speculative ({args.draft if args.draft == 'ngram' else 'draft model'}, "
          f"{chosen}): {plural(st.rounds, 'round')}, {st.mean_drafted:.2f} draft tokens "
          f"proposed and {st.mean_accepted:.2f} accepted per round; {st.acceptance_rate:.2f} "
          "tokens decoded per position the model scored (the acceptance rate r, each round's "
          "bonus token counted)", file=sys.stderr)
    return 0


def load_draft(args: argparse.Namespace):
    """(the ``--draft`` model ready to decode, its tokenizer); a refusal of it names the flag:
    "checkpoint X does not exist" left the user to guess which of the two checkpoints."""
    from scratchgpt.errors import naming

    with naming("--draft"):
        return load_for_decoding(args.draft, args, dtype=args.draft_dtype,
                                 compile_required=False)


def check_compiled_pair(target, draft, args: argparse.Namespace) -> None:
    """``--compile`` with a draft model compiles whichever of the two can be (typically the
    small draft; a large target's step is bound by its products); one of them must."""
    from scratchgpt.models.compiled import CompiledGPT, compile_refusal

    if not args.compile:
        return
    compiled = [m for m in (target, draft) if isinstance(m, CompiledGPT)]
    if not compiled:
        raise ConfigError(f"--compile: neither model can decode compiled "
                          f"({compile_refusal(draft)})")
    if not isinstance(target, CompiledGPT):
        print(f"--compile: the draft's steps are compiled; the target's stay eager "
              f"({compile_refusal(target)})", file=sys.stderr)
