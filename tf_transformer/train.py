"""Training: ``python train.py [--preset NAME] [--set key=value ...] [--source F --target F]``.

Builds the vocabularies (or reuses those in the model directory), trains with
a ``tf.function`` step, saves checkpoints, resumes from the latest one, and
prints sample translations at the end.
"""

import argparse
import math
import os
import sys
import time

import keras
import numpy as np
import tensorflow as tf

from tf_transformer import data_load, model_dir as run_files
from tf_transformer.decoding import greedy_decode
from tf_transformer.errors import UserError, report_user_errors
from tf_transformer.hparams import load_hparams, preset_names
from tf_transformer.model import masked_accuracy, masked_loss, shift_right
from tf_transformer.modules import NoamSchedule
from tf_transformer.vocab import WordVocab


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="train.py", description=__doc__.split("\n")[0])
    parser.add_argument("--preset", help=f"hyper-parameter preset: {', '.join(preset_names())}")
    parser.add_argument("--config", help="a YAML file of hyper-parameters applied over the preset")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override one hyper-parameter, e.g. --set num_blocks=2 (repeatable)")
    parser.add_argument("--source", help="training source text, one sentence per line (default: the toy corpus)")
    parser.add_argument("--target", help="training target text, line-aligned with --source")
    parser.add_argument("--model-dir", help="where checkpoints, vocabularies and hparams go (default: runs/PRESET)")
    parser.add_argument("--save-every-secs", type=float, default=60.0,
                        help="save a checkpoint after an epoch once this many seconds passed since the last")
    parser.add_argument("--samples", type=int, default=3, help="training sentences to translate at the end")
    args = parser.parse_args(argv)
    if (args.source is None) != (args.target is None):
        parser.error("--source and --target go together")
    return args


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


def prepare_vocabs(model_dir, hp, pairs):
    """The model directory's vocabularies, or new ones built from ``pairs``."""
    vocabs = run_files.load_vocabs(model_dir)
    if vocabs is not None:
        return vocabs
    return (WordVocab.build([s for s, _ in pairs], hp.vocab_size, hp.min_count),
            WordVocab.build([t for _, t in pairs], hp.vocab_size, hp.min_count))


def train(hp, source_path, target_path, model_dir, save_every_secs=60.0, samples=3, log=print):
    """Trains (or resumes) and returns the model. See the module docstring."""
    pairs, blank = data_load.read_parallel(source_path, target_path)
    run_files.check_compatible(model_dir, hp)
    source_vocab, target_vocab = prepare_vocabs(model_dir, hp, pairs)
    examples, too_long = data_load.encode_pairs(pairs, source_vocab, target_vocab, hp.maxlen)
    if not examples:
        raise UserError(f"no sentence pair of at most maxlen={hp.maxlen} tokens in {source_path}; "
                        f"raise it with --set maxlen=N")
    log(f"corpus: {len(examples)} pairs ({blank} blank and {too_long} longer than maxlen={hp.maxlen} dropped); "
        f"vocabulary: {len(source_vocab)} source, {len(target_vocab)} target")
    run_files.save_run_files(model_dir, hp, source_vocab, target_vocab)

    keras.utils.set_random_seed(hp.seed)
    model = run_files.build_model(hp, source_vocab, target_vocab)
    optimizer = keras.optimizers.Adam(learning_rate(hp), beta_1=hp.adam_beta1, beta_2=hp.adam_beta2,
                                      epsilon=hp.adam_epsilon)
    optimizer.build(model.trainable_variables)
    epoch = tf.Variable(0, dtype=tf.int64, trainable=False, name="epoch")
    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, epoch=epoch)
    manager = tf.train.CheckpointManager(checkpoint, model_dir, max_to_keep=3)
    if manager.latest_checkpoint:
        checkpoint.restore(manager.latest_checkpoint).assert_existing_objects_matched()
        log(f"resumed from {manager.latest_checkpoint} (epoch {int(epoch.numpy())})")

    dataset = data_load.make_dataset(examples, hp.batch_size, shuffle=True, seed=hp.seed)
    train_step = make_train_step(model, optimizer, hp)
    steps_per_epoch = math.ceil(len(examples) / hp.batch_size)
    report_every = max(1, hp.num_epochs // 10)
    last_save = time.monotonic()
    while int(epoch.numpy()) < hp.num_epochs:
        started, losses, accuracies = time.monotonic(), [], []
        for x, y in dataset:
            loss, accuracy = train_step(x, y)
            losses.append(float(loss))
            accuracies.append(float(accuracy))
        epoch.assign_add(1)
        done = int(epoch.numpy())
        if done % report_every == 0 or done == hp.num_epochs:
            log(f"epoch {done}/{hp.num_epochs}: loss {np.mean(losses):.4f}, accuracy {np.mean(accuracies):.3f}, "
                f"{steps_per_epoch} steps in {time.monotonic() - started:.2f}s")
        if done == hp.num_epochs or time.monotonic() - last_save >= save_every_secs:
            manager.save(checkpoint_number=int(optimizer.iterations.numpy()))
            last_save = time.monotonic()
    log(f"checkpoint: {manager.latest_checkpoint}")

    if samples:
        sources = [x for x, _ in examples[:samples]]
        for x, ids in zip(sources, greedy_decode(model, data_load.pad_batch(sources))):
            log(f"  {source_vocab.decode(x)}  ->  {target_vocab.decode(ids)}")
    return model


@report_user_errors
def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    hp = load_hparams(args.preset, args.config, args.set)
    source = args.source or data_load.TOY_CORPUS + ".de"
    target = args.target or data_load.TOY_CORPUS + ".en"
    model_dir = args.model_dir or os.path.join("runs", args.preset or "default")
    train(hp, source, target, model_dir, args.save_every_secs, args.samples)


if __name__ == "__main__":
    sys.exit(main())
