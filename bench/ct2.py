"""Our SavedModel against CTranslate2 on the same weights and sentences: conversion check, throughput, latency.

CTranslate2 (a C++ inference engine, ``pip install -r bench/requirements.txt``)
runs our model converted by :mod:`tf_transformer.infer.ct2`. Both take the same
text and give text: ours through the export's ``translate`` signature
(tokenizer, cached decoder, detokenizer in one graph; :mod:`tf_transformer.infer.export`),
CTranslate2 through our SentencePiece model in Python (the same pieces, cut to
``maxlen - 1`` and ``</S>`` appended, as our input rules), ``translate_batch``
on those pieces, and the SentencePiece decoder.

1. **Conversion check** (default pools): greedy output ids of our Python model
   (:func:`~tf_transformer.infer.decode.generate`) and of CTranslate2 float32 on the
   first ``--check-sentences`` dev sentences, batches of ``--batch-size``: the
   share equal (goal: at least 95%); the same for beam 4 and for int8, shown.
2. **Batch throughput**: ``--sentences`` dev sentences in batches of
   ``--batch-size``, sentences/s, best of ``--repeats`` after a warm-up.
3. **One sentence at a time**: ``--latency-runs`` calls, each the next dev
   sentence: p50 and p99 milliseconds (:func:`bench.serving.latencies`); the contenders
   take turns ``--latency-block`` sentences each (10: as a server answers request after
   request with one model, its weights still in the CPU's caches; 1: every call after
   another contender's).

4. **One sentence, split** (``--split-sentences``, first dev sentences, one at a time): where a call's
   time goes, on the models alone (source ids in, output ids out: no tokenizer, no SavedModel; the inputs
   made beforehand). Ours is ``translate_xla``'s one-sentence program
   (:func:`~tf_transformer.infer.decode.compiled_decoder` of one bucket), CTranslate2 float32 its
   ``translate_batch``. Each sentence runs at most one step (the
   *fixed part*: the encoder, the loop's set-up and one step) and to its end; the *per step* cost is the
   summed difference over the summed further steps (:func:`one_sentence_split`).

Our contenders: ``translate`` (the growing loop without XLA, what ``serving_default`` runs),
``translate_xla`` with its row buckets (``export.XLA_BUCKETS``: the batch moves down to
smaller buckets as sentences finish; beam search compiled for one sentence only, greedy decoding
for up to ``export.XLA_GREEDY_BATCH``) and as before (``1-bucket``: one bucket, every row to the end,
compiled for any batch), and the ``--precision bfloat16`` export's ``translate`` and
``translate_xla`` (``--no-bfloat16``: without them). ``ours translate_xla Session`` is the float32
export's ``translate_xla`` run as TF Serving runs a SavedModel: loaded into a TensorFlow ``Session`` of
the setting's threads, its tensors fed and fetched by one callable (:func:`session_contender`); the
others are called as ``tf.saved_model.load`` gives them, through a Python function per signature.
With ``--model-dir`` each contender's batch translations are scored too (BLEU against the dev
references, sacrebleu). "Dev sentences" are ``--data``'s dev split in one fixed shuffled order
(:func:`bench.serving.dev_pairs`): the first N are a sample of the whole split, as the dev BLEU of
training scores it.
At the end: a Markdown table per CPU kind, with the date, the CPU flags and the command.

Greedy and beam ``--beam-size``; CTranslate2 float32 and int8 (weights
quantized when loaded); the contenders take turns. Each thread setting runs in
its own process: ``1`` is one thread per TensorFlow pool (intra- and inter-op,
as TF Serving's ``--tensorflow_intra_op_parallelism=1``) against CTranslate2's
``intra_threads=1``; ``0`` is TensorFlow's default pools (one thread per core
each) against ``intra_threads`` = the cores. CTranslate2 runs one batch at a
time (``inter_threads=1``).

Decoding options: ``beam_size``; CTranslate2's length limit
(``max_decoding_length``, ``</S>`` counted, as ours) is ours: ``max_decode_length``
of the hparams, or when 0 the longest source of the batch + 50 (ours: each
sentence's own + 50, so a batch may let CTranslate2 run longer on a sentence
that never ends). Beam search: both keep ``2k`` candidates a step and stop a
sentence by the same rule, once ``ceil(patience x k)`` hypotheses have ended
(``--patience``, default 1, CTranslate2's default; ours is the export's
``beam_patience``; with 0 ours runs its exact rule, CTranslate2 its default);
but their length penalties differ: ours is GNMT's ``log p / ((5 + length) / 6) ** alpha``
(length with ``</S>``), CTranslate2's is ``log p / length ** alpha`` (length
without ``</S>``); both with ``alpha`` = the hparams' ``length_penalty``. So
beam outputs may differ where greedy ones do not.

Without ``--model-dir`` the model is bench/serving.py's: the small
configuration, random weights, ``</S>`` masked so every sentence decodes
``--tokens`` tokens, on the embedded corpus. With ``--model-dir`` (a trained
model, or its ``average/``) it is that model on ``--data``'s dev split.

    python bench/ct2.py --model-dir runs/small/average --data data/de-en
    python bench/ct2.py --threads 1 --latency-runs 50 --json ct2.json
"""

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Callable, NamedTuple, Optional

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tf_transformer.quiet import quiet_tensorflow  # noqa: E402

