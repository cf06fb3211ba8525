"""Benchmarks, one module each (see scratchgpt.commands.bench)."""


def refuse_repeats(flag: str, names: list[str]) -> None:
    """A list flag (``--archs``, ``--cells``) naming one choice twice is refused: each one
    ran again, a row of the table each time (``bench seq2seq``: another ``--budget`` of
    training, 10 minutes by default)."""
    from scratchgpt.errors import ConfigError

    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigError(f"{flag} names {', '.join(twice)} more than once")
