"""Deterministic benchmark inputs: short prompts, an Infinity-Instruct-shaped file, long prompts.

    python bench/inputs.py OUT.jsonl [--rows 654676] [--seed 0] [--done DIR --missing 1000]

writes the big input (and, with --done, a run directory whose completions.jsonl already holds every row but
the last MISSING, in the form gen-pipeline writes) and prints the sizes. The big input has the shape issue 7
describes: rows {"id", "messages"}; about 80% one user turn, 10% system + user, 10% multi-turn (user and
assistant alternating, ending with a user turn); about 2% long prompts (a few thousand words); text that
mixes English with accented Latin, Greek, Cyrillic, Chinese, Japanese and emoji. At 654,676 rows it is
about 390 MB. The same seed gives the same bytes.
"""

from __future__ import annotations

import argparse
import random
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gen_pipeline.config import RunConfig
from gen_pipeline.digests import row_digest, shaping_key
from gen_pipeline.records import Completion

# One string reads better than a long list literal.
EN_WORDS = (  # noqa: SIM905
    "the of and to in is for on with as by at from that this it be are was can will not or an which "
    "model data value function train answer step question explain write code python list number result "
    "error system memory network example table file user server request time first each other between "
    "should could would using given following describe compare summarize translate story history market "
    "energy climate water city river mountain student teacher school science physics chemistry biology "
    "algorithm database query index cache thread process kernel input output string integer matrix vector "
    "probability theorem proof equation variable constant method class object interface policy article "
    "paragraph sentence author reader language english chinese review product customer price quality"
).split()
ACCENTED = (  # noqa: SIM905
    "café naïve über résumé façade Zürich São Paulo jalapeño señor crème brûlée déjà vu Ångström Øresund "
    "Łódź Straße Ελληνικά φιλοσοφία привет мир данные Mañana coöperate Dvořák Čapek Ísland Şehir"
).split()
HANZI = (
    "的一是在不了有和人这中大为上个国我以要他时来用们生到作地于出就分对成会可主发年动同工也能下过子说产种面而方后"
    "多定行学法所民得经十三之进着等部度家电力里如水化高自二理起小物现实加量都两体制机当使点从业本去把性好应开它合"
    "还因由其些然前外天政四日那社义事平形相全表间样与关各重新线内数正心反你明看原又么利比或但质气第向道命此变条只"
    "没结解问意建月公无系军很情者最立代想已通并提直题党程展五果料象员革位入常文总次品式活设及管特件长求老头基资边"
)
KANA = (
    "あいうえおかきくけこさしすせそたちつてとなにぬねのはひふへほまみむめもやゆよらりるれろわをん"
    "アイウエオカキクケコサシスセソタチツテト"
)
CJK_COMMA, CJK_COLON, CJK_STOP = "\uff0c", "\uff1a", "\u3002"  # full-width punctuation, escaped for ruff
EMOJI = ["🙂", "🚀", "📊", "✅", "🔥", "👍🏽", "🇯🇵", "👨‍👩‍👧", "🤖", "🌍", "💡", "😂"]  # with modifiers, flags, ZWJ
SYSTEM_PROMPTS = [
    "You are a helpful assistant.",
    "You are an AI assistant. You will be given a task. You must generate a detailed and long answer.",
    "You are a helpful assistant, who always provide explanation. Think like you are answering to a five year old.",
    "你是一个乐于助人的助手。请用中文回答。",
    "You are an expert programmer. Answer with working code and a short explanation.",
    "User will you give you a task with some instruction. Your job is follow the instructions as faithfully as "
    "you can. While answering think step-by-step and justify your answer.",
]
# Language profile of a row's text, and how often it is picked: mostly English, as in Infinity-Instruct.
PROFILES = ("en", "latin", "zh", "ja", "emoji")
PROFILE_WEIGHTS = (70, 8, 14, 3, 5)
LONG_SHARE = 0.02
LONG_SENTENCES = (120, 260)  # a long prompt: 120-260 sentences, about 1,500-3,300 words
ISSUE_ROWS = 654_676
DONE_COMPLETION = " ".join(["ember", "grove", "bravo", "willow", "lantern", "zephyr", "river", "kettle"] * 4)


def short_rows(n: int) -> list[dict[str, Any]]:
    """The 20k-row workload: one short English user turn each."""
    return [
        {"id": i, "messages": [{"role": "user", "content": f"Question {i}: what is {i} times {i % 97}?"}]}
        for i in range(n)
    ]


def write_jsonl(path: Path, rows: Iterable[dict[str, Any]]) -> None:
    with path.open("wb") as f:
        for r in rows:
            f.write(orjson.dumps(r) + b"\n")


