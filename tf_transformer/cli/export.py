"""SavedModel export for TF Serving: ``python -m tf_transformer.cli.export --model-dir DIR
[--checkpoint PATH] [--export-dir DIR] [--version N] [--xla]``.

What the export holds, its layout and signatures: :mod:`tf_transformer.infer.export`.
"""

import argparse
import os
import sys

import tensorflow as tf

from tf_transformer.errors import UserError, first_line, report_user_errors
from tf_transformer.infer.export import BEAM_SIGNATURE, SERVING_SIGNATURE, XLA_SIGNATURE, export_model_dir
from tf_transformer.model_dir.run_files import EXPORT_SUBDIR


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m tf_transformer.cli.export",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--model-dir", required=True, help="a directory written by train.py")
    parser.add_argument("--checkpoint", help="a checkpoint prefix, e.g. DIR/ckpt-1200 (default: the latest)")
    parser.add_argument("--export-dir", help=f"TF Serving's model base path (default: MODEL_DIR/{EXPORT_SUBDIR})")
    parser.add_argument("--version", type=int, help="version folder (default: one more than the largest there)")
    parser.add_argument("--xla", action="store_true",
                        help=f"also the {XLA_SIGNATURE} signature: decoding compiled by XLA, for throughput; "
                             "TF Serving needs --xla_cpu_compilation_enabled=true to run it")
    return parser.parse_args(argv)


@report_user_errors
def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    export_dir = args.export_dir or os.path.join(args.model_dir, EXPORT_SUBDIR)
    try:
        path = export_model_dir(args.model_dir, export_dir, args.version, args.checkpoint, xla=args.xla)
    except (OSError, tf.errors.OpError) as e:
        raise UserError(f"--export-dir {export_dir}: cannot write the export there ({first_line(e)})") from None
    signatures = [SERVING_SIGNATURE, BEAM_SIGNATURE] + ([XLA_SIGNATURE] if args.xla else [])
    print(f"exported {path} (signatures: {', '.join(signatures)})")


if __name__ == "__main__":
    sys.exit(main())
