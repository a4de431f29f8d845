#!/usr/bin/env python3
"""Rebuild the Qwen3 Hugging Face tokenizer folder offline and verify it against test vectors.

    build_qwen3_tokenizer.py VOCAB_GGUF TEMPLATE OUT_DIR [--compare REF_DIR]

Inputs come from the llama-cpp-python sdist (run/llama/build.sh keeps them in its cache):
VOCAB_GGUF is models/ggml-vocab-qwen2.gguf (Qwen2, Qwen2.5 and Qwen3 share its byte-level BPE vocab
and merges) and TEMPLATE is models/templates/Qwen-Qwen3-0.6B.jinja. Writes OUT_DIR/tokenizer.json,
tokenizer_config.json and chat_template.jinja, loadable offline with AutoTokenizer.from_pretrained.

Verification (exit status 1 on any failure):
- every test string in VOCAB_GGUF.inp must encode (``add_special_tokens=False``) to exactly the ids
  in VOCAB_GGUF.out (made by llama.cpp with the original Hugging Face tokenizer) and decode back;
- the added tokens, ``len(tokenizer) == 151669``, eos/pad, and a chat example with known ids;
- with ``--compare REF_DIR``: identical ids to another tokenizer folder (for example
  /work/shared/tokenizers/qwen3) for the test strings, added tokens, extra strings and chats.

Needs ``tokenizers``, ``transformers`` (+ ``jinja2``) and the test-only ``gguf`` and ``numpy``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
try:
    import transformers
    from make_tiny_gguf import EOS_ID, N_BPE, PAD_ID, QWEN3_ADDED_TOKENS, read_vocab
    from transformers import AutoTokenizer
except ImportError as exc:  # pragma: no cover - depends on the environment
    sys.exit(
        f"build_qwen3_tokenizer.py: missing dependency ({exc}). "
        "Install with: .venv/bin/pip install gguf numpy tokenizers transformers jinja2"
    )

# Qwen2/Qwen3 pre-tokenizer regex (Qwen3's tokenizer.json; llama.cpp LLAMA_VOCAB_PRE_TYPE_QWEN2).
QWEN2_SPLIT_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
MODEL_MAX_LENGTH = 131072  # as in Qwen3's tokenizer_config.json

# system "You are terse." + user "Hello, world!" + generation prompt, from the Qwen3 tokenizer.
CHAT_EXAMPLE = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Hello, world!"},
]
CHAT_EXAMPLE_IDS = [151644, 8948, 198, 2610, 525, 50537, 13, 151645, 198, 151644, 872, 198,
                    9707, 11, 1879, 0, 151645, 198, 151644, 77091, 198]  # fmt: skip


def _added_token(tid: int, text: str, special: bool) -> dict:
    return {"id": tid, "content": text, "single_word": False, "lstrip": False, "rstrip": False,
            "normalized": False, "special": special}  # fmt: skip


def tokenizer_json(tokens: list[str], merges: list[str]) -> dict:
    byte_level = {
        "type": "ByteLevel",
        "add_prefix_space": False,
        "trim_offsets": False,
        "use_regex": False,
    }
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [_added_token(*t) for t in QWEN3_ADDED_TOKENS],
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {
                    "type": "Split",
                    "pattern": {"Regex": QWEN2_SPLIT_REGEX},
                    "behavior": "Isolated",
                    "invert": False,
                },
                byte_level,
            ],
        },
        "post_processor": byte_level,
        "decoder": byte_level,
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": "",
            "end_of_word_suffix": "",
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": {tok: i for i, tok in enumerate(tokens)},
            "merges": [m.split(" ") for m in merges],
        },
    }


def tokenizer_config() -> dict:
    decoder = {}
    for tid, text, special in QWEN3_ADDED_TOKENS:
        d = _added_token(tid, text, special)
        del d["id"]
        decoder[str(tid)] = d
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": decoder,
        "additional_special_tokens": [t for _, t, s in QWEN3_ADDED_TOKENS if s and t != "<|endoftext|>"],
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": MODEL_MAX_LENGTH,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }


def build(vocab: Path, template: Path, out: Path) -> None:
    tokens, merges = read_vocab(vocab)
    if len(tokens) != N_BPE:
        raise SystemExit(f"{vocab}: {len(tokens)} BPE tokens, expected {N_BPE}")
    tmpl = template.read_text(encoding="utf-8")
    out.mkdir(parents=True, exist_ok=True)
    files = {
        "tokenizer.json": json.dumps(tokenizer_json(tokens, merges), ensure_ascii=False, indent=2) + "\n",
        "tokenizer_config.json": json.dumps(tokenizer_config(), ensure_ascii=False, indent=2) + "\n",
        "chat_template.jinja": tmpl,
    }
    for name, text in files.items():
        tmp = out / (name + ".tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(out / name)
    n_added = len(QWEN3_ADDED_TOKENS)
    print(f"wrote {out} ({len(tokens)} BPE tokens, {len(merges)} merges, {n_added} added tokens)")


def read_test_vectors(vocab: Path) -> list[tuple[str, list[int]]]:
    """Parse VOCAB.inp/.out exactly like llama.cpp's tests/test-tokenizer-0.cpp."""
    inp = Path(str(vocab) + ".inp").read_bytes().decode("utf-8")
    out_lines = Path(str(vocab) + ".out").read_bytes().decode("utf-8").split("\n")
    if out_lines and out_lines[-1] == "":
        out_lines.pop()  # getline() does not yield a final empty line
    sep = "\n__ggml_vocab_test__\n"
    texts: list[str] = []
    pos = 0
    while pos < len(inp):
        nxt = inp.find(sep, pos)
        if nxt < 0:
            texts.append(inp[pos:])
            break
        texts.append(inp[pos:nxt])
        pos = nxt + len(sep)
    if len(texts) != len(out_lines) or not texts:
        raise SystemExit(f"{vocab}.inp/.out: {len(texts)} inputs but {len(out_lines)} outputs")
    return [(t, [int(x) for x in o.split()]) for t, o in zip(texts, out_lines, strict=True)]


