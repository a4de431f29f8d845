"""Fixture answers for the loop guard: legitimately repetitive answers it must leave alone, and loops it must stop.

    python bench/repetitive.py OUT_DIR [--seed 0]    # writes legit.jsonl and loops.jsonl

Legitimate (`legit_answers`, 400 by default): numbered lists to 200, counting (to 100, to 500, by fives, in
words, backwards), CSV and Markdown tables with constant columns and empty cells, code with repeated lines
(unrolled assignments, test cases, switch cases, HTML lists, SQL inserts, JSON records, boilerplate), songs
with a chorus (and "99 bottles", "The Twelve Days of Christmas", "Old MacDonald"), "say X ten times",
multiplication tables, logs, ASCII art, step-by-step reasoning over cases, and plain prose.

Loops (`loop_answers`, 200 by default): a good answer (or none) and then a loop that runs on: a sentence, a
word, a long paragraph (up to 1,500 characters), a code block, a list item or a table row repeated; a loop
that drifts (a word changed here and there); two sentences taking turns; loops in reasoning; loops in CJK.
Each carries `loop_start`, the character where its loop begins.

Everything is drawn from random.Random(seed): the same seed gives the same set.
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Callable
from pathlib import Path

import orjson

NOUNS = (
    "apple", "budget", "server", "invoice", "river", "engine", "garden", "ticket", "letter", "module", "signal",
    "window", "county", "recipe", "planet", "sensor", "market", "bridge", "client", "report", "kernel", "folder",
)  # fmt: skip
VERBS = ("check", "update", "review", "measure", "install", "compare", "record", "verify", "clean", "test")
ADJS = ("quick", "stable", "broken", "green", "large", "minor", "urgent", "remote", "final", "shared", "empty")
NAMES = ("Alice", "Bob", "Chen", "Dmitri", "Eve", "Fatima", "Gus", "Hana", "Ivan", "Jo", "Kemal", "Lena")
WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve")
TENS = ("", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety")
TEENS = ("ten", "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen")


def sentence(r: random.Random) -> str:
    """One plain sentence."""
    return (
        f"{r.choice(NAMES)} will {r.choice(VERBS)} the {r.choice(ADJS)} {r.choice(NOUNS)} "
        f"before the {r.choice(NOUNS)} is {r.choice(ADJS)}."
    )


def prose(r: random.Random, sentences: int) -> str:
    """A few paragraphs of plain sentences."""
    out = []
    for _ in range(sentences):
        out.append(sentence(r))
        if r.random() < 0.2:
            out.append("\n\n")
    return " ".join(out).replace(" \n\n ", "\n\n")


def in_words(n: int) -> str:
    """A number from 0 to 999 in English words."""
    if n < 13:
        return WORDS[n]
    if n < 20:
        return TEENS[n - 10]
    if n < 100:
        return TENS[n // 10] + ("-" + WORDS[n % 10] if n % 10 else "")
    rest = n % 100
    return f"{WORDS[n // 100]} hundred" + (f" and {in_words(rest)}" if rest else "")


# legitimate answers


def numbered_list(r: random.Random) -> str:
    n = r.choice((20, 50, 100, 150, 200))
    style = r.choice(("item", "same", "bare", "task"))
    lines = []
    for i in range(1, n + 1):
        if style == "item":
            lines.append(f"{i}. {r.choice(ADJS).title()} {r.choice(NOUNS)}")
        elif style == "same":
            lines.append(f"{i}. Review the {NOUNS[i % 3]} log.")
        elif style == "bare":
            lines.append(str(i))
        else:
            lines.append(f"{i}. [ ] {r.choice(VERBS).title()} {r.choice(NOUNS)} #{i}")
    return f"Here is the list of {n}:\n\n" + "\n".join(lines)


def counting(r: random.Random) -> str:
    kind = r.choice(("commas", "lines", "fives", "words", "down", "long"))
    if kind == "commas":
        return ", ".join(str(i) for i in range(1, 101)) + "."
    if kind == "lines":
        return "\n".join(str(i) for i in range(1, r.choice((101, 201)) + 0))
    if kind == "fives":
        return " ".join(str(i) for i in range(5, 501, 5))
    if kind == "words":
        return ", ".join(in_words(i) for i in range(1, 101)).capitalize() + "."
    if kind == "down":
        return "Countdown: " + " ".join(str(i) for i in range(100, 0, -1)) + " ... liftoff!"
    return " ".join(str(i) for i in range(1, 501))


def csv_table(r: random.Random) -> str:
    rows = r.choice((20, 40, 80, 120, 200))
    status = r.choice(("active", "pending", "ok"))
    lines = ["id,name,region,status,balance,flag"]
    for i in range(1, rows + 1):
        balance = "0.00" if r.random() < 0.6 else f"{r.uniform(0, 900):.2f}"
        lines.append(f"{i},{r.choice(NAMES)},{r.choice(('north', 'south', 'east'))},{status},{balance},0")
    return "```csv\n" + "\n".join(lines) + "\n```"


def zero_csv(r: random.Random) -> str:
    cols = r.randint(4, 8)
    rows = r.randint(10, 40)
    head = ",".join(f"c{j}" for j in range(cols))
    return head + "\n" + "\n".join(f"{i}," + ",".join("0" for _ in range(cols - 1)) for i in range(rows))


def markdown_table(r: random.Random) -> str:
    rows = r.choice((10, 25, 50, 80))
    cols = r.randint(3, 6)
    filler = r.choice(("N/A", "-", "✓", "", "0", "TBD"))
    head = "| Item | " + " | ".join(f"Q{j}" for j in range(1, cols)) + " |"
    sep = "|" + "|".join("---" for _ in range(cols)) + "|"
    body = []
    for i in range(1, rows + 1):
        cells = [filler if r.random() < 0.7 else str(r.randint(1, 99)) for _ in range(cols - 1)]
        body.append(f"| {r.choice(NOUNS).title()} {i} | " + " | ".join(cells) + " |")
    return "\n".join([head, sep, *body])


def code_unrolled(r: random.Random) -> str:
    n = r.randint(16, 64)
    name = r.choice(("buf", "arr", "table", "weights"))
    lines = [f"{name} = [0] * {n}"] + [f"{name}[{i}] = 0" for i in range(n)]
    return "```python\n" + "\n".join(lines) + "\n```"


def code_tests(r: random.Random) -> str:
    n = r.randint(10, 40)
    fn = r.choice(("is_prime", "parse", "clamp", "slugify"))
    lines = ["import unittest", "", f"from mod import {fn}", "", "", f"class Test{fn.title()}(unittest.TestCase):"]
    for i in range(n):
        lines += [f"    def test_case_{i}(self):", f"        self.assertEqual({fn}({i}), expected[{i}])", ""]
    return "```python\n" + "\n".join(lines) + "\n```"


def code_switch(r: random.Random) -> str:
    n = r.randint(8, 30)
    lines = ["switch (code) {"]
    for i in range(n):
        lines += [f"    case {i}:", "        handle(code);", "        break;"]
    lines += ["    default:", "        break;", "}"]
    return "```c\n" + "\n".join(lines) + "\n```"


def html_list(r: random.Random) -> str:
    n = r.randint(10, 60)
    items = "\n".join(f'  <li class="item">{r.choice(NOUNS).title()} {i}</li>' for i in range(1, n + 1))
    return f'```html\n<ul class="menu">\n{items}\n</ul>\n```'


def sql_inserts(r: random.Random) -> str:
    n = r.randint(10, 50)
    rows = [f"INSERT INTO users (id, name, active) VALUES ({i}, '{r.choice(NAMES)}', TRUE);" for i in range(1, n + 1)]
    return "```sql\n" + "\n".join(rows) + "\n```"


def json_records(r: random.Random) -> str:
    n = r.randint(5, 30)
    recs = [{"id": i, "name": r.choice(NAMES), "active": True, "tags": [], "score": 0} for i in range(1, n + 1)]
    return "```json\n" + orjson.dumps(recs, option=orjson.OPT_INDENT_2).decode() + "\n```"


def code_boilerplate(r: random.Random) -> str:
    n = r.randint(4, 12)
    blocks = []
    for i in range(n):
        name = f"{r.choice(VERBS)}_{r.choice(NOUNS)}_{i}"
        blocks.append(f"def {name}(self):\n    pass\n\n")
    return "```python\nclass Stub:\n" + "".join("    " + b.replace("\n    ", "\n        ") for b in blocks) + "```"


def code_same_lines(r: random.Random) -> str:
    n = r.randint(3, 12)
    line = r.choice(('print("-" * 40)', "time.sleep(0.1)", "    yield", "nop", "x += 1", "}"))
    head = "```\n" + r.choice(("setup()", "start:", "def f():"))
    return head + "\n" + "\n".join(line for _ in range(n)) + "\ndone()\n```"


def zero_matrix(r: random.Random) -> str:
    n = r.randint(3, 10)
    rows = "\n".join(" ".join("0" for _ in range(n)) for _ in range(n))
    return f"The {n}x{n} zero matrix:\n\n```\n{rows}\n```"


CHORUS_LINES = (
    "Oh, carry me home on the midnight train",
    "Through the fields and the falling rain",
    "I will sing it again and again",
    "Hold on, hold on, we are almost there",
    "Light the fire and the lantern glare",
    "Every road leads back to you",
)


def song(r: random.Random) -> str:
    chorus = "\n".join(r.sample(CHORUS_LINES, r.randint(3, 6)))
    parts = []
    for v in range(r.randint(2, 4)):
        verse = "\n".join(sentence(r).rstrip(".") for _ in range(4))
        parts += [f"[Verse {v + 1}]\n{verse}", f"[Chorus]\n{chorus}"]
    if r.random() < 0.5:
        parts.append("[Bridge]\n" + "\n".join(sentence(r).rstrip(".") for _ in range(2)))
    parts += [f"[Chorus]\n{chorus}"] * r.choice((1, 2))
    return "\n\n".join(parts)


def bottles(r: random.Random) -> str:
    top = r.choice((10, 20, 99))
    verses = []
    for n in range(top, 0, -1):
        after = f"{n - 1} bottles" if n > 2 else ("1 bottle" if n == 2 else "no more bottles")
        unit = "bottles" if n > 1 else "bottle"
        verses.append(
            f"{n} {unit} of beer on the wall, {n} {unit} of beer.\n"
            f"Take one down and pass it around, {after} of beer on the wall."
        )
    return "\n\n".join(verses)


GIFTS = (
    "a partridge in a pear tree", "two turtle doves", "three French hens", "four calling birds",
    "five gold rings", "six geese a-laying", "seven swans a-swimming", "eight maids a-milking",
    "nine ladies dancing", "ten lords a-leaping", "eleven pipers piping", "twelve drummers drumming",
)  # fmt: skip
ORDINALS = ("first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth", "ninth", "tenth")


def twelve_days(r: random.Random) -> str:
    verses = []
    for day in range(r.choice((6, 10, 12))):
        nth = ORDINALS[day] if day < len(ORDINALS) else ("eleventh", "twelfth")[day - 10]
        gifts = [GIFTS[d] for d in range(day, -1, -1)]
        if day:
            gifts[-1] = "and " + gifts[-1]
        verses.append(f"On the {nth} day of Christmas my true love gave to me\n" + ",\n".join(gifts) + ".")
    return "\n\n".join(verses)


ANIMALS = (("cow", "moo"), ("pig", "oink"), ("duck", "quack"), ("horse", "neigh"), ("sheep", "baa"), ("dog", "woof"))


def macdonald(r: random.Random) -> str:
    verses = []
    for animal, sound in r.sample(ANIMALS, r.randint(3, 6)):
        verses.append(
            "Old MacDonald had a farm, E-I-E-I-O,\n"
            f"And on his farm he had a {animal}, E-I-E-I-O,\n"
            f"With a {sound} {sound} here and a {sound} {sound} there,\n"
            f"Here a {sound}, there a {sound}, everywhere a {sound} {sound},\n"
            "Old MacDonald had a farm, E-I-E-I-O."
        )
    return "\n\n".join(verses)


def say_n_times(r: random.Random) -> str:
    phrase = r.choice(("Hello, world!", "I will not talk in class.", "Thank you.", "All work and no play."))
    n = r.choice((3, 5, 10, 12, 20))
    sep = r.choice(("\n", " "))
    return f"Here it is {n} times:\n\n" + sep.join(phrase for _ in range(n))


def times_table(r: random.Random) -> str:
    k = r.randint(2, 19)
    upto = r.choice((10, 12, 20, 50))
    return f"Multiplication table of {k}:\n" + "\n".join(f"{k} x {i} = {k * i}" for i in range(1, upto + 1))


def log_lines(r: random.Random) -> str:
    n = r.randint(20, 80)
    lines = [
        f"2024-05-0{1 + i // 40} 12:{i // 60 % 60:02d}:{i % 60:02d} INFO worker-{i % 4} request processed "
        f"in {r.randint(3, 90)} ms"
        for i in range(n)
    ]
    return "```\n" + "\n".join(lines) + "\n```"


def ascii_art(r: random.Random) -> str:
    kind = r.choice(("pyramid", "board", "rule", "box"))
    if kind == "pyramid":
        n = r.randint(5, 20)
        return "\n".join(" " * (n - i) + "*" * (2 * i - 1) for i in range(1, n + 1))
    if kind == "board":
        n = 8
        return "\n".join(" ".join("#" if (i + j) % 2 else "." for j in range(n)) for i in range(n))
    if kind == "rule":
        return "=" * 80 + "\n" + sentence(r) + "\n" + "=" * 80
    w = r.randint(10, 40)
    return "+" + "-" * w + "+\n" + ("|" + " " * w + "|\n") * r.randint(3, 10) + "+" + "-" * w + "+"


def casework(r: random.Random) -> str:
    n = r.randint(8, 30)
    lines = ["Let me check each case."]
    for k in range(1, n + 1):
        lines.append(f"Case n = {k}: then n^2 + n = {k * k + k}, which is even, so the claim holds for n = {k}.")
    lines.append("So the claim holds for every case checked.")
    return "\n".join(lines)


def grateful(r: random.Random) -> str:
    n = r.randint(10, 40)
    return "\n".join(f"I am grateful for the {r.choice(ADJS)} {r.choice(NOUNS)}." for _ in range(n))


def plain(r: random.Random) -> str:
    return prose(r, r.randint(10, 60))


LEGIT: dict[str, Callable[[random.Random], str]] = {
    "numbered_list": numbered_list,
    "counting": counting,
    "csv_table": csv_table,
    "zero_csv": zero_csv,
    "markdown_table": markdown_table,
    "code_unrolled": code_unrolled,
    "code_tests": code_tests,
    "code_switch": code_switch,
    "html_list": html_list,
    "sql_inserts": sql_inserts,
    "json_records": json_records,
    "code_boilerplate": code_boilerplate,
    "code_same_lines": code_same_lines,
    "zero_matrix": zero_matrix,
    "song": song,
    "bottles": bottles,
    "twelve_days": twelve_days,
    "macdonald": macdonald,
    "say_n_times": say_n_times,
    "times_table": times_table,
    "log_lines": log_lines,
    "ascii_art": ascii_art,
    "casework": casework,
    "grateful": grateful,
    "plain": plain,
}


def legit_answers(seed: int = 0, count: int = 400) -> list[dict[str, str]]:
    """`count` legitimate answers, the kinds taking turns: {"kind", "text"}."""
    r = random.Random(seed)
    kinds = list(LEGIT)
    return [{"kind": kinds[i % len(kinds)], "text": LEGIT[kinds[i % len(kinds)]](r)} for i in range(count)]


# loops

LOOP_CHARS = 12_000  # how far each loop runs (a loop runs to max_tokens; the detector must stop it long before)
CJK = ("我们需要再检查一下这个结果。", "所以答案是四十二。", "让我重新计算一遍。")


def _repeat(unit: str, chars: int = LOOP_CHARS) -> str:
    return unit * (1 + chars // max(1, len(unit)))


def loop_sentence(r: random.Random) -> str:
    return _repeat(" " + sentence(r))


def loop_word(r: random.Random) -> str:
    return _repeat(" " + r.choice(("the", "and", "yes", "okay", r.choice(NOUNS))))


def loop_paragraph(r: random.Random) -> str:
    para = prose(r, r.randint(3, 18)).replace("\n\n", " ")
    return _repeat("\n\n" + para)


def loop_code(r: random.Random) -> str:
    block = "\n".join(
        r.choice(("    x = x + 1", "    self.step()", "    if ok:", "        continue", "    i += 1"))
        for _ in range(r.randint(1, 6))
    )
    return _repeat("\n" + block)


def loop_list_item(r: random.Random) -> str:
    n = r.randint(3, 40)
    return _repeat(f"\n{n}. {r.choice(VERBS).title()} the {r.choice(NOUNS)}.")


def loop_table_row(r: random.Random) -> str:
    return _repeat(f"\n| {r.choice(NOUNS)} | {r.randint(1, 9)} | {r.choice(ADJS)} |")


def loop_drift(r: random.Random) -> str:
    """A loop that drifts: the same sentence, one word changed now and then."""
    words = sentence(r).split()
    out = []
    while sum(len(w) + 1 for w in out) < LOOP_CHARS:
        copy = list(words)
        if r.random() < 0.3:
            copy[r.randrange(len(copy))] = r.choice(NOUNS)
        out += copy
    return " " + " ".join(out)


def loop_two(r: random.Random) -> str:
    """Two sentences taking turns."""
    return _repeat(" " + sentence(r) + " " + sentence(r))


def loop_wait(r: random.Random) -> str:
    """The reasoning loop of a thinking model."""
    unit = (
        f" Wait, let me double-check. {r.choice(NAMES)} said {r.randint(2, 9)} times {r.randint(2, 9)}."
        " Hmm, that is what I had. So the answer stands. But wait"
    )
    return _repeat(unit)


def loop_cjk(r: random.Random) -> str:
    return _repeat(r.choice(CJK))


LOOPS: dict[str, Callable[[random.Random], str]] = {
    "sentence": loop_sentence,
    "word": loop_word,
    "paragraph": loop_paragraph,
    "code": loop_code,
    "list_item": loop_list_item,
    "table_row": loop_table_row,
    "drift": loop_drift,
    "two_sentences": loop_two,
    "wait": loop_wait,
    "cjk": loop_cjk,
}


def loop_answers(seed: int = 0, count: int = 200) -> list[dict[str, object]]:
    """`count` loops, the kinds taking turns: {"kind", "part" (content or reasoning_content), "text",
    "loop_start"}; half start after a good answer (of up to 2,000 characters), a third are in reasoning."""
    r = random.Random(seed + 1)
    kinds = list(LOOPS)
    out: list[dict[str, object]] = []
    for i in range(count):
        kind = kinds[i % len(kinds)]
        head = prose(r, r.randint(1, 25)) if r.random() < 0.5 else ""
        loop = LOOPS[kind](r)
        part = "reasoning_content" if kind == "wait" or r.random() < 0.3 else "content"
        out.append({"kind": kind, "part": part, "text": head + loop, "loop_start": len(head)})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for name, rows in (("legit", legit_answers(args.seed)), ("loops", loop_answers(args.seed))):
        (args.out / f"{name}.jsonl").write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in rows))
        print(f"{args.out / name}.jsonl: {len(rows)} answers")


if __name__ == "__main__":
    main()
