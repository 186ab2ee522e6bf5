#!/usr/bin/env python3
"""Translate with a trained model: see `python translate.py --help` and tf_transformer/cli/translate.py."""
import sys

from tf_transformer.cli.translate import main

if __name__ == "__main__":
    sys.exit(main())