def chat_ids(tok, messages: list[dict], **kw) -> list[int]:
    enc = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, **kw)
    # transformers 5 returns a BatchEncoding, 4.x a list
    ids = enc if isinstance(enc, list) else enc["input_ids"]
    return list(ids)


EXTRA_STRINGS = [
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
    '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call><|endoftext|>',
    "[PAD151700] <|fim_prefix|>def f():<|fim_suffix|><|fim_middle|>",
    "ﬁnancial Ａ１２３ café café 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 \u00a0\u2009\u3000x",  # noqa: RUF001
    "don't I'M we'RE 12345678901234 3.14159 -0.5e-10 $1,000,000.00",
    "    indented\n\t\tcode();\r\n\r\n  \n \n",
    "日本語のテキストと中文文本和한국어 텍스트 — «quotes» “smart” ‘single’ …",  # noqa: RUF001
    "emoji 👩‍👩‍👧‍👦 🇺🇸 🦙🦙🦙 and combining e\u0301 a\u0308",
    "x" * 300 + " " + "ab" * 200 + "\n" * 7 + " " * 33 + "end",
    "",
]
EXTRA_CHATS = [
    CHAT_EXAMPLE,
    [{"role": "user", "content": "What is 2+2?"}],
    [
        {"role": "system", "content": "Be brief.\n\nReally."},
        {"role": "user", "content": "Say hi"},
        {"role": "assistant", "content": "<think>\nok\n</think>\n\nHi!"},
        {"role": "user", "content": "Again, in 日本語 🦙"},
    ],
]


def verify(out: Path, vocab: Path, compare: Path | None) -> list[str]:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    errors: list[str] = []
    tok = AutoTokenizer.from_pretrained(str(out))

    tests = read_test_vectors(vocab)
    bad = 0
    for text, want in tests:
        got = tok.encode(text, add_special_tokens=False)
        if got != want:
            bad += 1
            errors.append(f"test vector {text!r}: got {got}, want {want}")
        back = tok.decode(want)
        if back != text:
            errors.append(f"test vector {text!r}: decodes to {back!r}")
    print(f"test vectors: {len(tests) - bad}/{len(tests)} identical")

    if len(tok) != N_BPE + len(QWEN3_ADDED_TOKENS):
        errors.append(f"len(tokenizer) = {len(tok)}, want {N_BPE + len(QWEN3_ADDED_TOKENS)}")
    for tid, text, _ in QWEN3_ADDED_TOKENS:
        if tok.convert_tokens_to_ids(text) != tid or tok.encode(text, add_special_tokens=False) != [tid]:
            errors.append(f"added token {text!r} does not map to {tid}")
    if tok.eos_token_id != EOS_ID or tok.pad_token_id != PAD_ID:
        errors.append(f"eos/pad ids {tok.eos_token_id}/{tok.pad_token_id}, want {EOS_ID}/{PAD_ID}")
    if tok.encode("Hello") != tok.encode("Hello", add_special_tokens=False):
        errors.append("encode() adds special tokens (expected none, like Qwen3)")
    got = chat_ids(tok, CHAT_EXAMPLE)
    if got != CHAT_EXAMPLE_IDS:
        errors.append(f"chat example: got {got}, want {CHAT_EXAMPLE_IDS}")

    if compare is not None:
        ref = AutoTokenizer.from_pretrained(str(compare))
        n = 0
        for text in [t for t, _ in tests] + EXTRA_STRINGS + [t for _, t, _ in QWEN3_ADDED_TOKENS]:
            for special in (False, True):
                n += 1
                a, b = (
                    tok.encode(text, add_special_tokens=special),
                    ref.encode(text, add_special_tokens=special),
                )
                if a != b:
                    errors.append(f"vs {compare}: {text!r} -> {a} but reference gives {b}")
        for msgs in EXTRA_CHATS:
            for kw in ({}, {"enable_thinking": False}):
                n += 1
                a, b = chat_ids(tok, msgs, **kw), chat_ids(ref, msgs, **kw)
                if a != b:
                    errors.append(f"vs {compare}: chat {msgs!r} {kw} -> {a} but reference gives {b}")
        if len(ref) != len(tok) or ref.get_vocab() != tok.get_vocab():
            errors.append(f"vs {compare}: vocabularies differ")
        print(f"compared with {compare}: {n} encodings, vocab of {len(ref)}")
    return errors


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("vocab", type=Path, help="path to ggml-vocab-qwen2.gguf (with .inp/.out next to it)")
    ap.add_argument("template", type=Path, help="path to Qwen-Qwen3-0.6B.jinja")
    ap.add_argument("out", type=Path, help="output tokenizer folder")
    ap.add_argument("--compare", type=Path, help="another Qwen3 tokenizer folder that must give identical ids")
    args = ap.parse_args(argv)
    build(args.vocab, args.template, args.out)
    errors = verify(args.out, args.vocab, args.compare)
    if errors:
        for e in errors[:50]:
            print("MISMATCH:", e, file=sys.stderr)
        print(
            f"FAILED: {len(errors)} mismatches (transformers {transformers.__version__})",
            file=sys.stderr,
        )
        return 1
    print(f"OK: {args.out} verified (transformers {transformers.__version__})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
