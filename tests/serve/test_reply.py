"""The examples in serve/reply.py's docstrings."""

import doctest


def test_docstring_examples():
    import scratchgpt.serve.reply as reply

    assert doctest.testmod(reply).attempted > 0 and doctest.testmod(reply).failed == 0
