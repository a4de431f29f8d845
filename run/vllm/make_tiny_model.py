"""Write a tiny random-weight Qwen3 model that vLLM serves on CPU, with a real tokenizer beside it.

    python run/vllm/make_tiny_model.py TOKENIZER_DIR OUT_DIR

The shape is the smallest the CPU attention backend accepts (head_dim 64; 16 is refused). The weights are
random, so the text is noise; what the tests read is the server's counting, its limits and its errors.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import torch
from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM


def main(tokenizer_dir: str, out: str) -> None:
    """Save the model (bf16) and the tokenizer folder into `out`."""
    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = Qwen3Config(
        vocab_size=151936,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        tie_word_embeddings=True,
        max_position_embeddings=4096,
        torch_dtype="bfloat16",
    )
    model = Qwen3ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    template = Path(tokenizer_dir) / "chat_template.jinja"
    if template.is_file():  # the folder's own template file, as the server would find it
        shutil.copy(template, Path(out) / "chat_template.jinja")


if __name__ == "__main__":
    main(*sys.argv[1:3])