quiet_tensorflow()  # TensorFlow's start-up notices off stderr, as the commands do (TF_CPP_MIN_LOG_LEVEL set: shown)

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from bench.decode import best_times  # noqa: E402
from bench.serving import dev_corpus, dev_pairs, dev_splits, latencies, model_under_test  # noqa: E402
from tf_transformer.cpu import cpu_model, cpu_speed_flags  # noqa: E402
from tf_transformer.data import corpus  # noqa: E402
from tf_transformer.data.vocab import EOS_ID  # noqa: E402
from tf_transformer.infer import decode, export  # noqa: E402
from tf_transformer.infer.ct2 import Ct2Model, convert, ctranslate2_missing, length_limit  # noqa: E402
from tf_transformer.infer.translate import source_ids  # noqa: E402

# Our export's signatures timed as contenders, when the export has them (text in, text out, beam_size).
OUR_SIGNATURES = ("translate", "translate_xla")
# The exports timed: (name prefix, export_saved_model's options, signatures).
OUR_EXPORTS = (("ours", {"precision": "float32"}, OUR_SIGNATURES),
               # translate_xla as it was before buckets: one bucket, beam search compiled for any batch
               ("ours 1-bucket", {"precision": "float32", "xla_buckets": 1, "xla_beam_batch": 1 << 30,
                                  "xla_greedy_batch": 1 << 30},
                ("translate_xla",)),
               ("ours bf16", {"precision": "bfloat16"}, OUR_SIGNATURES))
# Signatures of an export (by its prefix) also run as TF Serving runs them (:func:`session_contender`).
SESSION_SIGNATURES = {"ours": ("translate_xla",)}
CT2_COMPUTE_TYPES = ("float32", "int8")
# CTranslate2's own default patience: its side of the bench when ours runs the exact rule (--patience 0).
CT2_DEFAULT_PATIENCE = 1.0
CHECK_GOAL = 0.95


class Contender(NamedTuple):
    """A way to translate: ``translate(sentences, beam_size) -> translations``, lists of str."""

    name: str
    translate: Callable


def ct2_missing():
    """None when ctranslate2 imports, else why not."""
    return ctranslate2_missing()


