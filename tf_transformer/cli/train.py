"""Training: ``python train.py [--preset NAME] [--set key=value ...] [--data DIR | --source F --target F | --tsv F]``.

Trains on the corpus the flags name (:func:`tf_transformer.train.run.train`, whose
docstring says what a run does and writes); without data arguments on the
embedded Ding corpus.

``--strategy multi_worker`` runs one process per ``TF_CONFIG`` task; only the
chief writes and evaluates, and a signal to any worker stops all at the same step.
``--deterministic`` turns on TensorFlow's op determinism: a resumed run then
ends with exactly the weights of an uninterrupted one.

``--init-from DIR --model-dir NEW`` fine-tunes: a new run in NEW starts from the
weights training kept in DIR (its average, else its best checkpoint, else its
newest) and DIR's tokenizer, with a fresh optimizer and schedule, on any
corpus; the hyper-parameters are DIR's hparams.yaml, changed with ``--set``
(not the architecture's).
"""

import argparse
import math
import os
import sys

from tf_transformer.data import corpus, datasets
from tf_transformer.data.datasets.debian import DownloadError
from tf_transformer.errors import UserError, report_user_errors
from tf_transformer.model_dir.layout import HPARAMS_FILE
from tf_transformer.options import STRATEGIES
from tf_transformer.presets import preset_names
from tf_transformer.quiet import VERBOSE_HELP
from tf_transformer.train.cluster import DEFAULT_TIMEOUT, Stopped

# The modules that import TensorFlow are imported where they are used (the package's rule: tf_transformer.cli).


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="train.py", description=__doc__.split("\n")[0])
    parser.add_argument("--preset", help=f"hyper-parameter preset: {', '.join(preset_names())}")
    parser.add_argument("--config", help="a YAML file of hyper-parameters applied over the preset")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override one hyper-parameter, e.g. --set num_blocks=2 (repeatable)")
    parser.add_argument("--data", default=corpus.DEFAULT_CORPUS,
                        help=f"a corpus directory (train/dev/test.LANG, .tsv or IWSLT files), an embedded "
                             f"corpus: {', '.join(corpus.EMBEDDED)}, or {datasets.BUILT_ON_FIRST_USE}: built from "
                             f"Debian's archive into $TF_TRANSFORMER_DATA (default {datasets.DATA_HOME}) on first "
                             f"use, the embedded corpus when the archive cannot be reached (default: %(default)s)")
    parser.add_argument("--source-lang", default="de", help="source file suffix in --data (default: %(default)s)")
    parser.add_argument("--target-lang", default="en", help="target file suffix in --data (default: %(default)s)")
    parser.add_argument("--source", help="training source text, one sentence per line (instead of --data)")
    parser.add_argument("--target", help="training target text, line-aligned with --source")
    parser.add_argument("--tsv", help="training pairs as one source<TAB>target file (instead of --data)")
    parser.add_argument("--model-dir", help="where checkpoints, vocabularies and hparams go (default: runs/PRESET)")
    parser.add_argument("--strategy", default="default", choices=STRATEGIES,
                        help="default: one device; mirrored: all local GPUs (or CPU devices); multi_worker: the "
                             "cluster in TF_CONFIG (default: %(default)s)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar (log lines only)")
    parser.add_argument("--export-dir", help="where the SavedModel goes (default: MODEL_DIR/export)")
    parser.add_argument("--no-export", action="store_true", help="do not export a SavedModel at the end")
    parser.add_argument("--cluster-timeout", type=float, default=DEFAULT_TIMEOUT, metavar="SECONDS",
                        help="multi_worker: give up when the other tasks of TF_CONFIG do not all answer within "
                             "this time (0: wait without limit; default: %(default)g)")
    parser.add_argument("--save-every-secs", type=float, default=0.0,
                        help="also save a checkpoint once this many seconds passed since the last one "
                             "(default: off; save_every_steps and epoch ends always save)")
    parser.add_argument("--samples", type=int, default=3, help="dev translations to print at the end")
    parser.add_argument("--deterministic", action="store_true",
                        help="make every TensorFlow op deterministic (slower): a resumed run then ends with "
                             "exactly the weights of an uninterrupted one")
    parser.add_argument("--init-from", metavar="DIR",
                        help="fine-tune: start a new run in --model-dir from the weights and tokenizer that training "
                             "kept in DIR, with a fresh optimizer and schedule; hyper-parameters: DIR's hparams.yaml "
                             "and --set (the architecture's stay)")
    parser.add_argument("--restart", action="store_true",
                        help="start over from step 0: what earlier runs wrote in --model-dir (checkpoints, "
                             "tokenizer, hparams.yaml, logs; not export/) is moved to MODEL_DIR/previous-TIME/")
    parser.add_argument("--verbose", action="store_true", help=VERBOSE_HELP)
    args = parser.parse_args(argv)
    if (args.source is None) != (args.target is None):
        parser.error("--source and --target go together")
    if args.source and args.tsv:
        parser.error("give either --source/--target or --tsv")
    return args


