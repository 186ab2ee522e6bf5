#!/usr/bin/env python3
"""Train a Transformer: see `python train.py --help` and tf_transformer/cli/train.py."""
import sys

from tf_transformer.cli.train import main

if __name__ == "__main__":
    sys.exit(main())
