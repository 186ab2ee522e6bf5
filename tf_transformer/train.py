"""Training: ``python train.py [--preset NAME] [--set key=value ...] [--data DIR | --source F --target F | --tsv F]``.

Trains the tokenizer (or reuses the one in the model directory), batches the
corpus by length, trains with a ``tf.function`` step, saves checkpoints,
resumes from the latest one, and prints sample translations at the end.
Without data arguments it trains on the embedded Ding corpus.
"""

import argparse
import os
import sys
import time

import keras
import numpy as np
import tensorflow as tf

from tf_transformer import corpus, data_load, model_dir as run_files
from tf_transformer.errors import UserError, report_user_errors
from tf_transformer.hparams import load_hparams, preset_names
from tf_transformer.model import masked_accuracy, masked_loss, shift_right
from tf_transformer.modules import NoamSchedule
from tf_transformer.tokenizer import train_tokenizers
from tf_transformer.translate import translate


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="train.py", description=__doc__.split("\n")[0])
    parser.add_argument("--preset", help=f"hyper-parameter preset: {', '.join(preset_names())}")
    parser.add_argument("--config", help="a YAML file of hyper-parameters applied over the preset")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override one hyper-parameter, e.g. --set num_blocks=2 (repeatable)")
    parser.add_argument("--data", default=corpus.DEFAULT_CORPUS,
                        help=f"a corpus directory (train/dev/test.LANG, .tsv or IWSLT files) or an embedded "
                             f"corpus: {', '.join(corpus.EMBEDDED)} (default: %(default)s)")
    parser.add_argument("--source-lang", default="de", help="source file suffix in --data (default: %(default)s)")
    parser.add_argument("--target-lang", default="en", help="target file suffix in --data (default: %(default)s)")
    parser.add_argument("--source", help="training source text, one sentence per line (instead of --data)")
    parser.add_argument("--target", help="training target text, line-aligned with --source")
    parser.add_argument("--tsv", help="training pairs as one source<TAB>target file (instead of --data)")
    parser.add_argument("--model-dir", help="where checkpoints, vocabularies and hparams go (default: runs/PRESET)")
    parser.add_argument("--save-every-secs", type=float, default=60.0,
                        help="save a checkpoint after an epoch once this many seconds passed since the last")
    parser.add_argument("--samples", type=int, default=3, help="training sentences to translate at the end")
    args = parser.parse_args(argv)
    if (args.source is None) != (args.target is None):
        parser.error("--source and --target go together")
    if args.source and args.tsv:
        parser.error("give either --source/--target or --tsv")
    return args


def corpus_from_args(args):
    """The splits to read: {"train": Split, ...}; dev and test only come with --data."""
    if args.source:
        return {"train": corpus.Split(args.source, args.target)}
    if args.tsv:
        return {"train": corpus.Split(args.tsv)}
    return corpus.corpus_splits(args.data, args.source_lang, args.target_lang)


def learning_rate(hp):
    """The hparams' schedule: a constant or :class:`NoamSchedule`."""
    if hp.lr_schedule == "noam":
        return NoamSchedule(hp.learning_rate, hp.warmup_steps)
    return hp.learning_rate


def make_train_step(model, optimizer, hp):
    """A compiled step: (x, y) -> (loss, accuracy), updating the weights.

    The signature has unknown batch and lengths, so batches of any shape reuse
    one trace.
    """
    spec = tf.TensorSpec([None, None], tf.int32)

    @tf.function(input_signature=[spec, spec])
    def train_step(x, y):
        with tf.GradientTape() as tape:
            logits = model((x, shift_right(y)), training=True)
            loss = masked_loss(y, logits, hp.label_smoothing)
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        return loss, masked_accuracy(y, logits)

    return train_step


def prepare_tokenizers(model_dir, hp, pairs, log):
    """The model directory's tokenizers, or new ones trained on ``pairs``."""
    tokenizers = run_files.load_tokenizers(model_dir, hp)
    if tokenizers is not None:
        return tokenizers
    started = time.monotonic()
    tokenizers = train_tokenizers(hp, pairs)
    log(f"tokenizer: {hp.tokenizer}, trained in {time.monotonic() - started:.1f}s")
    return tokenizers


