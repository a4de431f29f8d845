"""Client CPU to count prompts that share long system prompts: by pieces (tokens/pieces.py) beside encoding
each rendered prompt whole, in one run, with the counts compared.

    python bench/counting.py [--tokenizer DIR] [--rows 2000] [--systems 20]

Rows: --rows prompts over --systems shared system prompts of 2-4k words, one 30-word question each, rendered
with the tokenizer's own template. Default tokenizer: ../shared/tokenizers/qwen3 where it exists, else the
shipped tiny one. Prints ms of CPU a row for: render alone, render and count by pieces (a fresh counter, so
each system prompt is encoded once in the run), and whole-text encoding of the rendered prompts.
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path
from typing import Any

from gen_pipeline.tokens import TINY_TOKENIZER, encoded_lengths, load_counter

QWEN3 = Path(__file__).resolve().parents[2] / "shared" / "tokenizers" / "qwen3"
WORDS = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "that",
    "for",
    "it",
    "as",
    "with",
    "was",
    "on",
    "be",
    "by",
    "at",
    "this",
    "have",
    "from",
    "or",
    "an",
]


def rows(n: int, systems: int, seed: int = 1) -> list[list[dict[str, Any]]]:
    rng = random.Random(seed)
    prompts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2000, 4000))) for _ in range(systems)]
    question = lambda i: f"Question {i}: " + " ".join(rng.choice(WORDS) for _ in range(30))  # noqa: E731
    return [
        [{"role": "system", "content": prompts[i % systems]}, {"role": "user", "content": question(i)}]
        for i in range(n)
    ]


def cpu_ms_per_row(work: Any, n: int) -> tuple[float, Any]:
    start = time.process_time()
    out = work()
    return (time.process_time() - start) * 1000 / n, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer", default=str(QWEN3 if (QWEN3 / "tokenizer.json").exists() else TINY_TOKENIZER))
    ap.add_argument("--rows", type=int, default=2000)
    ap.add_argument("--systems", type=int, default=20)
    args = ap.parse_args()
    chats = rows(args.rows, args.systems)
    counter: Any = load_counter(args.tokenizer)  # a FastTokenCounter for a local folder
    render_ms, texts = cpu_ms_per_row(lambda: [counter.template.render(c) for c in chats], args.rows)
    pieces_ms, by_pieces = cpu_ms_per_row(lambda: counter.count(chats), args.rows)
    whole_ms, whole = cpu_ms_per_row(lambda: encoded_lengths(counter.tokenizer, texts), args.rows)
    print(f"{args.rows} rows over {args.systems} shared system prompts, tokenizer {args.tokenizer}")
    print(f"  render alone                 {render_ms:7.3f} ms/row")
    print(f"  render + count by pieces     {pieces_ms:7.3f} ms/row")
    print(f"  encode whole (render apart)  {whole_ms:7.3f} ms/row")
    print(f"  counts equal: {by_pieces == whole}")


if __name__ == "__main__":
    main()