def ct2_contender(name, translator, tokenizer, hp):
    """A :class:`Contender` of a ``ctranslate2.Translator``, text in and out through ``tokenizer``'s
    SentencePiece model (our input rules: ``maxlen - 1`` pieces, then ``</S>``)."""
    processor, eos = tokenizer.processor, tokenizer.id_to_token(EOS_ID)

    def translate(sentences, beam_size):
        pieces = [row[: hp.maxlen - 1] + [eos] for row in processor.encode(sentences, out_type=str)]
        results = ct2_batch(translator, pieces, beam_size, hp)
        return [processor.decode_pieces(result.hypotheses[0]) for result in results]

    return Contender(name, translate)


def ct2_batch(translator, pieces, beam_size, hp, max_length=None, num_hypotheses=1):
    """CTranslate2's results for lists of source pieces (``</S>`` included) with the bench's decoding options:
    our length penalty, :func:`~tf_transformer.infer.ct2.length_limit` (``max_length`` or the hparams' rule) and
    patience (CTranslate2's default where ours runs its exact rule); ``num_hypotheses`` of each sentence."""
    return translator.translate_batch(pieces, beam_size=beam_size, length_penalty=hp.length_penalty,
                                      max_decoding_length=length_limit(hp, [len(p) for p in pieces], max_length),
                                      patience=hp.beam_patience or CT2_DEFAULT_PATIENCE,
                                      num_hypotheses=num_hypotheses)


def signature_contender(name, signature):
    """A :class:`Contender` of one of our export's text-in, text-out signatures."""
    def translate(sentences, beam_size):
        outputs = signature(inputs=tf.constant(sentences, tf.string), beam_size=tf.constant(beam_size, tf.int32))
        return [t.decode() for t in outputs["translations"].numpy()]

    return Contender(name, translate)


def session_contender(name, export_path, signature_name, threads):
    """A :class:`Contender` of one of our export's text-in, text-out signatures run as TF Serving runs it
    (and :mod:`bench.c_loader`'s C program): the SavedModel loaded into a ``Session`` of ``threads`` per
    pool (0: TensorFlow's default), the signature's tensors fed and fetched by one callable, without the
    Python function that ``tf.saved_model.load`` wraps around each signature."""
    config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=threads, inter_op_parallelism_threads=threads)
    session = tf.compat.v1.Session(graph=tf.Graph(), config=config)
    meta_graph = tf.compat.v1.saved_model.load(session, [tf.saved_model.SERVING], export_path)
    signature = meta_graph.signature_def[signature_name]
    run = session.make_callable(signature.outputs["translations"].name,
                                feed_list=[signature.inputs["inputs"].name, signature.inputs["beam_size"].name])

    def translate(sentences, beam_size):
        return [t.decode() for t in run(np.array(sentences, object), beam_size)]

    return Contender(name, translate)


def ct2_ids(translator, tokenizer, sources, beam_size, hp):
    """Output ids (``</S>`` and after cut) of CTranslate2 for source id lists (``</S>`` included)."""
    model = Ct2Model(hp, tokenizer, tokenizer, translator)
    return [hypotheses[0][0] for hypotheses in model.output_ids(
        sources, beam_size=beam_size, patience=hp.beam_patience or CT2_DEFAULT_PATIENCE,
        length_penalty=hp.length_penalty)]


def our_ids(model, sources, beam_size, hp):
    """Output ids (``</S>`` and after cut) of our Python model for source id lists."""
    x = tf.ragged.constant(sources, tf.int32).to_tensor()
    ids, _ = decode.generate(model, x, beam_size=beam_size, length_penalty=hp.length_penalty,
                             max_length=hp.max_decode_length, patience=hp.beam_patience)
    return [list(row[: list(row).index(EOS_ID)] if EOS_ID in row else row) for row in ids.numpy()[:, 0].tolist()]


