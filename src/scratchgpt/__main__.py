import sys

try:
    from scratchgpt.cli import run
except KeyboardInterrupt:  # Ctrl-C while Python starts: nothing has begun
    print("scratchgpt: interrupted", file=sys.stderr)
    raise SystemExit(130) from None

raise SystemExit(run())
