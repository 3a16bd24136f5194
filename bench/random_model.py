"""`python -m bench.random_model OUT --tokenizer FOLDER`: write a Llama-architecture model with
random weights as a Hugging Face folder, for throughput figures at sizes no package ships (our
machines cannot download weights). Its text is noise, so benchmark it with EOS ignored (the
bench does). The default shape is Llama 3.2 1B's, with the given tokenizer's vocabulary."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.random_model", description=__doc__)
    parser.add_argument("out", type=Path, help="the folder to write")
    parser.add_argument("--tokenizer", type=Path, required=True,
                        help="a Hugging Face folder whose tokenizer the model uses")
    parser.add_argument("--hidden-size", type=int, default=2048)
    parser.add_argument("--intermediate-size", type=int, default=8192)
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default="bfloat16")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=args.hidden_size,
        intermediate_size=args.intermediate_size, num_hidden_layers=args.layers,
        num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
        max_position_embeddings=4096, tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        architectures=["LlamaForCausalLM"])
    torch.manual_seed(args.seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(device):
        model = LlamaForCausalLM(config).to(getattr(torch, args.dtype))
    model.save_pretrained(args.out)
    tokenizer.save_pretrained(args.out)
    parameters = sum(parameter.numel() for parameter in model.parameters())
    print(f"wrote {args.out}: {parameters / 1e9:.2f} B parameters, {args.dtype}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
