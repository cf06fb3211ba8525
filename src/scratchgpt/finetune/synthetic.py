"""A synthetic instruction set whose answers can be checked exactly.

Three kinds of instruction, drawn with a seed, as Alpaca records (``instruction``, ``input``,
``output``), so that instruction tuning can be measured by exact match of greedy replies:

* ``Reverse the word.`` / ``kodamu`` -> ``umadok`` (made-up words)
* ``What is 17 + 25?`` -> ``42``
* ``Write the date in words.`` / ``2021-03-04`` -> ``4 March 2021``

>>> [r["instruction"] for r in synthetic_records(3, seed=1)]
['Reverse the word.', 'What is 97 + 57?', 'Write the date in words.']
"""

from __future__ import annotations

import random

MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August",
          "September", "October", "November", "December")
CONSONANTS, VOWELS = "bcdfghklmnprstvz", "aeiou"


def pseudo_word(rng: random.Random) -> str:
    """A pronounceable made-up word of 2-3 syllables (so a reversal cannot be remembered)."""
    return "".join(rng.choice(CONSONANTS) + rng.choice(VOWELS)
                   for _ in range(rng.randint(2, 3)))


def reverse_word(rng: random.Random) -> dict[str, str]:
    word = pseudo_word(rng)
    return {"instruction": "Reverse the word.", "input": word, "output": word[::-1]}


def addition(rng: random.Random) -> dict[str, str]:
    a, b = rng.randint(0, 99), rng.randint(0, 99)
    return {"instruction": f"What is {a} + {b}?", "input": "", "output": str(a + b)}


def date_in_words(rng: random.Random) -> dict[str, str]:
    y, m, d = rng.randint(1950, 2049), rng.randint(1, 12), rng.randint(1, 28)
    return {"instruction": "Write the date in words.", "input": f"{y:04d}-{m:02d}-{d:02d}",
            "output": f"{d} {MONTHS[m - 1]} {y}"}


KINDS = (reverse_word, addition, date_in_words)


def kind_of(instruction: str) -> str:
    """Which kind an instruction (or a prompt starting with one) is.

    >>> kind_of("What is 3 + 4?"), kind_of("Reverse the word.")
    ('addition', 'reverse_word')
    """
    for prefix, kind in (("Reverse the word.", "reverse_word"), ("What is ", "addition"),
                         ("Write the date in words.", "date_in_words")):
        if instruction.startswith(prefix):
            return kind
    raise ValueError(f"not a synthetic instruction: {instruction[:40]!r}")


def synthetic_records(n: int, seed: int = 0) -> list[dict[str, str]]:
    """``n`` distinct records, the three kinds in turn (no record twice; at most 30,000)."""
    if not 0 <= n <= 30_000:
        raise ValueError(f"n must be in [0, 30000], got {n}")
    rng = random.Random(seed)
    seen: set[tuple[str, str]] = set()
    out: list[dict[str, str]] = []
    while len(out) < n:
        record = KINDS[len(out) % len(KINDS)](rng)
        key = (record["instruction"], record["input"])
        if key not in seen:
            seen.add(key)
            out.append(record)
    return out
