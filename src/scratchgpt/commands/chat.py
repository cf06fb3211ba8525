"""``scratchgpt chat``: a multi-turn conversation with an instruction-tuned model."""

from __future__ import annotations

import argparse
import re
import sys

from scratchgpt.commands.argtypes import add_which_flag, seed_int
from scratchgpt.commands.prompts import (
    note_wide_top_k,
    refuse_greedy_filters,
    unknown_characters,
)
from scratchgpt.errors import ConfigError, ScratchGPTError, Terminated
from scratchgpt.wording import plural

HELP_LINE = ("(Ctrl-C stops a reply, /reset starts over, /exit or Ctrl-D ends, /help lists "
             "these)")
COMMANDS = {"/reset": "forget the conversation (the --system message stays)",
            "/exit": "end the chat (also /quit, or Ctrl-D)", "/help": "this list",
            "//word": "send '/word' as a message (the first '/' is dropped)"}


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "chat", help="talk with a model made by 'finetune --task instruct' (streams replies)",
        description="A read-eval-print loop: each line you type is a user message; the reply "
                    "streams as it is generated, written with the model's own chat template "
                    "(the one it was fine-tuned with), and stops at the template's end marker "
                    "(<|end|>) or another turn's marker (<|user|>), the end-of-text token or "
                    "--max-new-tokens. The conversation is "
                    "kept: each reply sees the earlier turns (the oldest are dropped when they "
                    "no longer fit the context). " + HELP_LINE)
    p.add_argument("--checkpoint", required=True,
                   help="an instruction-tuned run directory, .pt file or adapter.pt")
    add_which_flag(p)
    p.add_argument("--system", default=None, help="a system message that opens the chat")
    p.add_argument("--max-new-tokens", type=int, default=256,
                   help="longest reply in tokens (default 256; at most 100,000)")
    p.add_argument("--temperature", type=float, default=0.7,
                   help="softmax temperature; 0 = greedy (default 0.7)")
    p.add_argument("--top-k", type=int, default=None, help="keep the k most likely tokens")
    p.add_argument("--top-p", type=float, default=None, help="nucleus sampling mass")
    p.add_argument("--seed", type=seed_int, default=None, help="seed for reproducible replies")
    p.add_argument("--dtype", choices=("fp32", "bf16", "int8"), default="fp32",
                   help="inference precision (see sample --dtype)")
    p.add_argument("--stats", action="store_true",
                   help="after each reply, print its length and what ended it (stderr)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import torch

    from scratchgpt.chat import system_message, template_for
    from scratchgpt.checkpoints.io import load_for_generation
    from scratchgpt.generation.sampling import SamplingConfig
    from scratchgpt.generation.stopping import MAX_NEW_TOKENS
    from scratchgpt.models.fast_decode import prepare_for_decode
    from scratchgpt.validation import check_range

    # sample's bound: past it a typo is the likelier cause (a reply of 10**9 tokens ran on)
    check_range("--max-new-tokens", args.max_new_tokens, 1, MAX_NEW_TOKENS)
    refuse_greedy_filters(args.temperature, args.top_k, args.top_p)
    cfg = SamplingConfig(args.temperature, args.top_k, args.top_p)
    model, source = load_for_generation(args.checkpoint, args.which, "chat")
    template = template_for(source)
    if template is None:
        raise ConfigError(f"{args.checkpoint} was not instruction-tuned (it names no chat "
                          "template); make a chat model with scratchgpt finetune "
                          "--task instruct")
    tokenizer = source.tokenizer()
    args.system = system_message(args.system)  # (a blank one was sent: a turn of spaces)
    if args.system and (problem := template.marker_in(args.system)
                        or unknown_characters(tokenizer, args.system)):
        raise ConfigError(f"--system {problem}")
    note_wide_top_k(model, args.top_k)
    gen = torch.Generator().manual_seed(args.seed) if args.seed is not None else None
    session = ChatSession(prepare_for_decode(model, args.dtype), tokenizer, template, cfg, gen,
                          args)
    return session.loop()


class ChatSession:
    """The conversation so far, and one reply at a time streamed to stdout."""

    def __init__(self, model, tokenizer, template, cfg, generator, args: argparse.Namespace):
        self.model, self.tok, self.template = model, tokenizer, template
        self.cfg, self.gen, self.args = cfg, generator, args
        self.interactive = sys.stdin.isatty()
        self.reset()

    def reset(self) -> None:
        self.messages = ([{"role": "system", "content": self.args.system}]
                         if self.args.system else [])

    def loop(self) -> int:
        if self.interactive:
            print(f"chat with {self.args.checkpoint} {HELP_LINE}")
        while True:
            line = self._read()
            text = "" if line is None else line.strip()
            if line is None or text in ("/exit", "/quit"):
                return 0
            if re.fullmatch(r"/[A-Za-z]+", text):  # (a longer line is a message)
                self.command(text)
            elif text:
                self.turn(text[1:] if re.fullmatch(r"//[A-Za-z]+", text) else text)

    def command(self, text: str) -> None:
        """A line that is one '/word': /reset, /help, or a note that the command is unknown
        (it is not sent to the model as a message)."""
        if text == "/reset":  # (at a terminal it said nothing: the prompt came back as if
            self.reset()      # the line was lost; piped, the output stays the replies alone)
            if self.interactive:
                kept = "; the --system message stays" if self.args.system else ""
                print(f"(a new conversation: the earlier turns are forgotten{kept})")
        elif text == "/help":
            for name, what in COMMANDS.items():
                print(f"  {name:<7} {what}")
        else:
            print(f"unknown command {text!r}: /help lists the commands; to send it as a "
                  f"message, write /{text}", file=sys.stderr)

    def _read(self) -> str | None:
        if self.interactive:
            try:
                return input("you> ")
            except EOFError:
                print()
                return None
        line = sys.stdin.readline()
        return line if line else None

    def turn(self, text: str) -> None:
        """Add the user's message, stream the reply, keep it in the conversation."""
        # a marker would end the user's turn and write another's; a character the model does
        # not know would be replaced by another (the message is not sent: the user types again)
        problem = self.template.marker_in(text) or unknown_characters(self.tok, text)
        if problem:
            print(f"error: your message {problem} (nothing was sent)", file=sys.stderr)
            return
        self.messages.append({"role": "user", "content": text})
        try:
            reply = self.reply()
        except ScratchGPTError as e:  # say why, keep the conversation going
            print(f"error: {e}", file=sys.stderr)
            self.messages.pop()
            return
        self.messages.append({"role": "assistant", "content": reply})

    def prompt_ids(self) -> list[int]:
        """The conversation as tokens ending where the reply begins, encoded piece by piece as
        in training; the oldest turns are dropped while it leaves too little room (a note says
        when what is left is still longer than the context: the model reads its end)."""
        from scratchgpt.commands.prompts import note_long_prompts
        from scratchgpt.finetune.instruct import encode_conversation

        block_size = self.model.config.block_size
        room = min(self.args.max_new_tokens, block_size // 4)
        while True:
            (ids, _), replaced = encode_conversation(self.tok, self.template, self.messages,
                                                     add_generation_prompt=True)
            first = 1 if self.messages[0]["role"] == "system" else 0
            if len(ids) + room <= block_size or len(self.messages) - first <= 1:
                break
            del self.messages[first:first + 2]  # the oldest user message and its reply
        if replaced:
            print("note: characters the tokenizer lacks were replaced", file=sys.stderr)
        note_long_prompts(self.model, [len(ids)])  # one message alone overflows the context
        return ids

    def reply(self) -> str:
        import torch

        from scratchgpt.generation.generate import stream
        from scratchgpt.generation.printer import StreamPrinter
        from scratchgpt.generation.stopping import StopRule
        from scratchgpt.serve.reply import ReplyText

        rule = StopRule(self.args.max_new_tokens, self.tok.eot_id, self.template.reply_stops,
                        self.tok.decode)
        prompt = torch.tensor([self.prompt_ids()], dtype=torch.long)
        if self.interactive:
            sys.stdout.write("assistant> ")
        # a reply cut short while writing a marker of the template is shown without it, as
        # serve's
        printer = StreamPrinter(rule, text=ReplyText(rule, self.template))
        stopped = self._stream(printer, stream(self.model, prompt, rule, self.cfg, self.gen))
        text = printer.finish()
        sys.stdout.write("\n")
        sys.stdout.flush()
        if stopped:
            print("(reply stopped; it stays in the conversation. /exit, Ctrl-D or Ctrl-C at "
                  "the prompt ends the chat)", file=sys.stderr)
        if self.args.stats:
            ended = "Ctrl-C" if stopped else self.ended_by(rule, printer.ids)
            print(f"[{plural(len(printer.ids), 'token')}, ended by {ended}]", file=sys.stderr)
        return text.strip()

    def ended_by(self, rule, ids: list[int]) -> str:
        """What ended a reply that Ctrl-C did not stop, as --stats names it."""
        if ids and ids[-1] == rule.eos_id:  # (which rule.ends counts too)
            return "the end-of-text token"
        found = self.template.first_marker(self.tok.decode(ids)) if rule.ends(ids) else None
        if found is None:
            return "the token limit"
        _, role, mark = found
        return f"the end marker {mark}" if role == "end" else f"the {role}'s marker {mark}"

    def _stream(self, printer, tokens) -> bool:
        """Print the reply as it comes; True when Ctrl-C stopped it. At a terminal Ctrl-C
        stops the reply, not the chat (whose conversation would be lost with it); SIGTERM,
        and Ctrl-C of a chat read from a pipe, end the command as everywhere else."""
        from scratchgpt.generation.printer import line_ended_if_stopped

        try:
            for token in tokens:
                printer.add(int(token[0]))
        except KeyboardInterrupt as e:
            if isinstance(e, Terminated) or not self.interactive:
                with line_ended_if_stopped(printer):  # (as sample's: held-back text, "\n")
                    raise
            return True
        return False
