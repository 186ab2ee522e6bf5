"""Export: a SavedModel for TF Serving, ``python -m tf_transformer.cli.export --model-dir DIR [--checkpoint PATH]
[--export-dir DIR] [--version N] [--xla] [--precision bfloat16]``, or a CTranslate2 model directory, ``... --format ctranslate2
[--quantization int8] [--data CORPUS]``.

What the SavedModel holds, its layout and signatures: :mod:`tf_transformer.infer.export`. The CTranslate2
conversion, its checks and what differs in decoding: :mod:`tf_transformer.infer.ct2` (ctranslate2 is an
optional dependency: ``pip install -e ".[ctranslate2]"``).
"""

import argparse
import os
import sys

from tf_transformer.data import corpus, datasets
from tf_transformer.errors import UserError, first_line, report_user_errors
from tf_transformer.infer.signatures import BEAM_SIGNATURE, SERVING_SIGNATURE, XLA_SIGNATURE
from tf_transformer.model_dir.layout import EXPORT_SUBDIR
from tf_transformer.options import MAX_BEAM_PATIENCE, PRECISIONS
from tf_transformer.quiet import VERBOSE_HELP

# The modules that import TensorFlow are imported where they are used (the package's rule: tf_transformer.cli).

FORMATS = ("savedmodel", "ctranslate2")
# CTranslate2's weight types on disk that --quantization offers.
QUANTIZATIONS = ("int8", "int8_float32", "int16", "float16", "bfloat16")
CT2_SUBDIR = "ctranslate2"


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m tf_transformer.cli.export",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--model-dir", required=True, help="a directory written by train.py")
    parser.add_argument("--format", default="savedmodel", choices=FORMATS,
                        help="savedmodel: for TF Serving; ctranslate2: a CTranslate2 model directory, for "
                             "translate.py --ctranslate2 DIR (default: %(default)s)")
    parser.add_argument("--checkpoint", help="a checkpoint prefix, e.g. DIR/ckpt-1200 (default: savedmodel: the "
                                             "latest; ctranslate2: the kept average, else the best, else the latest)")
    parser.add_argument("--export-dir", help=f"TF Serving's model base path (default: MODEL_DIR/{EXPORT_SUBDIR}); "
                                             f"ctranslate2: the model directory to write (default: "
                                             f"MODEL_DIR/{CT2_SUBDIR}[-QUANTIZATION])")
    parser.add_argument("--version", type=int, help="version folder (default: one more than the largest there)")
    parser.add_argument("--xla", action="store_true",
                        help=f"also the {XLA_SIGNATURE} signature: decoding compiled by XLA, for throughput; "
                             "TF Serving needs --xla_cpu_compilation_enabled=true to run it")
    parser.add_argument("--precision", choices=PRECISIONS,
                        help="savedmodel: the weights' and matrix products' type; bfloat16 (weights cast once, "
                             "layer norm and softmax in float32) for CPUs with avx512_bf16 or amx_bf16 "
                             "(default: float32)")
    parser.add_argument("--beam-patience", type=float,
                        help="savedmodel: beam search ends a sentence once ceil(P x beam size) hypotheses ended "
                             "(CTranslate2's patience; faster); 0: only when no hypothesis can still win "
                             "(default: the model's beam_patience)")
    parser.add_argument("--quantization", choices=QUANTIZATIONS,
                        help="ctranslate2: the weights' type on disk (default: float32)")
    parser.add_argument("--data", help="ctranslate2: a corpus (as train.py's --data) whose dev split is translated "
                                       "to compare the dev BLEU of ours and of the converted model, float32 and int8")
    parser.add_argument("--verbose", action="store_true", help=VERBOSE_HELP)
    args = parser.parse_args(argv)
    check_args(args)
    return args


def check_args(args):
    """Refuses the flags of the other format, in one line naming them."""
    other = ([("--version", args.version is not None), ("--xla", args.xla), ("--precision", args.precision),
              ("--beam-patience", args.beam_patience is not None)]
             if args.format == "ctranslate2" else
             [("--quantization", args.quantization), ("--data", args.data)])
    wrong = [flag for flag, used in other if used]
    if wrong:
        raise UserError(f"{', '.join(wrong)}: not an option of --format {args.format}")
    if args.beam_patience is not None and not 0 <= args.beam_patience <= MAX_BEAM_PATIENCE:
        raise UserError(f"--beam-patience {args.beam_patience}: must be between 0 (the exact rule) and "
                        f"{MAX_BEAM_PATIENCE:g}")


def export_saved_model(args):
    import tensorflow as tf

    from tf_transformer.infer.export import export_model_dir

    export_dir = args.export_dir or os.path.join(args.model_dir, EXPORT_SUBDIR)
    try:
        path = export_model_dir(args.model_dir, export_dir, args.version, args.checkpoint, xla=args.xla,
                                precision=args.precision or "float32", beam_patience=args.beam_patience)
    except (OSError, tf.errors.OpError) as e:
        raise UserError(f"--export-dir {export_dir}: cannot write the export there ({first_line(e)})") from None
    signatures = [SERVING_SIGNATURE, BEAM_SIGNATURE] + ([XLA_SIGNATURE] if args.xla else [])
    print(f"exported {path} (signatures: {', '.join(signatures)})")


def dev_split(data):
    """The dev split of ``--data`` (a corpus directory, an embedded corpus, or the corpus built on first use)."""
    if data == datasets.BUILT_ON_FIRST_USE and not os.path.isdir(data):
        data = datasets.ensure_built(data, log=lambda line: print(line, file=sys.stderr))
    dev = corpus.corpus_splits(data).get("dev")
    if dev is None:
        raise UserError(f"--data {data}: has no dev split to compare the BLEU on")
    return dev


def export_ctranslate2(args):
    from tf_transformer.infer import ct2

    ct2.require_ctranslate2("--format ctranslate2")
    name = CT2_SUBDIR + (f"-{args.quantization}" if args.quantization else "")
    output = args.export_dir or os.path.join(args.model_dir, name)
    dev_pairs = dev_split(args.data).read().pairs if args.data else None
    try:
        result = ct2.export_ctranslate2(args.model_dir, output, args.quantization, args.checkpoint, dev_pairs,
                                        log=lambda line: print(line, file=sys.stderr))
    except OSError as e:
        raise UserError(f"--export-dir {output}: cannot write the model there ({first_line(e)})") from None
    print(f"exported {result.path}: CTranslate2 model ({args.quantization or 'float32'} weights) of {result.weights}; "
          f"conversion check: log-probabilities within {result.score_difference:.1g} of ours")
    if result.bleu:
        same = ", ".join(f"{t} {share:.1%}" for t, share in result.same_outputs.items())
        print(f"dev BLEU ({len(dev_pairs)} sentences of {args.data}, beam {result.beam_size}): "
              + ", ".join(f"{name} {bleu:.1f}" for name, bleu in result.bleu.items())
              + f"; greedy outputs the same as ours: {same}")
        if result.same_outputs["float32"] < ct2.SAME_OUTPUTS_GOAL:
            print(f"warning: the float32 conversion's greedy outputs differ from ours on more than "
                  f"{1 - ct2.SAME_OUTPUTS_GOAL:.0%} of the dev sentences", file=sys.stderr)
    print(f"translate with: python translate.py --ctranslate2 {result.path}")


@report_user_errors
def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.format == "ctranslate2":
        export_ctranslate2(args)
    else:
        export_saved_model(args)


if __name__ == "__main__":
    sys.exit(main())
