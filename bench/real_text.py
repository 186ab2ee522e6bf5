"""Decoding speed on real text: a trained model translating real dev sentences of mixed length.

``bench/decode.py`` forces every sentence to the same number of new tokens; users
translate real sentences, and a batch waits for its slowest hypothesis. This bench
takes a model directory that ``train.py`` wrote (README command 1's ``runs/debian``
by default), the first ``--sentences`` of its corpus' dev split in one fixed shuffled order
(:func:`bench.serving.dev_pairs`: a sample of the whole split), and times, each
after an untimed pass (tracing, XLA compiles), taking turns:

* the exported SavedModel (written here from the model directory, with
  ``--xla``): ``serving_default`` on batches of ``--batch-size`` in that order, as
  a client that does not sort sends them, and on length-sorted batches;
  ``translate_xla`` on length-sorted batches;
* the Python model (:func:`~tf_transformer.infer.translate.translate`, which sorts by
  length): the growing loop, the XLA-compiled loop, and the growing loop with
  each ``--factors`` value as ``max_length_factor`` (a limit of factor x source length);
* the forced-length figure of the same model: ``--batch-size`` of these sentences,
  ``</S>`` masked, ``--forced-tokens`` new tokens each (``bench/decode.py``'s kind).

Each row gives sentences/s, its ratio to the forced-length figure, and the corpus
BLEU of its translations (sacreBLEU), so that what a length limit costs in BLEU
is read beside what it saves. The beam size and length penalty are the model's.

    python bench/real_text.py                                   # runs/debian, 512 dev sentences
    python bench/real_text.py --model-dir runs/debian --sentences 1986 --json real_text.json
"""

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tf_transformer.quiet import quiet_tensorflow  # noqa: E402

quiet_tensorflow()  # TensorFlow's start-up notices off stderr, as the commands do (TF_CPP_MIN_LOG_LEVEL set: shown)

import tensorflow as tf  # noqa: E402

from bench.decode import mask_end  # noqa: E402
from bench.serving import dev_pairs, dev_splits, model_under_test  # noqa: E402
from tf_transformer.cpu import cpu_model, cpu_speed_flags  # noqa: E402
from tf_transformer.data import datasets  # noqa: E402
from tf_transformer.infer import export
from tf_transformer.infer.decode import generate  # noqa: E402
from tf_transformer.infer.translate import source_batch, translate
from tf_transformer.train import scores

FORCED = "forced length"


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model-dir", default=os.path.join("runs", "debian"), help="written by train.py")
    parser.add_argument("--data", default=os.path.join(datasets.data_home(), datasets.BUILT_ON_FIRST_USE),
                        help="the corpus directory whose dev split is translated (default: %(default)s)")
    parser.add_argument("--sentences", type=int, default=512, help="the first N dev sentences")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--factors", default="1.5,2,3", help="max_length_factor values to try (comma-separated)")
    parser.add_argument("--forced-tokens", type=int, default=24)
    parser.add_argument("--repeats", type=int, default=1, help="timed passes of each method (best kept)")
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args(argv)
    if not os.path.isdir(args.model_dir):
        parser.error(f"--model-dir {args.model_dir}: not a directory; train one first (README command 1)")
    for flag, value in (("--sentences", args.sentences), ("--batch-size", args.batch_size),
                        ("--forced-tokens", args.forced_tokens), ("--repeats", args.repeats)):
        if value < 1:
            parser.error(f"{flag} {value}: must be at least 1")
    try:
        args.factors = [float(f) for f in args.factors.split(",") if f.strip()]
    except ValueError:
        parser.error(f"--factors {args.factors}: give numbers separated by commas, e.g. 1.5,2,3")
    args.pairs = dev_pairs(dev_splits(parser, args.data))[:args.sentences]  # the (source, reference) pairs to translate
    return args


def batched(signature, sentences, batch_size, order, beam_size=None):
    """Translations of ``sentences`` through a SavedModel signature, ``batch_size`` at a time,
    as given (unsorted) or sorted by length (characters), returned in input order; ``beam_size``
    for the signatures that take one."""
    beam = {} if beam_size is None else {export.BEAM_SIZE: tf.constant(beam_size)}
    indices = list(range(len(sentences)))
    if order == "sorted":
        indices.sort(key=lambda i: len(sentences[i]))
    out = [None] * len(sentences)
    for start in range(0, len(indices), batch_size):
        rows = indices[start:start + batch_size]
        texts = signature(inputs=tf.constant([sentences[i] for i in rows]), **beam)["translations"].numpy()
        for i, text in zip(rows, texts):
            out[i] = text.decode("utf-8")
    return out


