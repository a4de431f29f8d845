"""Build the small tokenizer the project ships, so a fresh clone can run the demo and tests offline.

It is a byte-level BPE trained on a fixed built-in text with a ChatML chat template (the Qwen family's
shape), saved as a Hugging Face tokenizer folder. `python -m gen_pipeline.tiny_tokenizer DIR` rebuilds it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
VOCAB_SIZE = 1024

_CORPUS = """
The quick brown fox jumps over the lazy dog. Explain the difference between a process and a thread.
Write a short poem about the sea. Summarize the following article in three sentences. Translate to French:
good morning, how are you today? What is the capital of France? Paris is the capital of France.
def add(a, b): return a + b  # Python function. for i in range(10): print(i)
You are a helpful assistant. Answer the question step by step and give the final answer at the end.
Question: If a train travels 60 kilometres per hour for 2 hours, how far does it go? Answer: 120 km.
Numbers 0 1 2 3 4 5 6 7 8 9 10 100 1000 and symbols , . ; : ! ? ( ) [ ] { } " ' - + * / = < > @ # $ % & _
Unicode: caf\u00e9, na\u00efve, \u00fcber, \u4f60\u597d\u4e16\u754c, \u3053\u3093\u306b\u3061\u306f, \u043f\u0440\u0438\u0432\u0435\u0442.
"""


def build(out_dir: Path) -> Path:
    """Train the tokenizer deterministically and save it as a Hugging Face folder in `out_dir`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([line for line in _CORPUS.splitlines() if line] * 4, trainer)
    fast = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=CHAT_TEMPLATE,
        model_max_length=131072,
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(out_dir))
    _portable_config(out_dir / "tokenizer_config.json")
    return out_dir


def _portable_config(path: Path) -> None:
    """Name a class and carry the template inline, so transformers 4 loads the folder like 5 does."""
    config = json.loads(path.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config["chat_template"] = CHAT_TEMPLATE
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    print(build(Path(sys.argv[1] if len(sys.argv) > 1 else "tiny-tokenizer")))
