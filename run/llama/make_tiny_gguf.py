#!/usr/bin/env python3
"""Write a tiny random-weight Qwen3 model as GGUF, for integration tests with a real llama-server.

    make_tiny_gguf.py VOCAB_GGUF TEMPLATE OUT_GGUF [--seed N] [--ctx-train N]

VOCAB_GGUF is llama.cpp's models/ggml-vocab-qwen2.gguf (real Qwen2/Qwen3 byte-level BPE vocab and
merges) and TEMPLATE is models/templates/Qwen-Qwen3-0.6B.jinja; run/llama/build.sh keeps both in its
cache. The model:

- architecture ``qwen3``: hidden 64, 2 layers, 4 query heads / 2 KV heads, head_dim 16, FFN 128,
  RMSNorm eps 1e-6, rope base 1e6, trained context 40960 (as Qwen3), F16 matrices, output tied to
  the token embedding;
- vocab 151,936 (as Qwen3), with the Qwen3 added tokens at ids 151643-151668 and unused
  ``[PAD<i>]`` tokens after them; eos ``<|im_end|>`` (151645), pad/bos ``<|endoftext|>`` (151643),
  no BOS added; the real Qwen3 chat template.

The output is deterministic for a given seed (about 25 MB, 20-40 s). Weights are random, so the
generated text is gibberish and rarely ends with EOS; send ``"logit_bias": {"151645": 100}`` to get
``finish_reason: "stop"``.

Test-only dependencies: ``gguf`` and ``numpy`` (``.venv/bin/pip install gguf numpy``).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

try:
    import numpy as np
    from gguf import GGUFReader, GGUFWriter, LlamaFileType, TokenType
except ImportError as exc:  # pragma: no cover - depends on the environment
    sys.exit(f"make_tiny_gguf.py: missing test-only dependency ({exc}). Install with: .venv/bin/pip install gguf numpy")

# Qwen3's added tokens (tokenizer_config.json "added_tokens_decoder"): (id, content, special).
QWEN3_ADDED_TOKENS: list[tuple[int, str, bool]] = [
    (151643, "<|endoftext|>", True),
    (151644, "<|im_start|>", True),
    (151645, "<|im_end|>", True),
    (151646, "<|object_ref_start|>", True),
    (151647, "<|object_ref_end|>", True),
    (151648, "<|box_start|>", True),
    (151649, "<|box_end|>", True),
    (151650, "<|quad_start|>", True),
    (151651, "<|quad_end|>", True),
    (151652, "<|vision_start|>", True),
    (151653, "<|vision_end|>", True),
    (151654, "<|vision_pad|>", True),
    (151655, "<|image_pad|>", True),
    (151656, "<|video_pad|>", True),
    (151657, "<tool_call>", False),
    (151658, "</tool_call>", False),
    (151659, "<|fim_prefix|>", False),
    (151660, "<|fim_middle|>", False),
    (151661, "<|fim_suffix|>", False),
    (151662, "<|fim_pad|>", False),
    (151663, "<|repo_name|>", False),
    (151664, "<|file_sep|>", False),
    (151665, "<tool_response>", False),
    (151666, "</tool_response>", False),
    (151667, "<think>", False),
    (151668, "</think>", False),
]
N_BPE = 151643  # ids 0..151642 are the byte-level BPE vocabulary
N_VOCAB = 151936  # Qwen3's embedding rows (config.json vocab_size)
EOS_ID, PAD_ID = 151645, 151643

HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM, FFN = 64, 2, 4, 2, 16, 128
ARCH = "qwen3"


def read_vocab(path: str | Path) -> tuple[list[str], list[str]]:
    """(tokens, merges) of the BPE part of a llama.cpp vocab GGUF, checked to be the Qwen2 vocab."""
    reader = GGUFReader(str(path))
    fields = reader.fields

    def get(key: str):
        if key not in fields:
            raise SystemExit(f"{path}: no '{key}' field; is this ggml-vocab-qwen2.gguf?")
        return fields[key].contents()

    model, pre = get("tokenizer.ggml.model"), get("tokenizer.ggml.pre")
    if model != "gpt2" or pre != "qwen2":
        raise SystemExit(f"{path}: tokenizer model/pre {model!r}/{pre!r}, expected gpt2/qwen2")
    tokens, merges = list(get("tokenizer.ggml.tokens")), list(get("tokenizer.ggml.merges"))
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    if len(tokens) < N_BPE + 3 or tokens[N_BPE : N_BPE + 3] != specials:
        raise SystemExit(f"{path}: unexpected token list (len {len(tokens)}), not the Qwen2 vocab")
    return tokens[:N_BPE], merges


def qwen3_token_list(bpe_tokens: list[str]) -> tuple[list[str], list[int]]:
    """Full 151,936-entry token list and token types, as convert_hf_to_gguf.py writes Qwen3's."""
    tokens = list(bpe_tokens)
    types = [int(TokenType.NORMAL)] * len(tokens)
    for i, (tid, text, special) in enumerate(QWEN3_ADDED_TOKENS):
        assert tid == N_BPE + i
        tokens.append(text)
        looks_special = text.startswith("<|") and text.endswith("|>")
        types.append(int(TokenType.CONTROL if special or looks_special else TokenType.USER_DEFINED))
    for tid in range(len(tokens), N_VOCAB):
        tokens.append(f"[PAD{tid}]")
        types.append(int(TokenType.UNUSED))
    return tokens, types