def conversion_check(loaded, translators, sentences, batch_size, beam_size):
    """{"sentences", "<compute type> <decoder>": share of sentences with the same output ids as ours}."""
    hp, source_tokenizer, target_tokenizer, model = loaded
    sources = source_ids(source_tokenizer, tf.constant(sentences), hp.maxlen).to_list()
    shares = {"sentences": len(sources)}
    for beams, decoder in ((1, "greedy"), (beam_size, f"beam {beam_size}")):
        ours, theirs = [], {compute_type: [] for compute_type in translators}
        for start in range(0, len(sources), batch_size):
            batch = sources[start:start + batch_size]
            ours += our_ids(model, batch, beams, hp)
            for compute_type, translator in translators.items():
                theirs[compute_type] += ct2_ids(translator, target_tokenizer, batch, beams, hp)
        for compute_type, ids in theirs.items():
            shares[f"{compute_type} {decoder}"] = round(float(np.mean([a == b for a, b in zip(ours, ids)])), 4)
    return shares


class Split(NamedTuple):
    """A one-sentence call of one decoder split (:func:`one_sentence_split`): milliseconds."""

    fixed_ms: float  # a call of at most one step: encoder, set-up, one step (mean of each sentence's best)
    step_ms: Optional[float]  # each further step: summed (whole - fixed) over summed (steps - 1); None: no such step
    steps: float  # steps of a whole call (</S> included; CTranslate2 beam search: to its last hypothesis), mean


def one_sentence_split(loaded, translator, sentences, beam_size, repeats):
    """{contender: :class:`Split`} of ``sentences`` translated one at a time by ours (``translate_xla``'s
    one-sentence program: :func:`~tf_transformer.infer.decode.compiled_decoder` of one bucket) and by
    CTranslate2 (``translator``, as :func:`ct2_contender` calls it), at most one step and to the end, each
    best of ``repeats`` after a warm-up (XLA compiles each source width once), the two taking turns. Only the
    calls are timed: their inputs are made beforehand, as the bench's contenders make them (eager ops
    around ours would cost more than its set-up)."""
    hp, source_tokenizer, _, model = loaded
    sources = [row for row in source_ids(source_tokenizer, tf.constant(sentences), hp.maxlen).to_list()
               if len(row) > 1]
    limits = (1, hp.max_decode_length or 0)  # at most one step; the whole call (0: each source + 50)
    penalty, patience = tf.constant(hp.length_penalty, tf.float32), tf.constant(hp.beam_patience, tf.float32)
    decoders = {limit: decode.compiled_decoder(model, beam_size, max_length=limit) for limit in limits}
    xs = [decode.compiled_width(model, tf.constant([source], tf.int32)) for source in sources]
    ours = [{limit: (x, decode.length_limits(x, limit), penalty, patience) for limit in limits} for x in xs]
    pieces = [[source_tokenizer.id_to_token(i) for i in source] for source in sources]
    caps = [{limit: length_limit(hp, [len(source)], limit) for limit in limits} for source in sources]

    def our_steps(i, limit):
        return int(decoders[limit](*ours[i][limit]).steps)

    def their_count(i, limit):
        """The steps CTranslate2's search takes: until its last hypothesis ended (beam search stops once
        ``ceil(patience x k)`` have, each returned; should more end at that step, it returns the k best, so
        at least), ``</S>`` counted, or the limit."""
        [result] = ct2_batch(translator, [pieces[i]], beam_size, hp, limit, num_hypotheses=beam_size)
        return min(max(len(hypothesis) for hypothesis in result.hypotheses) + 1, caps[i][limit])

    counts = [{limit: their_count(i, limit) for limit in limits} for i in range(len(sources))]

    def their_steps(i, limit):
        ct2_batch(translator, [pieces[i]], beam_size, hp, limit)
        return counts[i][limit]

    calls = {f"ours {export.XLA_SIGNATURE} loop": our_steps, "CTranslate2 float32": their_steps}
    seconds = {name: np.full([len(sources), len(limits)], np.inf) for name in calls}  # best of the turns
    steps = {name: np.zeros([len(sources), len(limits)], np.int64) for name in calls}
    for turn in range(repeats + 1):  # the first: a warm-up
        for name, call in calls.items():
            for i, j in np.ndindex(len(sources), len(limits)):
                start = time.perf_counter()
                steps[name][i, j] = call(i, limits[j])
                if turn:
                    seconds[name][i, j] = min(seconds[name][i, j], time.perf_counter() - start)
    splits = {}
    for name in calls:
        (fixed, whole), further = seconds[name].T, int((steps[name][:, 1] - 1).sum())
        splits[name] = Split(round(1e3 * float(fixed.mean()), 3),
                             round(1e3 * float((whole - fixed).sum()) / further, 4) if further else None,
                             round(float(steps[name][:, 1].mean()), 1))
    return splits