def timed(methods, repeats):
    """One untimed pass of each method, then ``repeats`` timed passes taking turns:
    ({name: best seconds}, {name: translations})."""
    results = {name: fn() for name, fn in methods.items()}
    best = {name: float("inf") for name in methods}
    for _ in range(repeats):
        for name, fn in methods.items():
            started = time.perf_counter()
            results[name] = fn()
            best[name] = min(best[name], time.perf_counter() - started)
    return best, results


def main(argv=None):
    args = parse_args(argv)
    sources, references = [s for s, _ in args.pairs], [t for _, t in args.pairs]
    loaded, description = model_under_test(args, None)  # the weights train.py kept and exported
    hp, model = loaded.hp, loaded.model
    options = dict(batch_size=args.batch_size, beam_size=hp.beam_size, length_penalty=hp.length_penalty,
                   max_length=hp.max_decode_length or None)

    with tempfile.TemporaryDirectory() as scratch:
        saved = tf.saved_model.load(export.export_saved_model(loaded, scratch, xla=True, log=lambda line: None))
        default, compiled = saved.signatures[export.SERVING_SIGNATURE], saved.signatures[export.XLA_SIGNATURE]
        n = args.batch_size
        methods = {
            "SavedModel serving_default, unsorted": lambda: batched(default, sources, n, "unsorted"),
            "SavedModel serving_default, sorted": lambda: batched(default, sources, n, "sorted"),
            "SavedModel translate_xla, sorted": lambda: batched(compiled, sources, n, "sorted", hp.beam_size),
            "Python model, sorted": lambda: translate(sources, *loaded.tokenizers, model, **options),
            "Python model XLA, sorted": lambda: translate(sources, *loaded.tokenizers, model,
                                                                      jit_compile=True, **options),
        }
        for factor in args.factors:
            methods[f"Python model, sorted, max_length_factor {factor:g}"] = (
                lambda factor=factor: translate(sources, *loaded.tokenizers, model,
                                                            max_length_factor=factor, **options))
        seconds, results = timed(methods, args.repeats)

    forced_seconds = forced_length_seconds(model, loaded.tokenizers[0], sources[:args.batch_size], hp,
                                           args.forced_tokens, args.repeats)
    forced_rate = min(args.batch_size, len(sources)) / forced_seconds
    rows = [{"method": f"{FORCED}: {min(n, len(sources))} sentences x {args.forced_tokens} new tokens, "
                       f"Python model", "sentences_per_s": round(forced_rate, 1), "vs_forced": 1.0, "bleu": None}]
    for name, translations in results.items():
        rate = len(sources) / seconds[name]
        rows.append({"method": name, "sentences_per_s": round(rate, 1), "vs_forced": round(rate / forced_rate, 2),
                     "bleu": round(scores.score(translations, references).bleu, 2)})
    print_table(args, hp, rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "cpu": cpu_model(), "cpu_flags": cpu_speed_flags(), "sentences": len(sources),
                       "beam_size": hp.beam_size, "model": description}, f, indent=2)


def forced_length_seconds(model, source_tokenizer, sentences, hp, tokens, repeats):
    """Best seconds of the model's beam search (its beam size) on these sentences with ``</S>``
    masked, so that every hypothesis runs ``tokens`` steps; the model's bias is restored."""
    x = source_batch(source_tokenizer, tf.constant(sentences), model.config.maxlen).ids
    bias = model.logits_layer.bias.numpy()
    mask_end(model)
    try:
        run = lambda: generate(model, x, beam_size=hp.beam_size, length_penalty=hp.length_penalty,  # noqa: E731
                               max_length=tokens)[0].numpy()
        seconds, _ = timed({FORCED: run}, repeats)
    finally:
        model.logits_layer.bias.assign(bias)
    return seconds[FORCED]


def print_table(args, hp, rows):
    print(f"\nCPU: {cpu_model()} ({cpu_speed_flags()}), {os.cpu_count()} cores; load average "
          f"{os.getloadavg()[0]:.1f}; model {args.model_dir}, beam {hp.beam_size}, length penalty "
          f"{hp.length_penalty}; {args.sentences} dev sentences of {args.data}, batches of {args.batch_size}")
    width = max(len(row["method"]) for row in rows)
    print(f"{'method':<{width}} {'sentences/s':>12} {'/ forced':>9} {'BLEU':>6}")
    for row in rows:
        bleu = "-" if row["bleu"] is None else f"{row['bleu']:.2f}"
        print(f"{row['method']:<{width}} {row['sentences_per_s']:>12.1f} {row['vs_forced']:>8.2f}x {bleu:>6}")
    print("command: python bench/real_text.py " + " ".join(sys.argv[1:]))


if __name__ == "__main__":
    main()
