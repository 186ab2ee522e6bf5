"""Training loss after N steps on the same batches: ours with one setting changed, and the keras-hub peer.

A cheap learning-speed comparison (minutes, not the quality table's full
runs): each variant trains the default preset from the same seed on the same
batches of the embedded corpus (or ``--data``) and prints the mean training
loss of its last 100 steps. Variants:

* ``default``: the preset as it is;
* ``glorot``: ``attention_init: glorot`` (the blog's initialization);
* ``per_head``: ``attention_init: per_head``;
* ``no-scale``: the embeddings without the blog's sqrt(C) scale;
* ``learned``: learned positions instead of the sinusoid;
* ``keras-hub``: :class:`bench.peers.KerasHubTransformer` at the same size.

    python bench/ablation.py --steps 600 glorot per_head keras-hub no-scale
"""

import argparse
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

from bench.peers import KerasHubTransformer, keras_hub_train_step  # noqa: E402
from tf_transformer.data import corpus  # noqa: E402
from tf_transformer.hparams import load_hparams  # noqa: E402
from tf_transformer.model_dir.checkpoint_files import build_model  # noqa: E402
from tf_transformer.train import run
from tf_transformer.train.step import epoch_batches, make_optimizer, make_train_step, precision_policy
from tf_transformer.train.step_speed import choose_precision  # noqa: E402

OVERRIDES = {"default": [], "glorot": ["attention_init=glorot"], "per_head": ["attention_init=per_head"],
             "no-scale": [], "learned": ["positional_encoding=learned"], "keras-hub": []}


def make_step(variant, hp, tokenizers):
    """The variant's compiled step ``(x, y) -> loss``."""
    keras.utils.set_random_seed(hp.seed)
    optimizer = make_optimizer(hp)
    if variant == "keras-hub":
        model = KerasHubTransformer(hp, tokenizers[0].vocab_size, tokenizers[1].vocab_size, hp.maxlen + 1)
        return keras_hub_train_step(model, optimizer, hp)
    model = build_model(hp, *tokenizers)
    if variant == "no-scale":
        model.enc_embedding.scale = model.dec_embedding.scale = False
    step = make_train_step(model, optimizer, hp)
    return lambda x, y: step(x, y)[0]


def losses_after(step, examples, hp, steps):
    """The first ``steps`` training losses, epoch after epoch of the trainer's own batches."""
    losses, epoch = [], 0
    while len(losses) < steps:
        for x, y in epoch_batches(examples, hp, epoch):
            losses.append(step(x, y))
            if len(losses) == steps:
                break
        epoch += 1
    return [float(loss) for loss in losses]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("variants", nargs="+", choices=sorted(OVERRIDES))
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--data", default=corpus.DEFAULT_CORPUS, help="a corpus directory or embedded corpus")
    parser.add_argument("--tokenizer-dir", default=os.path.join("runs", "ablation"),
                        help="where the SentencePiece model is trained once and reused")
    args = parser.parse_args(argv)
    if args.steps < 100:
        parser.error(f"--steps {args.steps}: at least 100 (the figure is the mean of the last 100)")
    splits = corpus.corpus_splits(args.data)
    for variant in args.variants:
        hp = load_hparams(None, overrides=OVERRIDES[variant])
        tokenizers, examples, _ = run.prepare_examples(splits, hp, args.tokenizer_dir, lambda line: None)
        policy, _ = choose_precision(hp)
        started = time.perf_counter()
        with precision_policy(policy):
            losses = losses_after(make_step(variant, hp, tokenizers), examples, hp, args.steps)
        print(f"{variant:<10} {policy}: mean training loss of steps {args.steps - 99}-{args.steps} "
              f"{np.mean(losses[-100:]):.4f} ({time.perf_counter() - started:.0f}s)", flush=True)
    print("command: python bench/ablation.py " + " ".join(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    main()