def measure(args):
    """One thread setting (``args.threads``, an int), in this process: the JSON dict of its figures."""
    import ctranslate2

    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    ct2_threads = args.threads or os.cpu_count()
    splits = corpus.corpus_splits(args.data)
    loaded, description = model_under_test(args, splits["train"].read().pairs if not args.model_dir else None)
    loaded = loaded._replace(hp=loaded.hp.replace(beam_patience=args.patience))  # the exports' too
    hp = loaded.hp
    if loaded.source_tokenizer.kind != "sentencepiece":
        raise SystemExit(f"{description}: bench/ct2.py needs a sentencepiece model (tokenizer: sentencepiece)")
    pairs = dev_pairs(splits)
    dev = [source for source, _ in pairs]
    sentences = dev[: args.sentences]
    with tempfile.TemporaryDirectory() as scratch:
        converted = convert(loaded.model, *loaded.tokenizers, os.path.join(scratch, "ct2"))
        translators = {compute_type: ctranslate2.Translator(converted, device="cpu", compute_type=compute_type,
                                                            inter_threads=1, intra_threads=ct2_threads)
                       for compute_type in CT2_COMPUTE_TYPES}
        check = (conversion_check(loaded, translators, dev[: args.check_sentences], args.batch_size, args.beam_size)
                 if args.check_sentences else None)
        contenders = []
        for prefix, options, names in OUR_EXPORTS:
            if args.no_bfloat16 and options["precision"] == "bfloat16":
                continue
            path = export.export_saved_model(loaded, os.path.join(scratch, "export-" + prefix.replace(" ", "-")),
                                             log=print, xla=True, **options)
            exported = tf.saved_model.load(path)
            contenders += [signature_contender(f"{prefix} {name}", exported.signatures[name])
                           for name in names if name in exported.signatures]
            contenders += [session_contender(f"{prefix} {name} Session", path, name, args.threads)
                           for name in SESSION_SIGNATURES.get(prefix, ()) if name in exported.signatures]
        contenders += [ct2_contender(f"CTranslate2 {t}", translator, loaded.target_tokenizer, hp)
                       for t, translator in translators.items()]
        references = [target for _, target in pairs][: args.sentences]
        rows, same, split_rows = [], {}, []
        batches = [sentences[i:i + args.batch_size] for i in range(0, len(sentences), args.batch_size)]
        for beams, decoder in ((1, "greedy"), (args.beam_size, f"beam {args.beam_size}")):
            methods = {c.name: lambda c=c, beams=beams: [t for b in batches for t in c.translate(b, beams)]
                       for c in contenders}
            seconds, results = best_times(methods, args.repeats)
            same[decoder] = {name: round(float(np.mean([a == b for a, b in zip(results[contenders[0].name], out)])), 4)
                             for name, out in results.items()}
            one = latencies({c.name: lambda s, c=c, beams=beams: c.translate([s], beams) for c in contenders},
                            dev, args.latency_runs, warmup=args.latency_runs,  # XLA: every shape compiled
                            block=args.latency_block)
            for c in contenders:
                (wall, cpu), (p50, p99, cpu50) = seconds[c.name], one[c.name]
                bleu = corpus_bleu(results[c.name], references) if args.model_dir else None
                rows.append({"contender": c.name, "decoder": decoder,
                             "batch_sentences_per_s": round(len(sentences) / wall, 1),
                             "batch_sentences_per_cpu_s": round(len(sentences) / cpu, 1),
                             "p50_ms": round(p50, 2), "p99_ms": round(p99, 2), "cpu_p50_ms": round(cpu50, 2),
                             "bleu": bleu})
            if args.split_sentences:
                for name, split in one_sentence_split(loaded, translators["float32"], dev[: args.split_sentences],
                                                      beams, args.repeats).items():
                    split_rows.append({"contender": name, "decoder": decoder, **split._asdict()})
    return {"threads": args.threads, "ct2_intra_threads": ct2_threads, "description": description,
            "model": {"blocks": hp.num_blocks, "units": hp.num_units, "heads": hp.num_heads, "d_ff": hp.d_ff,
                      "vocab": loaded.target_tokenizer.vocab_size},
            "load_average_before": os.getloadavg()[0], "check": check, "rows": rows, "same_as_first": same,
            "one_sentence_split": split_rows}


