"""Checkpoint averaging: ``python -m tf_transformer.cli.average --model-dir DIR --last K [--output DIR]``.

What is averaged and written: :mod:`tf_transformer.train.average`.
"""

import argparse
import os
import sys

from tf_transformer.errors import report_user_errors
from tf_transformer.model_dir.layout import AVERAGE_DIR
from tf_transformer.quiet import VERBOSE_HELP

# The modules that import TensorFlow are imported where they are used (the package's rule: tf_transformer.cli).


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m tf_transformer.cli.average", description=__doc__.split("\n")[0])
    parser.add_argument("--model-dir", required=True, help="a directory written by train.py")
    parser.add_argument("--last", type=int, required=True, help="average the last K checkpoints")
    parser.add_argument("--output", help=f"the averaged model directory (default: MODEL_DIR/{AVERAGE_DIR})")
    parser.add_argument("--verbose", action="store_true", help=VERBOSE_HELP)
    return parser.parse_args(argv)


@report_user_errors
def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    from tf_transformer.train import average

    written = average.average_checkpoints(args.model_dir, args.last, args.output)
    steps = ", ".join(path.rsplit("-", 1)[-1] for path in written.averaged)
    print(f"averaged {len(written.averaged)} checkpoints (steps {steps}) into {written.checkpoint}; "
          f"translate with: translate.py --model-dir {os.path.dirname(written.checkpoint)}")


if __name__ == "__main__":
    sys.exit(main())
