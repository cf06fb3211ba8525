"""Words in messages: counts, ``plural(1, "token")`` is '1 token', ``plural(3, "token")``
'3 tokens'; a part of a count with its verb, ``some_of(1, 3, "text")`` is '1 of 3 texts is';
the article of a model kind, ``a_kind("lstm")`` is 'an lstm'; the first of many names,
``first_of(names, 5)`` is 'a, b, c, d, e and 40 more'."""

from __future__ import annotations

# model kinds read letter by letter (G-R-U has a vowel, so the rule below misses it)
SPELLED = frozenset({"gpt", "rnn", "lstm", "gru"})
# letters whose spoken name begins with a vowel sound: "el", "ar", "en", "ef", "aitch" ...
VOWEL_SOUNDING_LETTERS = frozenset("aefhilmnorsx")


def plural(n: int, word: str, words: str | None = None, *, grouped: bool = False) -> str:
    """``n`` and ``word``, or its plural (``words``, default ``word + "s"``) unless ``n`` is
    1; ``grouped``: ``n`` with thousands separators (``1,024 tokens``)."""
    count = f"{n:,}" if grouped else str(n)
    return f"{count} {word if n == 1 else words or word + 's'}"


def some_of(k: int, n: int, word: str, verbs: tuple[str, str] = ("is", "are")) -> str:
    """``k`` of ``n`` ``word`` (plural unless ``n`` is 1) and the verb of ``verbs`` (singular,
    plural) that agrees with ``k``, to go on with what they are ('longer than ...').

    >>> some_of(1, 20, "text"), some_of(2, 20, "text"), some_of(1, 1, "text")
    ('1 of 20 texts is', '2 of 20 texts are', '1 of 1 text is')
    >>> some_of(1, 3, "conversation", ("has", "have"))
    '1 of 3 conversations has'
    """
    return f"{k} of {plural(n, word)} {verbs[0] if k == 1 else verbs[1]}"


def a_kind(kind: str) -> str:
    """``kind``, a model type's name, after the article it is spoken with: a name read letter
    by letter (one of SPELLED, or one with no vowel) takes 'an' when its first letter's name
    begins with a vowel sound, a word when it does.

    >>> [a_kind(k) for k in ("lstm", "rnn", "gpt", "gru", "bigram", "seq2seq")]
    ['an lstm', 'an rnn', 'a gpt', 'a gru', 'a bigram', 'a seq2seq']
    >>> a_kind("rnn-classifier")
    'an rnn-classifier'
    """
    head = kind.split("-")[0].lower()
    spelled = head in SPELLED or not set(head) & set("aeiou")
    vowels = VOWEL_SOUNDING_LETTERS if spelled else frozenset("aeiou")
    return f"{'an' if head[:1] in vowels else 'a'} {kind}"


def first_of(names: list[str], most: int) -> str:
    """``names`` joined with commas, the first ``most`` of them, and how many more there are:
    a message that named them all could run to thousands of them.

    >>> first_of(["a", "b", "c"], 2), first_of(["a", "b"], 2)
    ('a, b and 1 more', 'a, b')
    """
    more = f" and {len(names) - most} more" if len(names) > most else ""
    return ", ".join(names[:most]) + more
