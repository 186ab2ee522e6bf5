"""Pictures as PNG files: ``python -m tf_transformer.plots COMMAND``.

::

  python -m tf_transformer.plots positional-encoding [--length 100] [--units 512] [--output FILE.png]
  python -m tf_transformer.plots curves MODEL_DIR [--output FILE.png]
  python -m tf_transformer.plots attention --model-dir MODEL_DIR SENTENCE [--output FILE.png]

``positional-encoding`` draws the model's sinusoid table
(:func:`tf_transformer.modules.sinusoid_table`) as the blog does;
``curves`` the training loss, learning rate and dev BLEU by step, read from
``MODEL_DIR/logs`` (default output ``MODEL_DIR/curves.png``;
:func:`write_training_curves` is the same for train.py); ``attention`` the
encoder-decoder attention of every head and decoder block while the model
translates SENTENCE (as ``translate.py --plot-attention``).
"""

import argparse
import glob
import os
import sys

import tensorflow as tf
from tensorflow.core.util import event_pb2

from tf_transformer import plotting
from tf_transformer.errors import UserError, report_user_errors
from tf_transformer.summaries import LOG_DIR

CURVES_FILE = "curves.png"


def read_scalars(log_dir, tags=None):
    """The scalar summaries of every event file in ``log_dir``, merged by step.

    A resumed run writes a new event file and logs again the steps after its
    checkpoint: for a step logged twice the later value (by wall time) wins. A
    file cut short by a killed run is read up to the damage.

    Args:
      tags: the tags to read (default: every scalar tag).
    Returns:
      dict tag -> (steps, values): two (n,) lists sorted by step.
    Raises:
      UserError: ``log_dir`` holds no event file.
    """
    paths = sorted(glob.glob(os.path.join(log_dir, "events.out.tfevents.*")))
    if not paths:
        raise UserError(f"{log_dir}: no TensorBoard event files (events.out.tfevents.*) there; "
                        f"train.py writes them into MODEL_DIR/{LOG_DIR}")
    points = {}  # tag -> {step: (wall_time, value)}
    for path in paths:
        try:
            for record in tf.data.TFRecordDataset(path):
                event = event_pb2.Event.FromString(record.numpy())
                for value in event.summary.value:
                    scalar = _scalar(value) if tags is None or value.tag in tags else None
                    if scalar is None:
                        continue
                    by_step = points.setdefault(value.tag, {})
                    if event.step not in by_step or by_step[event.step][0] <= event.wall_time:
                        by_step[event.step] = (event.wall_time, scalar)
        except tf.errors.DataLossError:
            pass  # the rest of this file is damaged
    return {tag: (sorted(by_step), [by_step[step][1] for step in sorted(by_step)]) for tag, by_step in points.items()}


def _scalar(value):
    """A summary value's number: a TF1 ``simple_value`` or a TF2 scalar tensor; None for anything else."""
    if value.WhichOneof("value") == "simple_value":
        return value.simple_value
    tensor = value.tensor
    if value.WhichOneof("value") != "tensor" or tensor.tensor_shape.dim or tensor.dtype == tf.string.as_datatype_enum:
        return None
    return float(tf.make_ndarray(tensor))


def write_training_curves(model_dir, path=None):
    """Draws the run's loss, learning rate and dev BLEU by step (:func:`~tf_transformer.plotting.plot_curves`).

    Reads every event file of ``MODEL_DIR/logs``; writes ``path`` (default
    ``MODEL_DIR/curves.png``) atomically.

    Returns:
      the path written.
    Raises:
      UserError: no event file yet.
    """
    series = read_scalars(os.path.join(model_dir, LOG_DIR), {tag for tag, _ in plotting.CURVES})
    path = path or os.path.join(model_dir, CURVES_FILE)
    plotting.plot_curves(series, path, title=f"training run {model_dir}")
    return path


def write_positional_encoding(length, units, path):
    """Draws the model's sinusoid table of ``length`` positions x ``units`` dimensions to ``path``."""
    from tf_transformer.modules import sinusoid_table  # late: it pulls in Keras

    return plotting.plot_positional_encoding(sinusoid_table(length, units).numpy(), path)


def write_attention(model_dir, sentence, path):
    """Translates ``sentence`` with the model's decoding settings and draws its attention to ``path``."""
    from tf_transformer.model_dir import load_for_inference  # late: they pull in Keras
    from tf_transformer.translate import plot_sentence_attention

    hp, source_tokenizer, target_tokenizer, model = load_for_inference(model_dir)
    return plot_sentence_attention(sentence, source_tokenizer, target_tokenizer, model, path, hp.beam_size,
                                   hp.length_penalty, hp.max_decode_length or None)


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m tf_transformer.plots", description=__doc__.split("\n")[0])
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
        write_positional_encoding(args.length, args.units, args.output)
        path = args.output
    elif args.command == "curves":
        path = write_training_curves(args.model_dir, args.output)
    else:
        write_attention(args.model_dir, args.sentence, args.output)
        path = args.output
    print(path)


if __name__ == "__main__":
    sys.exit(main())
