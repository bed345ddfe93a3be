"""Build a tiny random-weight Llama model that vLLM's CPU build can serve, with no model hub.

    <vllm-venv>/bin/python backends/tiny_model.py --out "$VLLM_MODEL"

Runs with the vLLM virtualenv's interpreter (it needs `tokenizers`, `transformers` and `torch`, which the
gateway's own environment does not have), so it imports nothing from this project. Takes a few seconds:

- a byte-level BPE tokenizer (vocabulary 4096) trained on local text (this Python's standard library
  sources, read in sorted order, so the result is the same on every machine with the same Python), wrapped
  as a fast tokenizer with special tokens and a chat template;
- `LlamaForCausalLM` with hidden size 128, 4 heads (head_dim 32, the least vLLM's CPU attention takes),
  2 layers, initialised from a fixed seed, saved as bfloat16 safetensors.

The output says nothing meaningful, but it is deterministic at temperature 0. An existing complete model
(`.complete` marker with the same recipe version) is kept; the build goes to a temporary folder first, so
an interrupted build never leaves a half-written model behind.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

RECIPE = 1
VOCAB = 4096
HIDDEN = 128
HEADS = 4
LAYERS = 2
INTERMEDIATE = 256
MAX_POSITIONS = 2048
SPECIAL = ["<pad>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + eos_token + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)


def corpus(limit_bytes: int = 4_000_000) -> list[str]:
    """Local text to train the tokenizer on: the standard library's sources, in a fixed order."""
    stdlib = Path(os.__file__).parent
    texts: list[str] = []
    size = 0
    for path in sorted(stdlib.glob("*.py")):
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        texts.append(text)
        size += len(text)
        if size >= limit_bytes:
            break
    if not texts:
        raise SystemExit(f"no text found under {stdlib} to train the tokenizer on")
    return texts


def build(out: Path, seed: int = 0) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="</s>",
        additional_special_tokens=["<|system|>", "<|user|>", "<|assistant|>"],
        model_max_length=MAX_POSITIONS,
    )
    fast.chat_template = CHAT_TEMPLATE

    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=HEADS,
        max_position_embeddings=MAX_POSITIONS,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.bfloat16)

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".", dir=out.parent))
    try:
        fast.save_pretrained(tmp)
        model.save_pretrained(tmp, safe_serialization=True)
        (tmp / ".complete").write_text(json.dumps({"recipe": RECIPE, "seed": seed}) + "\n")
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)


def is_complete(out: Path, seed: int = 0) -> bool:
    try:
        marker = json.loads((out / ".complete").read_text())
    except (OSError, ValueError):
        return False
    return marker == {"recipe": RECIPE, "seed": seed}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder to write the model into")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--force", action="store_true", help="rebuild even if a complete model is there")
    args = parser.parse_args(argv)
    out: Path = args.out.expanduser()
    if not args.force and is_complete(out, args.seed):
        print(f"tiny model: {out} (cached)")
        return 0
    build(out, args.seed)
    print(f"tiny model: built {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