def corpus_bleu(translations, references):
    """sacrebleu's corpus BLEU (0-100, rounded to 0.1) of translations against one reference each."""
    from sacrebleu.metrics import BLEU

    return round(BLEU().corpus_score(translations, [references]).score, 1)


def markdown_table(results, args, argv):
    """The figures of every setting as one Markdown table, headed by the CPU, its flags and the date."""
    lines = [f"**{cpu_model()}** ({cpu_speed_flags()}), {os.cpu_count()} cores; "
             f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; load average before: " +
             ", ".join(f"{s['load_average_before']:.1f}" for s in results),
             "", f"`python bench/ct2.py {' '.join(argv)}`; batch: {args.sentences} dev sentences in batches of "
                 f"{args.batch_size}; one sentence: p50 of {args.latency_runs} calls, in turns of "
                 f"{args.latency_block}; beam patience {args.patience:g} (both; 0: ours exact). x: ours / "
                 f"CTranslate2 float32 (speed; above 1 ours faster)", "",
             "| threads | decoder | contender | batch sent/s | x | p50 ms | x | BLEU |",
             "|---|---|---|--:|--:|--:|--:|--:|"]
    for setting in results:
        threads = _threads(setting)
        by = {(r["contender"], r["decoder"]): r for r in setting["rows"]}
        for r in setting["rows"]:
            peer = by[("CTranslate2 float32", r["decoder"])]
            speed = r["batch_sentences_per_s"] / peer["batch_sentences_per_s"]
            latency = peer["p50_ms"] / r["p50_ms"]
            bleu = "" if r.get("bleu") is None else f"{r['bleu']:.1f}"
            lines.append(f"| {threads} | {r['decoder']} | {r['contender']} | {r['batch_sentences_per_s']:.1f} | "
                         f"{speed:.2f} | {r['p50_ms']:.1f} | {latency:.2f} | {bleu} |")
    split_rows = [(setting, r) for setting in results for r in setting.get("one_sentence_split", [])]
    if split_rows:
        lines += ["", f"One sentence, split ({args.split_sentences} dev sentences one at a time, the models alone: ids "
                      "in, ids out): the fixed part is a call of at most one step (encoder, set-up, one step), "
                      "per step the further steps' cost; x: CTranslate2 float32's ms over ours", "",
                  "| threads | decoder | contender | fixed ms | x | per step ms | x | steps |",
                  "|---|---|---|--:|--:|--:|--:|--:|"]
        for setting, r in split_rows:
            peer = next(p for p in setting["one_sentence_split"]
                        if p["decoder"] == r["decoder"] and p["contender"] == "CTranslate2 float32")
            step, step_x = ("-", "-") if not (r["step_ms"] and peer["step_ms"]) else (
                f"{r['step_ms']:.3f}", f"{peer['step_ms'] / r['step_ms']:.2f}")
            lines.append(f"| {_threads(setting)} | {r['decoder']} | {r['contender']} | {r['fixed_ms']:.2f} | "
                         f"{peer['fixed_ms'] / r['fixed_ms']:.2f} | {step} | {step_x} | {r['steps']:.1f} |")
    return "\n".join(lines)


