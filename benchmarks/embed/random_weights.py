"""A model folder with all-mpnet-base-v2's architecture and tokenizer and seeded random weights.

The real weights (438 MB) cannot reach every machine a benchmark runs on, and a forward pass
takes the same time whatever the weights' values, so the timing benchmarks here can load such
a folder (--model-dir, or EMBED_MODEL_DIR for the service). Its vectors mean nothing: no
benchmark of recall or of vectors' closeness to the real model's may use it.

Usage:
  python benchmarks/embed/random_weights.py SOURCE TARGET
    SOURCE: a folder with the model's config.json and tokenizer.json (the assembled model
    folder, or a copy of those files); TARGET: the folder to write
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import torch


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("Usage:")[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("source", type=Path, help="folder with config.json and tokenizer.json")
    parser.add_argument("target", type=Path, help="folder to write")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    args = parser.parse_args()
    from transformers import AutoConfig, AutoModel

    args.target.mkdir(parents=True, exist_ok=True)
    shutil.copy(args.source / "tokenizer.json", args.target / "tokenizer.json")
    torch.manual_seed(args.seed)
    config = AutoConfig.from_pretrained(args.source, local_files_only=True)
    AutoModel.from_config(config).save_pretrained(args.target)
    print(f"wrote {args.target}: {config.model_type}, random weights (seed {args.seed})")


if __name__ == "__main__":
    main()
