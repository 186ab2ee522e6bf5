"""Does the input pipeline keep up with training? Sentence pairs per second, same run.

Measures, on one corpus and one preset:

1. ``encode``: reading, tokenizing (the tokenizer's graph op), filtering by maxlen;
2. ``pipeline``: one epoch of training's batches (``train.step.epoch_batches``:
   ``make_dataset``'s shuffle, bucketing by a token budget, padding and prefetch,
   read without ``tf.data``'s autotuning as training reads them) with nothing
   consuming it;
3. ``train``: the training step alone on batches taken from that pipeline
   (held in memory, so the pipeline's cost is not counted twice).

and prints each as pairs/s with the ratio ``pipeline / train``: above 1 the
pipeline produces batches faster than a step consumes them, so prefetching
hides it entirely.

    python bench/pipeline.py                               # embedded corpus, small preset
    python bench/pipeline.py --data /tmp/debian-de-en --steps 30
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tf_transformer.allocator import reuse_cpu_memory  # noqa: E402
from tf_transformer.quiet import quiet_tensorflow  # noqa: E402

quiet_tensorflow()  # TensorFlow's start-up notices off stderr, as the commands do (TF_CPP_MIN_LOG_LEVEL set: shown)
reuse_cpu_memory()  # TensorFlow's CPU tensors from its BFC allocator, as the commands do

import keras  # noqa: E402
import numpy as np  # noqa: E402

from tf_transformer.data import corpus, data_load  # noqa: E402
from tf_transformer.data.tokenizer import train_tokenizers  # noqa: E402
from tf_transformer.hparams import load_hparams  # noqa: E402
from tf_transformer.model_dir import checkpoint_files
from tf_transformer.train.step import epoch_batches, learning_rate, make_train_step  # noqa: E402


def timed(fn):
    started = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - started


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", default=corpus.DEFAULT_CORPUS, help="corpus directory or embedded name")
    parser.add_argument("--preset", default="small")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--steps", type=int, default=20, help="training steps timed (after 3 warm-up steps)")
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args(argv)
    hp = load_hparams(args.preset, overrides=args.set)

    pairs = corpus.corpus_splits(args.data)["train"].read().pairs
    tokenizers, tokenizer_seconds = timed(lambda: train_tokenizers(hp, pairs))
    examples, encode_seconds = timed(lambda: data_load.encode_pairs(pairs, *tokenizers, hp.maxlen))
    dataset = epoch_batches(examples, hp, epoch=0)
    batches, pipeline_seconds = timed(lambda: list(dataset))

    keras.utils.set_random_seed(hp.seed)
    model = checkpoint_files.build_model(hp, *tokenizers)
    optimizer = keras.optimizers.Adam(learning_rate(hp), beta_1=hp.adam_beta1, beta_2=hp.adam_beta2,
                                      epsilon=hp.adam_epsilon)
    step = make_train_step(model, optimizer, hp)
    for x, y in batches[:3]:
        step(x, y)
    timed_batches = [batches[i % len(batches)] for i in range(3, 3 + args.steps)]

    def train():
        for x, y in timed_batches:
            loss, _ = step(x, y)
        return float(loss)

    _, train_seconds = timed(train)
    train_pairs = sum(int(x.shape[0]) for x, _ in timed_batches)
    stats = data_load.padding_stats(batches, hp.maxlen)
    figures = {
        "corpus": args.data, "preset": args.preset, "pairs": len(pairs), "kept": len(examples),
        "batches": len(batches), "padding": round(stats["padding"], 4),
        "padding_at_maxlen": round(stats["padding_at_maxlen"], 4),
        "tokenizer_training_s": round(tokenizer_seconds, 2),
        "encode_pairs_per_s": round(len(pairs) / encode_seconds),
        "pipeline_pairs_per_s": round(len(examples) / pipeline_seconds),
        "train_pairs_per_s": round(train_pairs / train_seconds),
        "train_target_tokens_per_s": round(sum(int(np.count_nonzero(y)) for _, y in timed_batches) / train_seconds),
    }
    figures["pipeline_over_train"] = round(figures["pipeline_pairs_per_s"] / figures["train_pairs_per_s"], 1)
    print(f"corpus {args.data}: {len(pairs)} pairs, {len(examples)} within maxlen={hp.maxlen}; "
          f"{len(batches)} batches of <= {hp.batch_tokens} tokens, {stats['padding']:.1%} padding "
          f"({stats['padding_at_maxlen']:.1%} if padded to maxlen)")
    print(f"{'stage':<10} {'pairs/s':>10}")
    for stage in ("encode", "pipeline", "train"):
        print(f"{stage:<10} {figures[stage + '_pairs_per_s']:>10}")
    print(f"pipeline / train = {figures['pipeline_over_train']}x  "
          f"(training: {figures['train_target_tokens_per_s']} target tokens/s, preset {args.preset})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=2)


if __name__ == "__main__":
    main()