class Sentences:
    """Pools of short random sentences per language profile (composing rows from them is fast)."""

    def __init__(self, rng: random.Random, per_pool: int = 3000) -> None:
        self.rng = rng
        make = {"en": self._latin, "latin": self._latin, "zh": self._cjk, "ja": self._cjk, "emoji": self._latin}
        self.pools = {p: [make[p](p) for _ in range(per_pool)] for p in PROFILES}

    def _latin(self, profile: str) -> str:
        rng = self.rng
        words = rng.choices(EN_WORDS, k=rng.randint(5, 20))
        if profile == "latin":
            for _ in range(rng.randint(1, 3)):
                words[rng.randrange(len(words))] = rng.choice(ACCENTED)
        elif profile == "emoji":
            words.insert(rng.randrange(len(words) + 1), rng.choice(EMOJI))
        return " ".join(words).capitalize() + rng.choice(".?.!")

    def _cjk(self, profile: str) -> str:
        rng = self.rng
        chars = HANZI if profile == "zh" else HANZI[:120] + KANA * 2
        body = "".join(rng.choices(chars, k=rng.randint(8, 28)))
        cut = rng.randint(3, len(body) - 2)
        return body[:cut] + CJK_COMMA + body[cut:] + CJK_STOP

    def text(self, profile: str, n: int) -> str:
        sep = "" if profile in ("zh", "ja") else " "
        return sep.join(self.rng.choices(self.pools[profile], k=n))

    def mixed(self, n: int, paragraph: int = 8) -> str:
        """n sentences in paragraphs of mixed languages, as long pasted documents are."""
        parts = []
        while n > 0:
            k = min(n, self.rng.randint(paragraph // 2, paragraph * 2))
            parts.append(self.text(self.profile(), k))
            n -= k
        return "\n\n".join(parts)

    def profile(self) -> str:
        return self.rng.choices(PROFILES, PROFILE_WEIGHTS)[0]


def conversation(s: Sentences) -> list[dict[str, str]]:
    """One Infinity-Instruct-like conversation that ends with a user turn."""
    rng = s.rng
    profile = s.profile()
    shape = rng.random()  # < 0.8 one user turn, < 0.9 system + user, else multi-turn (a third with a system)
    multi = shape >= 0.9
    messages = []
    if 0.8 <= shape < 0.9 or (multi and rng.random() < 0.3):
        messages.append({"role": "system", "content": rng.choice(SYSTEM_PROMPTS)})
    for t in range(rng.randint(2, 4) if multi else 1):
        if t:
            messages.append({"role": "assistant", "content": s.text(profile, rng.randint(1, 4))})
        messages.append({"role": "user", "content": s.text(profile, rng.randint(1, 3))})
    if rng.random() < LONG_SHARE:
        doc = s.mixed(rng.randint(*LONG_SENTENCES))
        task = rng.choice(
            ["Summarize the following text.", "Translate into English:", f"请总结以下内容{CJK_COLON}", ""]
        )
        messages[-1]["content"] = f"{task}\n\n{doc}\n\n{messages[-1]['content']}".strip()
    return messages


def big_rows(n: int, seed: int = 0) -> Iterator[dict[str, Any]]:
    """n Infinity-Instruct-shaped rows; the same seed gives the same rows."""
    s = Sentences(random.Random(seed))
    for i in range(n):
        yield {"id": i, "messages": conversation(s)}


def long_prompts(n: int, sentences: tuple[int, int] = (270, 530), seed: int = 1) -> list[list[dict[str, str]]]:
    """n single-turn prompts of mixed-language text; the default is about 4,000-8,000 Qwen3 tokens each."""
    s = Sentences(random.Random(seed))
    return [[{"role": "user", "content": s.mixed(s.rng.randint(*sentences))}] for _ in range(n)]


SHAPING = shaping_key(RunConfig(input=Path("big.jsonl"), out=Path("run"), servers=("http://127.0.0.1:1",)))


def done_line(row: dict[str, Any]) -> bytes:
    """The completions.jsonl line gen-pipeline would have written for `row` against the simulator."""
    chars = sum(len(m["content"]) for m in row["messages"])
    tokens = 10 + chars // 3  # only roughly the count: resume reads the id, never this
    server = f"http://127.0.0.1:{31000 + row['id'] % 8}"
    return Completion(
        row["id"],
        row["messages"],
        DONE_COMPLETION,
        "stop",
        tokens,
        tokens,
        32,
        64,
        server,
        1,
        0.05,
        "sim-model",
        {},
        row_digest=row_digest(SHAPING, orjson.dumps(row)),  # as generate run with its defaults records it
    ).to_line()


def write_big(path: Path, rows: int, seed: int = 0, done: Path | None = None, missing: int = 1000) -> None:
    """The big input; with `done`, also a run directory holding all rows but the last `missing` as finished."""
    out = (done / "completions.jsonl").open("wb") if done else None
    try:
        with path.open("wb") as f:
            for row in big_rows(rows, seed):
                f.write(orjson.dumps(row) + b"\n")
                if out is not None and row["id"] < rows - missing:
                    out.write(done_line(row))
    finally:
        if out is not None:
            out.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path, help="input JSONL to write")
    ap.add_argument("--rows", type=int, default=ISSUE_ROWS)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--done", type=Path, help="also write DIR/completions.jsonl with all rows but --missing done")
    ap.add_argument("--missing", type=int, default=1000)
    args = ap.parse_args()
    if args.done:
        args.done.mkdir(parents=True, exist_ok=True)
    write_big(args.out, args.rows, args.seed, args.done, args.missing)
    print(f"{args.out}: {args.rows:,} rows, {args.out.stat().st_size / 2**20:.0f} MB")
    if args.done:
        print(f"{args.done / 'completions.jsonl'}: {(args.done / 'completions.jsonl').stat().st_size / 2**20:.0f} MB")


if __name__ == "__main__":
    main()
