"""The SavedModel against the Python model: latency of one sentence, throughput of a batch.

Exports a model (:mod:`tf_transformer.infer.export`) to a temporary folder, loads it
with ``tf.saved_model.load`` as TF Serving would, and measures:

1. **latency**: one sentence at a time through the export's ``translate``
   signature (text in, text out: tokenizer, cached decoder, detokenizer), for
   greedy decoding and for beam search; p50 and p99 over ``--latency-runs``
   calls, each with the next dev sentence (:func:`dev_pairs`' order), after warm-up calls;
2. **throughput**: a batch of ``--sentences`` dev sentences through the same
   signature and through the Python model (``translate_nbest``, text
   in, text out as well): sentences/s and generated tokens/s, best of
   ``--repeats`` after a warm-up.

Without ``--model-dir`` the model is the ``small`` configuration with random
weights (seeded) and a SentencePiece model trained on the embedded corpus'
train split, with its ``</S>`` logit masked so that every sentence decodes
exactly ``--tokens`` new tokens (the lengths of the decoding benchmark,
``bench/decode.py``). With ``--model-dir`` it is that trained model, stopping
at ``</S>`` as in use.

``--intra-op-threads``/``--inter-op-threads`` set TensorFlow's thread pools,
as TF Serving's ``--tensorflow_intra_op_parallelism`` and
``--tensorflow_inter_op_parallelism`` do (default: TensorFlow's, one thread
per core each). One sentence is a chain of small ops, which one thread runs
fastest.

    python bench/serving.py
    python bench/serving.py --intra-op-threads 1 --inter-op-threads 1
    python bench/serving.py --model-dir runs/default --latency-runs 200 --json serving.json
"""

import argparse
import json
import os
import random
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tf_transformer.quiet import quiet_tensorflow  # noqa: E402

quiet_tensorflow()  # TensorFlow's start-up notices off stderr, as the commands do (TF_CPP_MIN_LOG_LEVEL set: shown)

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from bench.decode import best_times, forced_length_model  # noqa: E402
from tf_transformer.data import corpus  # noqa: E402
from tf_transformer.data.tokenizer import train_tokenizers  # noqa: E402
from tf_transformer.data.vocab import EOS_ID, PAD_ID  # noqa: E402
from tf_transformer.errors import UserError  # noqa: E402
from tf_transformer.hparams import load_hparams  # noqa: E402
from tf_transformer.infer import export
from tf_transformer.infer.decode import generate
from tf_transformer.infer.load import LoadedModel, load_for_inference  # noqa: E402
from tf_transformer.infer.translate import source_batch, translate_nbest
from tf_transformer.train.average import current_average  # noqa: E402


def dev_corpus(parser, data, trained_by=None):
    """The corpus whose dev split a bench translates: ``data`` (``--data``), which a trained model needs, its own
    corpus (another corpus' sentences say nothing of its BLEU and little of its speed); the embedded corpus for
    the random model. ``trained_by``: the flag that named a trained model (``--model-dir``, ``--export-dir``), if
    one did."""
    if data is None and trained_by:
        parser.error(f"{trained_by} needs --data: the corpus the model was trained on, whose dev split is translated "
                     "(README command 1's runs/debian: --data ~/.cache/tf-transformer/debian-de-en)")
    return data or corpus.DEFAULT_CORPUS


def dev_splits(parser, data):
    """``corpus.corpus_splits(data)`` of a bench that translates the dev split: a ``--data`` that is no corpus, or
    a corpus without a dev split, is a one-line parser error (exit 2)."""
    try:
        splits = corpus.corpus_splits(data)
    except UserError as error:
        parser.error(str(error))
    if "dev" not in splits:
        parser.error(f"--data {data}: the corpus has no dev split (it has: {', '.join(sorted(splits))})")
    return splits


def dev_pairs(splits):
    """The dev split's (source, reference) pairs in one fixed shuffled order (seed 0), so that the first N, which
    the benches translate, are a sample of the whole split: a built corpus keeps its pairs in document order,
    its sources in blocks (debian-de-en's dev split opens with hundreds of Ding's everyday sentences, where a
    model of software text scores a third of its dev BLEU)."""
    pairs = list(splits["dev"].read().pairs)
    random.Random(0).shuffle(pairs)
    return pairs


