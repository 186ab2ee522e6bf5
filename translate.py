#!/usr/bin/env python3
"""Translate with a trained model: see `python translate.py --help` and tf_transformer/cli/translate.py."""
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # keep TensorFlow's C++ info lines out of the output

from tf_transformer.cli.translate import main

if __name__ == "__main__":
    sys.exit(main())