def _threads(setting):
    """A setting's thread column: "1 per pool", "default pools" or the count."""
    return ("1 per pool" if setting["threads"] == 1 else "default pools" if not setting["threads"] else
            str(setting["threads"]))


def ratios(setting):
    """{"<decoder> <figure> ours / CTranslate2 <type>": ours' speed over CTranslate2's} of one setting:
    batch sentences/s, and one-sentence p50 as CTranslate2's ms over ours (above 1: ours faster)."""
    by = {(r["contender"], r["decoder"]): r for r in setting["rows"]}
    out = {}
    for (name, decoder), ours in by.items():
        if not name.startswith("ours"):
            continue
        for compute_type in CT2_COMPUTE_TYPES:
            peer = by[f"CTranslate2 {compute_type}", decoder]
            label = f"{decoder}, {name} / CTranslate2 {compute_type}"
            out[f"{label}, batch sentences/s"] = round(ours["batch_sentences_per_s"] / peer["batch_sentences_per_s"], 2)
            out[f"{label}, one sentence p50"] = round(peer["p50_ms"] / ours["p50_ms"], 2)
    return out


def print_setting(setting, args):
    threads = ("one thread per pool" if setting["threads"] == 1 else
               f"{setting['threads']} threads per pool" if setting["threads"] else "TensorFlow's default pools")
    print(f"\n{setting['description']}; {threads}, CTranslate2 intra_threads={setting['ct2_intra_threads']}; "
          f"load average before: {setting['load_average_before']:.1f}")
    if setting["check"]:
        check = setting["check"]
        print(f"conversion check, {check['sentences']} dev sentences, share with the same output ids as ours: " +
              ", ".join(f"{k} {v:.1%}" for k, v in check.items() if k != "sentences") +
              f" (goal: float32 greedy >= {CHECK_GOAL:.0%})")
    print(f"batch: {args.sentences} dev sentences in batches of {args.batch_size}, best of {args.repeats}; "
          f"one sentence: {args.latency_runs} calls; beam patience {args.patience:g}")
    print(f"{'contender':<34} {'decoder':<8} {'batch sent/s':>12} {'sent/CPU s':>10} {'p50 ms':>7} {'p99 ms':>7} "
          f"{'CPU p50':>7}")
    for r in setting["rows"]:
        print(f"{r['contender']:<34} {r['decoder']:<8} {r['batch_sentences_per_s']:>12.1f} "
              f"{r['batch_sentences_per_cpu_s']:>10.1f} {r['p50_ms']:>7.1f} {r['p99_ms']:>7.1f} "
              f"{r['cpu_p50_ms']:>7.1f}")
    print("same translations as the first contender (batch): " + "; ".join(
        f"{decoder}: " + ", ".join(f"{name} {share:.0%}" for name, share in shares.items())
        for decoder, shares in setting["same_as_first"].items()))
    if setting.get("one_sentence_split"):
        print(f"one sentence, split ({args.split_sentences} dev sentences, models alone): "
              f"{'contender':<28} {'decoder':<8} {'fixed ms':>8} {'step ms':>8} {'steps':>6}")
        for r in setting["one_sentence_split"]:
            step = "-" if r["step_ms"] is None else f"{r['step_ms']:.3f}"
            print(f"{'':<66}{r['contender']:<28} {r['decoder']:<8} {r['fixed_ms']:>8.2f} {step:>8} {r['steps']:>6.1f}")
    print("ours / CTranslate2 (speed; above 1: ours faster):")
    for name, value in setting["ratios"].items():
        print(f"  {name}: {value:.2f}x")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model-dir", help="a trained model directory (default: bench/serving.py's random model)")
    parser.add_argument("--data", help="corpus directory whose dev split is translated and scored: the model's own, "
                                       f"needed with --model-dir (default: the embedded {corpus.DEFAULT_CORPUS})")
    parser.add_argument("--threads", default="1,0",
                        help="comma-separated thread settings, each in its own process: 1 = one thread per pool, "
                             "0 = TensorFlow's default pools (default: %(default)s)")
    parser.add_argument("--check-sentences", type=int, default=500,
                        help="dev sentences of the conversion check, run with the last setting (0: none)")
    parser.add_argument("--sentences", type=int, default=256, help="dev sentences of the batch throughput")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=24, help="new tokens per sentence of the random model")
    parser.add_argument("--beam-size", type=int, default=4)
    parser.add_argument("--patience", type=float, default=CT2_DEFAULT_PATIENCE,
                        help="beam search's stopping rule on both sides: CTranslate2's patience and our export's "
                             "beam_patience (default: 1, CTranslate2's default); 0: ours the exact rule, "
                             "CTranslate2 its default")
    parser.add_argument("--latency-runs", type=int, default=200)
    parser.add_argument("--latency-block", type=int, default=10,
                        help="one-sentence calls in a row per contender, in turns (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--split-sentences", type=int, default=20,
                        help="first dev sentences of the one-sentence split, fixed part and per step (0: none)")
    parser.add_argument("--json", help="also write the figures here")
    parser.add_argument("--no-bfloat16", action="store_true", help="without the bfloat16 export's contenders")
    parser.add_argument("--quiet", action="store_true", help=argparse.SUPPRESS)  # a setting's own process
    args = parser.parse_args(argv)
    args.data = dev_corpus(parser, args.data, args.model_dir and "--model-dir")
    dev_splits(parser, args.data)  # no corpus, or no dev split: one line here, not in each setting's process
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        settings = [int(t) for t in args.threads.split(",")]
    except ValueError:
        parser.error(f"--threads {args.threads}: expected comma-separated integers, e.g. 1,0")
    if any(t < 0 for t in settings) or not settings:
        parser.error(f"--threads {args.threads}: thread counts are 0 (default pools) or more")
    if args.latency_block < 1:
        parser.error(f"--latency-block {args.latency_block}: must be at least 1")
    missing = ct2_missing()
    if missing:
        line = f"CTranslate2 skipped: ctranslate2 does not import ({missing}); pip install -r bench/requirements.txt"
        print(line)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"skipped": [line], "settings": []}, f, indent=2)
        return

    if len(settings) == 1:
        args.threads = settings[0]
        results = [measure(args)]
    else:  # each setting in its own process: TensorFlow's pools are fixed once it runs an op
        results = []
        with tempfile.TemporaryDirectory() as scratch:
            for i, threads in enumerate(settings):
                path = os.path.join(scratch, f"{threads}.json")
                check = args.check_sentences if i == len(settings) - 1 else 0
                # The setting's own flags come last: argparse keeps the last of a repeated flag.
                code = subprocess.run([sys.executable, os.path.abspath(__file__), *argv, "--threads", str(threads),
                                       "--check-sentences", str(check), "--json", path, "--quiet"]).returncode
                if code:
                    raise SystemExit(f"bench/ct2.py: the --threads {threads} process failed (exit status {code})")
                with open(path) as f:
                    results += json.load(f)["settings"]
    for setting in results:
        setting["ratios"] = ratios(setting)
    if not args.quiet:
        print(f"CPU: {cpu_model()} ({cpu_speed_flags()}), {os.cpu_count()} cores")
        for setting in results:
            print_setting(setting, args)
        print("command: python bench/ct2.py " + " ".join(argv))
        print("\n" + markdown_table(results, args, argv))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"settings": results, "skipped": []}, f, indent=2)


if __name__ == "__main__":
    main()