def model_under_test(args, train_pairs):
    """(:class:`~tf_transformer.infer.load.LoadedModel`, description): a trained model directory's
    kept weights (its current average, as translate.py and the export take them), or a random model."""
    if args.model_dir:
        model_dir = current_average(args.model_dir) or args.model_dir
        return load_for_inference(model_dir), f"trained model {model_dir}"
    hp = load_hparams("small", overrides=[f"max_decode_length={args.tokens}"])
    tokenizers = train_tokenizers(hp, train_pairs)
    return (LoadedModel(hp, *tokenizers, forced_length_model(hp, tokenizers)),
            f"small config, random weights, </S> masked: {args.tokens} new tokens per sentence")


def generated_tokens(model, x, beam_size, hp):
    """Tokens the decoder outputs for the batch (``</S>`` included, ``<PAD>`` not)."""
    ids, _ = generate(model, x, beam_size=beam_size, length_penalty=hp.length_penalty,
                               max_length=hp.max_decode_length)
    ids = ids.numpy()[:, 0]
    return int(np.sum((ids != PAD_ID) & (np.cumsum(ids == EOS_ID, axis=1) - (ids == EOS_ID) == 0)))


def latency(signature, sentences, beam_size, runs, warmup=3):
    """Milliseconds of ``runs`` one-sentence calls of the export's ``translate`` signature:
    :func:`latencies`' (wall p50, wall p99, CPU p50)."""
    beam = tf.constant(beam_size, tf.int32)

    def call(sentence):
        return signature(inputs=tf.constant([sentence]), beam_size=beam)["translations"].numpy()

    return latencies({"signature": call}, sentences, runs, warmup)["signature"]