def write_model(vocab: str, template: str, out: str, seed: int = 0, ctx_train: int = 40960) -> None:
    bpe, merges = read_vocab(vocab)
    tokens, types = qwen3_token_list(bpe)
    chat_template = Path(template).read_text(encoding="utf-8")
    if "<|im_start|>" not in chat_template:
        raise SystemExit(f"{template}: does not look like the Qwen3 chat template")

    rng = np.random.default_rng(seed)

    def mat(rows: int, cols: int, std: float = 0.02) -> np.ndarray:
        # numpy shape (rows, cols) is stored as GGUF ne = [cols, rows]: llama.cpp's {in, out}.
        return (rng.standard_normal((rows, cols), dtype=np.float32) * std).astype(np.float16)

    def ones(n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float32)

    out_path = Path(out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_name(out_path.name + ".tmp")
    w = GGUFWriter(str(tmp), ARCH)
    w.add_name("tiny-random-qwen3")
    w.add_file_type(int(LlamaFileType.MOSTLY_F16))
    w.add_context_length(ctx_train)
    w.add_embedding_length(HIDDEN)
    w.add_block_count(LAYERS)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_key_length(HEAD_DIM)
    w.add_value_length(HEAD_DIM)
    w.add_rope_freq_base(1_000_000.0)
    w.add_layer_norm_rms_eps(1e-6)

    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_eos_token_id(EOS_ID)
    w.add_pad_token_id(PAD_ID)
    w.add_bos_token_id(PAD_ID)
    w.add_add_bos_token(False)
    w.add_chat_template(chat_template)

    w.add_tensor("token_embd.weight", mat(N_VOCAB, HIDDEN))
    w.add_tensor("output_norm.weight", ones(HIDDEN))
    q_dim, kv_dim = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    for i in range(LAYERS):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", ones(HIDDEN))
        w.add_tensor(p + "attn_q.weight", mat(q_dim, HIDDEN))
        w.add_tensor(p + "attn_k.weight", mat(kv_dim, HIDDEN))
        w.add_tensor(p + "attn_v.weight", mat(kv_dim, HIDDEN))
        w.add_tensor(p + "attn_output.weight", mat(HIDDEN, q_dim))
        w.add_tensor(p + "attn_q_norm.weight", ones(HEAD_DIM))
        w.add_tensor(p + "attn_k_norm.weight", ones(HEAD_DIM))
        w.add_tensor(p + "ffn_norm.weight", ones(HIDDEN))
        w.add_tensor(p + "ffn_gate.weight", mat(FFN, HIDDEN))
        w.add_tensor(p + "ffn_up.weight", mat(FFN, HIDDEN))
        w.add_tensor(p + "ffn_down.weight", mat(HIDDEN, FFN))

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tmp.replace(out_path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("vocab", help="path to ggml-vocab-qwen2.gguf")
    ap.add_argument("template", help="path to Qwen-Qwen3-0.6B.jinja")
    ap.add_argument("out", help="output .gguf path (written atomically)")
    ap.add_argument("--seed", type=int, default=0, help="weight RNG seed (default 0)")
    ap.add_argument("--ctx-train", type=int, default=40960, help="qwen3.context_length (default 40960)")
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    write_model(args.vocab, args.template, args.out, seed=args.seed, ctx_train=args.ctx_train)
    size = Path(args.out).stat().st_size / 1e6
    print(f"wrote {args.out} ({size:.1f} MB) in {time.monotonic() - t0:.1f}s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
