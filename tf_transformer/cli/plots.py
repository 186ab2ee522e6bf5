"""Pictures as PNG files: ``python -m tf_transformer.cli.plots COMMAND``.

::

  python -m tf_transformer.cli.plots positional-encoding [--length 100] [--units 512] [--output FILE.png]
  python -m tf_transformer.cli.plots curves MODEL_DIR [--output FILE.png]
  python -m tf_transformer.cli.plots attention --model-dir MODEL_DIR SENTENCE [--output FILE.png]

``positional-encoding`` draws the model's sinusoid table
(:func:`tf_transformer.nn.modules.sinusoid_table`) as the blog does;
``curves`` the training loss, learning rate and dev BLEU by step, read from
``MODEL_DIR/logs`` (default output ``MODEL_DIR/curves.png``;
:func:`tf_transformer.train.summaries.write_training_curves`, as train.py draws it); ``attention`` the
encoder-decoder attention of every head and decoder block while the model
translates SENTENCE (as ``translate.py --plot-attention``).
"""

import argparse
import os
import sys

from tf_transformer.errors import UserError, report_user_errors
from tf_transformer.model_dir.layout import CURVES_FILE
from tf_transformer.quiet import VERBOSE_HELP

# The modules that import TensorFlow are imported where they are used (the package's rule: tf_transformer.cli).


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m tf_transformer.cli.plots", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    table = commands.add_parser("positional-encoding", help="the sinusoid positional-encoding table")
    table.add_argument("--length", type=int, default=100, help="positions, down (default: %(default)s)")
    table.add_argument("--units", type=int, default=512, help="dimensions, across (default: %(default)s)")
    table.add_argument("--output", default="positional-encoding.png", help="PNG file (default: %(default)s)")
    curves = commands.add_parser("curves", help="loss, learning rate and dev BLEU of a training run")
    curves.add_argument("model_dir", metavar="MODEL_DIR", help="a directory written by train.py")
    curves.add_argument("--output", help=f"PNG file (default: MODEL_DIR/{CURVES_FILE})")
    attention = commands.add_parser("attention", help="encoder-decoder attention while translating a sentence")
    attention.add_argument("sentence", metavar="SENTENCE", help="one source sentence")
    attention.add_argument("--model-dir", required=True, help="a directory written by train.py")
    attention.add_argument("--output", default="attention.png", help="PNG file (default: %(default)s)")
    for command in (table, curves, attention):
        command.add_argument("--verbose", action="store_true", help=VERBOSE_HELP)
    return parser.parse_args(argv)


def check_args(args):
    """Refuses bad values, each with one line naming the flag."""
    for flag in ("--length", "--units"):
        value = getattr(args, flag[2:], None)
        if value is not None and value < 1:
            raise UserError(f"{flag} {value}: must be at least 1")
    model_dir = getattr(args, "model_dir", None)
    if model_dir is not None and not os.path.isdir(model_dir):
        raise UserError(f"{model_dir}: no such model directory (one written by train.py)")
    if args.output is not None:
        if not args.output.lower().endswith(".png"):
            raise UserError(f"--output {args.output}: give a file name ending in .png")
        if not os.path.isdir(os.path.dirname(os.path.abspath(args.output))):
            raise UserError(f"--output {args.output}: its directory does not exist")


@report_user_errors
def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    check_args(args)
    if args.command == "positional-encoding":
        from tf_transformer import figures
        from tf_transformer.nn.modules import sinusoid_table

        figures.plot_positional_encoding(sinusoid_table(args.length, args.units).numpy(), args.output)
        path = args.output
    elif args.command == "curves":
        from tf_transformer.train.summaries import write_training_curves

        path = write_training_curves(args.model_dir, args.output)
    else:
        from tf_transformer.infer.load import load_for_inference
        from tf_transformer.infer.translate import plot_sentence_attention

        loaded = load_for_inference(args.model_dir)
        hp = loaded.hp
        plot_sentence_attention(args.sentence, *loaded.tokenizers, loaded.model, args.output,
                                max_length=hp.max_decode_length or None, beam_size=hp.beam_size,
                                length_penalty=hp.length_penalty, max_length_factor=hp.max_length_factor)
        path = args.output
    print(path)


if __name__ == "__main__":
    sys.exit(main())
