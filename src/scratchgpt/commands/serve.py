"""``scratchgpt serve``: an OpenAI-compatible HTTP server for a checkpoint, and a playground.

Every request joins one running batch (continuous batching): the model decodes all of them
together, one token each per step, and each request gets exactly what it would get alone.
Open the printed address in a browser for the playground: tokens coloured by probability, the
alternatives on hover, a GPT's attention maps, and a chat tab for chat-tuned models.

Examples:
  scratchgpt serve --checkpoint runs/mytext
  curl http://127.0.0.1:8000/v1/completions -H 'Content-Type: application/json' \\
       -d '{"prompt": "ROMEO:", "max_tokens": 50, "temperature": 0.8}'
  scratchgpt serve --checkpoint runs/chat --host 0.0.0.0 --api-key "$KEY"   # reachable by others
"""

from __future__ import annotations

import argparse
import os

from scratchgpt.commands.argtypes import add_which_flag, finite_float, help_text, thread_count
from scratchgpt.errors import ConfigError
from scratchgpt.validation import flag_of


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="serve a checkpoint over an OpenAI-compatible HTTP API, "
                                     "with a web playground",
                       description=help_text(__doc__),
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True,
                   help="run directory, .pt file, Hugging Face GPT-2 directory, or hf:ID")
    add_which_flag(p)
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1: this machine only; any "
                        "other address needs --api-key)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000; 0: any free)")
    p.add_argument("--api-key", default=os.environ.get("SCRATCHGPT_API_KEY"),
                   help="require 'Authorization: Bearer KEY' on every API route (default: "
                        "$SCRATCHGPT_API_KEY; none)")
    p.add_argument("--model-name", default=None,
                   help="the model's id in the API (default: the run directory's name)")
    p.add_argument("--dtype", choices=("fp32", "bf16", "int8"), default="fp32",
                   help="weights precision for decoding (see 'sample --help'; default fp32)")
    p.add_argument("--threads", type=thread_count, default=0,
                   help="CPU threads for torch (0 = torch's default)")
    p.add_argument("--max-batch", type=int, default=32,
                   help="most sequences decoded together (a request with n choices takes n; "
                        "default 32); at most as many as their KV caches (keys and values "
                        "over the model's context) fit in the memory available: more is "
                        "refused, naming how many fit")
    p.add_argument("--max-queue", type=int, default=128,
                   help="most requests waiting for room in the batch (each prompt of a "
                        "request takes a place; a request may send no more prompts than "
                        "this); beyond it, 429 with Retry-After (default 128)")
    p.add_argument("--timeout", type=finite_float, default=600.0,
                   help="seconds a request may take, waiting included; then its generation "
                        "ends (finish_reason 'length'), or it fails with 503 if it never "
                        "started (default 600; 0 = no limit)")
    p.add_argument("--max-body-bytes", type=int, default=1 << 20,
                   help="largest request body (default 1 MiB; larger: 413)")
    p.add_argument("--max-prompt-tokens", type=int, default=None,
                   help="longest prompt in tokens (default and upper bound: the model's "
                        "context; 4096 for models without one; longer: 400 "
                        "context_length_exceeded)")
    p.add_argument("--max-tokens-limit", type=int, default=4096,
                   help="largest max_tokens a request may ask for (default 4096)")
    p.add_argument("--no-access-log", dest="access_log", action="store_false",
                   help="do not log every request")
    p.set_defaults(func=run)


def config_from_args(args: argparse.Namespace):
    """The :class:`~scratchgpt.serve.server.ServeConfig` of the flags (checked)."""
    from scratchgpt.serve.protocol import Limits
    from scratchgpt.serve.server import ServeConfig

    for flag in ("max_batch", "max_queue", "max_body_bytes", "max_tokens_limit"):
        if getattr(args, flag) < 1:
            raise ConfigError(f"{flag_of(flag)} must be >= 1")
    if args.max_prompt_tokens is not None and args.max_prompt_tokens < 1:
        raise ConfigError("--max-prompt-tokens must be >= 1")
    if not 0 <= args.port <= 65535:
        raise ConfigError(f"--port must be in [0, 65535], got {args.port}")
    if args.timeout < 0:
        raise ConfigError("--timeout must be >= 0 (0 = no limit)")
    if args.model_name == "":  # the run's name would have been served instead
        raise ConfigError("--model-name is empty; give a name, or leave the flag out for the "
                          "run directory's")
    if args.api_key == "":  # every API route would want 'Authorization: Bearer' and no key
        raise ConfigError("the API key is empty (--api-key, or $SCRATCHGPT_API_KEY set to "
                          "''): give a key, or none at all")
    limits = Limits(max_body_bytes=args.max_body_bytes,
                    max_prompt_tokens=args.max_prompt_tokens or 4096,
                    max_tokens=args.max_tokens_limit)
    return ServeConfig(checkpoint=args.checkpoint, which=args.which, host=args.host,
                       port=args.port, api_key=args.api_key, model_name=args.model_name,
                       dtype=args.dtype, threads=args.threads, max_batch=args.max_batch,
                       max_queue=args.max_queue, timeout_s=args.timeout, limits=limits,
                       access_log=args.access_log)


def run(args: argparse.Namespace) -> int:
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        raise ConfigError("serve needs the 'serve' extra: pip install 'scratchgpt[serve]' "
                          "(starlette, uvicorn)") from None
    from scratchgpt.serve.server import run_server

    run_server(config_from_args(args))
    return 0
