"""Text the tests build themselves, so that no test needs a file outside the repository.

``play_text`` writes a deterministic English-like play: speeches headed by a speaker's name
(``ROMEO:``), lines of sentences with commas, semicolons, questions, exclamations and
apostrophes, and blank lines between speeches, the shape of Tiny Shakespeare. Words follow a
Zipf law over a fixed list of common English words and a long tail of made-up words, so a
char-level model has real structure to learn and a BPE trainer finds thousands of merges.

    >>> text = play_text(2_000)
    >>> len(text), text == play_text(2_000)
    (2000, True)
"""

from __future__ import annotations

import functools
import itertools
import random

SPEAKERS = ("ROMEO", "JULIET", "KING", "NURSE", "HAMLET", "QUEEN MARGARET", "FIRST CITIZEN",
            "LADY MACBETH", "DUKE VINCENTIO", "MENENIUS", "GLOUCESTER", "ANTONIO")
NAMES = ("Romeo", "Juliet", "Hamlet", "Rome", "Verona", "Warwick", "Edward", "Bianca", "York",
         "Angelo", "Paris", "Tybalt")
COMMON = ("the and i to of a you my that in is not it me with be his your this but he have as "
          "thou so him will what thy all her for no do by shall if are we thee our on now lord "
          "o king good come let sir more they or here was well love then how would upon there "
          "from at am say which like man she know make them hath one may go an yet see should "
          "must when death heart can night day time life father blood eyes fair world tell").split()
CONTRACTIONS = ("'tis", "i'll", "o'er", "ne'er", "thou'rt", "'twas", "e'en", "we'll", "don't")
SYLLABLES = ("al", "an", "ar", "bel", "ben", "bra", "cal", "cor", "da", "del", "dor", "el",
             "en", "er", "fa", "fen", "gal", "gar", "ha", "hal", "in", "ir", "jo", "ka", "la",
             "lan", "lo", "mar", "mel", "mi", "mon", "na", "nor", "o", "pa", "per", "quo", "ra",
             "ri", "ro", "sa", "sel", "stan", "ta", "ten", "tho", "tor", "u", "va", "ver", "wen",
             "win", "xan", "yor", "ze")


@functools.cache
def lexicon(size: int = 6000, seed: int = 1) -> tuple[str, ...]:
    """The common words, then distinct made-up words of two to four syllables."""
    rng = random.Random(seed)
    words, seen = list(COMMON), set(COMMON)
    while len(words) < size:
        word = "".join(rng.choices(SYLLABLES, k=rng.choice((2, 2, 3, 3, 4))))
        if word not in seen:
            words.append(word)
            seen.add(word)
    return tuple(words)


def _sentence(rng: random.Random, words: tuple[str, ...], cum_weights: list[float]) -> str:
    n = rng.randint(3, 13)
    picked = rng.choices(words, cum_weights=cum_weights, k=n)
    out = []
    for i, word in enumerate(picked):
        r = rng.random()
        if r < 0.03:
            word = rng.choice(NAMES)
        elif r < 0.05:
            word = rng.choice(CONTRACTIONS)
        if word == "i" or word.startswith("i'"):
            word = "I" + word[1:]
        if i < n - 1 and rng.random() < 0.08:
            word += rng.choice((",", ",", ",", ";", ":"))
        out.append(word)
    out[0] = out[0][0].upper() + out[0][1:]
    return " ".join(out) + rng.choice((".", ".", ".", "?", "!"))


def _speech(rng: random.Random, words: tuple[str, ...], cum_weights: list[float]) -> str:
    lines = [rng.choice(SPEAKERS) + ":"]
    for _ in range(rng.randint(1, 5)):
        line = _sentence(rng, words, cum_weights)
        if rng.random() < 0.3:
            line += " " + _sentence(rng, words, cum_weights)
        lines.append(line)
    return "\n".join(lines)


def play_text(n_chars: int, seed: int = 0) -> str:
    """Exactly ``n_chars`` characters of the generated play (the same for the same seed)."""
    rng = random.Random(seed)
    words = lexicon()
    cum_weights = list(itertools.accumulate(1.0 / (rank + 2) for rank in range(len(words))))
    speeches: list[str] = []
    length = 0
    while length < n_chars:
        speeches.append(_speech(rng, words, cum_weights))
        length += len(speeches[-1]) + 2
    return "\n\n".join(speeches)[:n_chars]