def check_args(args):
    """Refuses flag values that would fail later, each with one line naming the flag."""
    if args.samples < 0:
        raise UserError(f"--samples {args.samples}: must be 0 or more")
    if not (math.isfinite(args.save_every_secs) and args.save_every_secs >= 0):
        raise UserError(f"--save-every-secs {args.save_every_secs}: must be a finite number, 0 (off) or more")
    if not (math.isfinite(args.cluster_timeout) and args.cluster_timeout >= 0):
        raise UserError(f"--cluster-timeout {args.cluster_timeout}: must be a finite number of seconds, 0 (no "
                        f"limit) or more")
    if args.init_from:
        if not os.path.isfile(os.path.join(args.init_from, HPARAMS_FILE)):
            raise UserError(f"--init-from {args.init_from}: not a model directory that train.py wrote (no "
                            f"{HPARAMS_FILE} there)")
        if args.preset:
            raise UserError(f"--preset with --init-from: the hyper-parameters are {args.init_from}'s {HPARAMS_FILE}; "
                            f"change the training ones with --set KEY=VALUE")
        if not args.model_dir:
            raise UserError("--init-from needs --model-dir NEW: the directory of the new, fine-tuned run")
        if args.restart:
            raise UserError("--restart with --init-from: give a new --model-dir for the fine-tuned run instead")
        if args.strategy == "multi_worker":  # the other workers would not read the copied tokenizer
            raise UserError("--init-from with --strategy multi_worker: not supported; fine-tune with --strategy "
                            "default or mirrored")
    if args.restart and args.strategy == "multi_worker":
        raise UserError("--restart with --strategy multi_worker: set the old run aside by hand "
                        "(or use another --model-dir), then start the workers")


def corpus_from_args(args, log=print):
    """The splits to read: {"train": Split, ...}; dev and test only come with --data.
    ``--data debian-de-en`` (not a directory) is built on first use; when Debian's archive
    cannot be reached, one line says so and the embedded corpus is used instead."""
    if args.source:
        return {"train": corpus.Split(args.source, args.target)}
    if args.tsv:
        return {"train": corpus.Split(args.tsv)}
    data = args.data
    if data == datasets.BUILT_ON_FIRST_USE and not os.path.isdir(data):
        try:
            data = datasets.ensure_built(data, log=log)
        except DownloadError as e:
            log(f"warning: cannot build {data} ({e}); training on the embedded corpus {corpus.DEFAULT_CORPUS} "
                f"instead")
            data = corpus.DEFAULT_CORPUS
    return corpus.corpus_splits(data, args.source_lang, args.target_lang)


@report_user_errors
def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    check_args(args)
    import tensorflow as tf

    from tf_transformer.hparams import load_hparams
    from tf_transformer.train.checkpoints import Interrupted
    from tf_transformer.train.run import train
    from tf_transformer.train.step import make_strategy

    if args.deterministic:
        tf.config.experimental.enable_op_determinism()
    try:  # before any other op: multi_worker needs that
        strategy = make_strategy(args.strategy, args.cluster_timeout)
    except Stopped as e:
        print(f"interrupted: {e}", file=sys.stderr)
        return e.exit_code
    hp = load_hparams(args.preset, args.config or (args.init_from and os.path.join(args.init_from, HPARAMS_FILE)),
                      args.set)
    model_dir = args.model_dir or os.path.join("runs", args.preset or "default")
    try:
        train(hp, corpus_from_args(args), model_dir, strategy, progress=not args.no_progress,
                      save_every_secs=args.save_every_secs, samples=args.samples, export=not args.no_export,
                      export_dir=args.export_dir, restart=args.restart, init_from=args.init_from)
    except Interrupted as e:
        print(f"interrupted: {e}", file=sys.stderr)
        return e.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