def prepare_examples(splits, hp, model_dir, log):
    """Reads the training split, prepares tokenizers, tokenizes and filters; logs what was dropped.

    Returns:
      (tokenizers, examples, train_pairs).
    """
    train_split = splits["train"].read()
    run_files.check_compatible(model_dir, hp)
    tokenizers = prepare_tokenizers(model_dir, hp, train_split.pairs, log)
    examples = data_load.encode_pairs(train_split.pairs, *tokenizers, hp.maxlen)
    if not len(examples):
        raise UserError(f"{train_split.origin}: no sentence pair of at most maxlen={hp.maxlen} tokens "
                        f"(</S> included); raise it with --set maxlen=N")
    log(f"corpus: {len(examples)} pairs from {train_split.origin} ({train_split.blank} with a blank side and "
        f"{examples.too_long} longer than maxlen={hp.maxlen} dropped); vocabulary: "
        f"{tokenizers[0].vocab_size} source, {tokenizers[1].vocab_size} target")
    return tokenizers, examples, train_split.pairs


def sample_sources(splits, train_pairs, tokenizers, maxlen, samples):
    """The first ``samples`` source sentences of at most ``maxlen`` tokens from the dev split,
    else from the training pairs."""
    pairs = splits["dev"].read().pairs if "dev" in splits else train_pairs
    sources = [s for s, _ in pairs[:1000]]
    lengths = data_load.tokenize_with_eos(tokenizers[0], sources).row_lengths().numpy()
    return [s for s, n in zip(sources, lengths) if n <= maxlen][:samples]


def train(hp, splits, model_dir, save_every_secs=60.0, samples=3, log=print):
    """Trains (or resumes) and returns the model. See the module docstring."""
    tokenizers, examples, train_pairs = prepare_examples(splits, hp, model_dir, log)
    run_files.save_run_files(model_dir, hp, *tokenizers)

    keras.utils.set_random_seed(hp.seed)
    model = run_files.build_model(hp, *tokenizers)
    optimizer = keras.optimizers.Adam(learning_rate(hp), beta_1=hp.adam_beta1, beta_2=hp.adam_beta2,
                                      epsilon=hp.adam_epsilon)
    optimizer.build(model.trainable_variables)
    epoch = tf.Variable(0, dtype=tf.int64, trainable=False, name="epoch")
    fingerprint = tf.Variable(run_files.tokenizer_fingerprint(*tokenizers), trainable=False)
    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, epoch=epoch, tokenizer_fingerprint=fingerprint)
    manager = tf.train.CheckpointManager(checkpoint, model_dir, max_to_keep=3)
    if manager.latest_checkpoint:
        run_files.check_tokenizer(model_dir, hp, manager.latest_checkpoint, tokenizers)
        checkpoint.restore(manager.latest_checkpoint).assert_existing_objects_matched()
        log(f"resumed from {manager.latest_checkpoint} (epoch {int(epoch.numpy())})")

    dataset = data_load.make_dataset(examples, hp, shuffle=True, seed=hp.seed)
    train_step = make_train_step(model, optimizer, hp)
    report_every = max(1, hp.num_epochs // 10)
    last_save = time.monotonic()
    while int(epoch.numpy()) < hp.num_epochs:
        started, losses, accuracies, stats = time.monotonic(), [], [], data_load.BatchStats()
        for x, y in dataset:
            loss, accuracy = train_step(x, y)
            losses.append(loss)  # tensors: read once per epoch, not once per step
            accuracies.append(accuracy)
            stats.add(x, y)
        epoch.assign_add(1)
        done, seconds = int(epoch.numpy()), time.monotonic() - started
        if done % report_every == 0 or done == hp.num_epochs:
            padding = stats.summary(hp.maxlen)
            log(f"epoch {done}/{hp.num_epochs}: loss {np.mean(losses):.4f}, accuracy {np.mean(accuracies):.3f}, "
                f"{stats.batches} steps in {seconds:.2f}s ({stats.target_tokens / seconds:.0f} target tokens/s, "
                f"{padding['padding']:.0%} padding, {padding['padding_at_maxlen']:.0%} if padded to maxlen)")
        if done == hp.num_epochs or time.monotonic() - last_save >= save_every_secs:
            manager.save(checkpoint_number=int(optimizer.iterations.numpy()))
            last_save = time.monotonic()
    log(f"checkpoint: {manager.latest_checkpoint}")

    if samples:
        sources = sample_sources(splits, train_pairs, tokenizers, hp.maxlen, samples)
        for source, translation in zip(sources, translate(sources, *tokenizers, model)):
            log(f"  {source}  ->  {translation}")
    return model


@report_user_errors
def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    hp = load_hparams(args.preset, args.config, args.set)
    model_dir = args.model_dir or os.path.join("runs", args.preset or "default")
    train(hp, corpus_from_args(args), model_dir, args.save_every_secs, args.samples)


if __name__ == "__main__":
    sys.exit(main())