def latencies(calls, sentences, runs, warmup=3, block=1):
    """Milliseconds of ``runs`` one-sentence calls of each ``calls[name](sentence)``, each call
    with the next of ``sentences``, after ``warmup`` untimed calls each; the calls take turns,
    ``block`` sentences each, so that other work on the machine slows them alike.

    With ``block`` 1 every call follows another contender's, whose weights have pushed its own out
    of the CPU's caches; a model server answers request after request with one model, which
    ``block`` > 1 (10 in bench/ct2.py) is closer to.

    The CPU time of this process (all its threads) is what other work on the
    machine inflates least: with one thread per pool it is close to the wall
    time of an idle machine.

    Returns:
      {name: (wall p50, wall p99, CPU p50)}.
    """
    for call in calls.values():
        for sentence in sentences[:warmup]:
            call(sentence)
    wall, cpu = {name: [] for name in calls}, {name: [] for name in calls}
    for first in range(0, runs, block):
        for name, call in calls.items():
            for i in range(first, min(first + block, runs)):
                sentence = sentences[i % len(sentences)]
                started, started_cpu = time.perf_counter(), time.process_time()
                call(sentence)
                wall[name].append((time.perf_counter() - started) * 1000.0)
                cpu[name].append((time.process_time() - started_cpu) * 1000.0)
    return {name: (float(np.percentile(wall[name], 50)), float(np.percentile(wall[name], 99)),
                   float(np.percentile(cpu[name], 50))) for name in calls}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model-dir", help="a trained model directory (default: the small config, random weights)")
    parser.add_argument("--data", help="corpus directory whose dev sentences are translated: the model's own, needed "
                                       f"with --model-dir (default: the embedded {corpus.DEFAULT_CORPUS})")
    parser.add_argument("--sentences", type=int, default=64, help="dev sentences in the throughput batch")
    parser.add_argument("--tokens", type=int, default=24, help="new tokens per sentence of the random model")
    parser.add_argument("--beam-size", type=int, default=4)
    parser.add_argument("--latency-runs", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--intra-op-threads", type=int, default=0, help="0: TensorFlow's default")
    parser.add_argument("--inter-op-threads", type=int, default=0, help="0: TensorFlow's default")
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args(argv)
    splits = dev_splits(parser, dev_corpus(parser, args.data, args.model_dir and "--model-dir"))
    tf.config.threading.set_intra_op_parallelism_threads(args.intra_op_threads)
    tf.config.threading.set_inter_op_parallelism_threads(args.inter_op_threads)

    loaded, description = model_under_test(args, splits["train"].read().pairs if not args.model_dir else None)
    hp, source_tokenizer, target_tokenizer, model = loaded
    sentences = [source for source, _ in dev_pairs(splits)[: args.sentences]]
    x = source_batch(source_tokenizer, tf.constant(sentences), hp.maxlen).ids

    with tempfile.TemporaryDirectory() as export_dir:
        started = time.perf_counter()
        path = export.export_saved_model(loaded, export_dir)
        export_seconds = time.perf_counter() - started
        started = time.perf_counter()
        signature = tf.saved_model.load(path).signatures["translate"]
        load_seconds = time.perf_counter() - started

        rows, same = [], {}
        for beam_size in (1, args.beam_size):
            p50, p99, cpu50 = latency(signature, sentences, beam_size, args.latency_runs)
            beam = tf.constant(beam_size, tf.int32)
            methods = {
                "SavedModel": lambda beam=beam: [t.decode() for t in signature(
                    inputs=tf.constant(sentences), beam_size=beam)["translations"].numpy()],
                "Python model": lambda beam_size=beam_size: [h[0][0] for h in translate_nbest(
                    sentences, source_tokenizer, target_tokenizer, model, batch_size=len(sentences),
                    max_length=hp.max_decode_length, beam_size=beam_size, length_penalty=hp.length_penalty)],
            }
            seconds, results = best_times(methods, args.repeats)
            same[beam_size] = results["SavedModel"] == results["Python model"]
            tokens = generated_tokens(model, x, beam_size, hp)
            decoder = "greedy" if beam_size == 1 else f"beam {beam_size}"
            for name, (wall, _) in seconds.items():
                rows.append({"path": name, "decoder": decoder, "sentences_per_s": round(len(sentences) / wall, 1),
                             "tokens_per_s": round(tokens / wall), "seconds": round(wall, 4),
                             **({"p50_ms": round(p50, 1), "p99_ms": round(p99, 1), "cpu_p50_ms": round(cpu50, 1)}
                                if name == "SavedModel" else {})})

    print(f"{description}; vocabulary {target_tokenizer.vocab_size}, {hp.num_blocks}+{hp.num_blocks} blocks x "
          f"{hp.num_units} units, {hp.num_heads} heads; export {export_seconds:.1f}s, load {load_seconds:.1f}s; "
          f"threads: intra-op {args.intra_op_threads or 'default'}, inter-op {args.inter_op_threads or 'default'}; "
          f"load average before: {os.getloadavg()[0]:.1f}")
    print(f"one sentence: {args.latency_runs} calls of the SavedModel signature; batch: {len(sentences)} dev "
          f"sentences, best of {args.repeats}")
    print(f"{'path':<13} {'decoder':<8} {'p50 ms':>7} {'p99 ms':>7} {'CPU p50 ms':>10} {'sentences/s':>12} "
          f"{'tokens/s':>9}")
    for row in rows:
        p50, p99, cpu50 = (f"{row[key]:.1f}" if key in row else "-" for key in ("p50_ms", "p99_ms", "cpu_p50_ms"))
        print(f"{row['path']:<13} {row['decoder']:<8} {p50:>7} {p99:>7} {cpu50:>10} {row['sentences_per_s']:>12.1f} "
              f"{row['tokens_per_s']:>9}")
    print("same translations from both paths: " + ", ".join(
        f"{'greedy' if b == 1 else f'beam {b}'} {'yes' if s else 'NO'}" for b, s in same.items()))
    print("command: python bench/serving.py " + " ".join(sys.argv[1:] if argv is None else argv))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"description": description, "intra_op_threads": args.intra_op_threads,
                       "inter_op_threads": args.inter_op_threads, "rows": rows, "same_translations": same}, f, indent=2)


if __name__ == "__main__":
    main()
