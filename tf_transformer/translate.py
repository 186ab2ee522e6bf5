"""Translation: ``python translate.py --model-dir DIR [SENTENCE ...]``.

Translates the sentences given as arguments, the lines of ``--input FILE``, or
one sentence per line from standard input, in batches of sentences of similar
length, and prints one translation per line in input order (``--output FILE``
writes them there instead). Greedy or beam search (``--beam-size``, default
the model's ``beam_size``; ``--length-penalty``; ``--nbest K`` prints the K
best as ``INDEX<TAB>SCORE<TAB>TRANSLATION``).

``--trace`` prints the decoder's output after every greedy step to standard
error, as in the seeds' log; ``--plot-attention FILE.png`` draws the
encoder-decoder attention of every head of every decoder block for the first
sentence.
``--server HOST:PORT`` (gRPC) or ``--rest URL`` send the sentences to a running
TF Serving that serves an export (:mod:`tf_transformer.export`) instead of
loading the model here.

Input rules, the same here and in the export:

* a source is cut to its first ``maxlen - 1`` tokens, then ``</S>``: at most
  ``maxlen`` tokens, as in training;
* a source without any token (empty, or only whitespace) translates to the
  empty string, score 0, without running the model;
* invalid UTF-8 bytes become U+FFFD (files and standard input are refused
  instead, with the line at fault).
"""

import argparse
import math
import os
import sys

import numpy as np
import tensorflow as tf

from tf_transformer import decoding, plotting, serving
from tf_transformer.average import current_average
from tf_transformer.errors import UserError, report_user_errors
from tf_transformer.files import decode_lines, read_text_lines, split_lines, write_atomic
from tf_transformer.model_dir import load_for_inference
from tf_transformer.vocab import BOS_ID, EOS_ID


def source_ids(tokenizer, sentences, maxlen):
    """The model's input for a batch of sentences, by the input rules above.

    Graph code: the export runs it inside ``serving_default``.

    Args:
      tokenizer: the source tokenizer.
      sentences: (N,) string tensor.
      maxlen: most tokens of a source, ``</S>`` included.
    Returns:
      (N, None) int32 RaggedTensor; row n is ``</S>`` alone when sentence n has no token.
    """
    sentences = tf.strings.unicode_transcode(sentences, "UTF-8", "UTF-8", errors="replace",
                                             replacement_char=0xFFFD)
    ids = tokenizer.tokenize(sentences)[:, : maxlen - 1]
    return tf.concat([ids, tf.fill([ids.nrows(), 1], tf.constant(EOS_ID, tf.int32))], axis=1)


def translate_nbest(sentences, source_tokenizer, target_tokenizer, model, batch_size=32, max_length=None,
                    beam_size=1, length_penalty=0.6, nbest=1, trace=None):
    """Translates a list of strings; returns, in input order, each one's ``nbest`` best
    ``(translation, score)`` pairs, best first.

    Sentences are batched by length (sorted, then restored). ``trace``, if
    given, is called with one line of text per greedy decoding step (it needs
    ``beam_size=1``); tracing keeps the input order.
    """
    if trace is not None and beam_size != 1:
        raise ValueError("a trace shows greedy decoding: it needs beam_size=1")
    sources = source_ids(source_tokenizer, tf.constant(sentences, tf.string), model.config.maxlen)
    lengths = sources.row_lengths().numpy()
    results = [[("", 0.0)] * nbest for _ in sentences]
    # By length, so batches hold sentences of similar length; a trace keeps the input order, to read it down.
    order = np.arange(len(lengths)) if trace else np.argsort(lengths, kind="stable")
    order = [int(i) for i in order if lengths[i] > 1]  # `</S>` alone: no words
    for start in range(0, len(order), batch_size):
        rows = order[start:start + batch_size]
        x = tf.gather(sources, rows).to_tensor()
        if trace is None:
            ids, scores = decoding.generate(model, x, beam_size=beam_size, length_penalty=length_penalty,
                                          max_length=max_length, nbest=nbest)
            ids, scores = ids.numpy(), scores.numpy()
        else:
            ids, scores = _reference_greedy(model, x, max_length, rows, target_tokenizer, trace)
        texts = target_tokenizer.to_texts(ids.reshape([-1, ids.shape[-1]]))
        for i, row in enumerate(rows):
            results[row] = [(texts[i * nbest + k], float(scores[i, k])) for k in range(nbest)]
    return results


def _reference_greedy(model, x, max_length, rows, target_tokenizer, trace):
    """The reference greedy decoder, reporting each step to ``trace``: ((B, 1, T) ids, (B, 1) zero scores)."""

    def on_step(step, tokens):
        for row, ids in zip(rows, tokens):
            pieces = " ".join(target_tokenizer.id_to_token(i) for i in ids)
            trace(f"[{row}] step {step}: <S> {pieces}")

    ids = decoding.greedy_decode(model, x, max_length, on_step)
    return ids[:, None, :], np.zeros([len(rows), 1], np.float32)


def translate(sentences, source_tokenizer, target_tokenizer, model, batch_size=32, max_length=None, trace=None,
              beam_size=1, length_penalty=0.6):
    """Translates a list of strings in batches; returns the best translations in input order.

    ``trace``, if given, is called with one line of text per decoding step.
    """
    return [hypotheses[0][0] for hypotheses in translate_nbest(
        sentences, source_tokenizer, target_tokenizer, model, batch_size, max_length, beam_size,
        length_penalty, 1, trace)]


def attention_of(model, tokenizers, x, output):
    """Every decoder block's encoder-decoder attention while the model reads ``output`` for ``x``.

    Args:
      x: (1, T_x) source ids; output: T_y output ids (``</S>``-terminated, or cut at the limit).
    Returns:
      ((L, h, T_y, T_x) weights, T_x source tokens, T_y output tokens). Row t is the attention
      while producing output token t, so rows are labelled by the output.
    """
    source_tokenizer, target_tokenizer = tokenizers
    decoder_inputs = tf.constant([[BOS_ID] + list(output[:-1])], tf.int32)
    weights = np.stack([block[0].numpy() for block in model.attention_weights(x, decoder_inputs)])
    return (weights, [source_tokenizer.id_to_token(i) for i in x[0].numpy()],
            [target_tokenizer.id_to_token(i) for i in output])


def attention_figure(sentence, source_tokenizer, target_tokenizer, model, translation_ids, path):
    """Plots the encoder-decoder attention of every head of every decoder block for one sentence.

    Args:
      translation_ids: the decoder's output for ``sentence`` (``</S>``-terminated or cut at the limit).
    Returns:
      the :class:`matplotlib.figure.Figure` (:func:`~tf_transformer.plotting.plot_attention`: blocks
      down, heads across, source tokens on x, output tokens on y), also written to ``path`` as PNG.
    """
    x = source_ids(source_tokenizer, tf.constant([sentence]), model.config.maxlen).to_tensor()
    output = [int(i) for i in translation_ids]
    if EOS_ID in output:
        output = output[: output.index(EOS_ID) + 1]
    return plotting.plot_attention(*attention_of(model, (source_tokenizer, target_tokenizer), x, output),
                                   path=path, title=f"encoder-decoder attention: {sentence}")


def plot_sentence_attention(sentence, source_tokenizer, target_tokenizer, model, path, beam_size=1,
                            length_penalty=0.6, max_length=None):
    """Translates one sentence and writes :func:`attention_figure` of it to ``path``.

    Raises:
      UserError: the sentence has no words.
    """
    x = source_ids(source_tokenizer, tf.constant([sentence]), model.config.maxlen).to_tensor()
    if x.shape[1] == 1:
        raise UserError(f"cannot plot the attention of {sentence!r} into {path}: the sentence has no words")
    ids, _ = decoding.generate(model, x, beam_size=beam_size, length_penalty=length_penalty, max_length=max_length)
    return attention_figure(sentence, source_tokenizer, target_tokenizer, model, ids[0, 0].numpy(), path)


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="translate.py", description=__doc__.split("\n")[0])
    parser.add_argument("sentences", nargs="*", help="source sentences (default: --input, else standard input)")
    parser.add_argument("--model-dir", help="a directory written by train.py")
    parser.add_argument("--input", help="a UTF-8 text file, one sentence per line")
    parser.add_argument("--output", help="write the translations here (default: standard output)")
    parser.add_argument("--batch-size", type=int, default=32, help="sentences decoded (or sent) together")
    parser.add_argument("--beam-size", type=int,
                        help="1 = greedy (default: the model's beam_size; with --server/--rest: the export's)")
    parser.add_argument("--length-penalty", type=float,
                        help="GNMT alpha of beam search (default: the model's length_penalty)")
    parser.add_argument("--nbest", type=int, default=1,
                        help="print the N best translations (at most --beam-size) as INDEX<TAB>SCORE<TAB>TEXT")
    parser.add_argument("--max-length", type=int, default=None,
                        help="most target tokens per sentence (default: the model's max_decode_length, "
                             "0 there = source length + 50)")
    parser.add_argument("--trace", action="store_true",
                        help="print the decoder output after every (greedy) step to standard error")
    parser.add_argument("--plot-attention", metavar="FILE.png",
                        help="draw the encoder-decoder attention of every head and decoder block for the "
                             "first sentence")
    parser.add_argument("--server", metavar="HOST:PORT", help="translate with TF Serving's gRPC API there")
    parser.add_argument("--rest", metavar="URL",
                        help="translate with TF Serving's REST API: http://HOST:8501, or the full "
                             ".../v1/models/NAME:predict")
    parser.add_argument("--model-name", default=serving.DEFAULT_MODEL_NAME,
                        help="the model's name in TF Serving (default: %(default)s)")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for each server answer")
    return parser.parse_args(argv)


def check_args(args):
    """Refuses impossible flag combinations and values, each with one line naming the flag."""
    remote = args.server or args.rest
    if args.server and args.rest:
        raise UserError("give either --server or --rest, not both")
    if not remote and not args.model_dir:
        raise UserError("give --model-dir DIR (a directory written by train.py), or --server/--rest")
    if remote and args.model_dir:
        raise UserError("--model-dir translates here; --server/--rest ask TF Serving: give one of them")
    if args.sentences and args.input:
        raise UserError("give sentences as arguments or --input FILE, not both")
    for flag, value, least in (("--batch-size", args.batch_size, 1), ("--beam-size", args.beam_size, 1),
                               ("--nbest", args.nbest, 1), ("--max-length", args.max_length, 1),
                               ("--timeout", args.timeout, 1e-3)):
        if value is not None and value < least:
            raise UserError(f"{flag} {value}: must be at least {least}")
    for flag, value in (("--length-penalty", args.length_penalty), ("--timeout", args.timeout)):
        if value is not None and not math.isfinite(value):
            raise UserError(f"{flag} {value}: must be a finite number")
    if args.length_penalty is not None and args.length_penalty < 0:
        raise UserError(f"--length-penalty {args.length_penalty}: must be 0 (none) or more")
    if args.trace and (args.beam_size or 1) > 1:
        raise UserError(f"--trace shows greedy decoding steps; it needs --beam-size 1, not {args.beam_size}")
    if args.beam_size and args.nbest > args.beam_size:
        raise UserError(f"--nbest {args.nbest}: at most --beam-size, {args.beam_size}")
    if args.plot_attention and not args.plot_attention.lower().endswith(".png"):
        raise UserError(f"--plot-attention {args.plot_attention}: give a file name ending in .png")
    for flag, path in (("--output", args.output), ("--plot-attention", args.plot_attention)):
        if path and not os.path.isdir(os.path.dirname(os.path.abspath(path))):
            raise UserError(f"{flag} {path}: its directory does not exist")
        if path and os.path.isdir(path):
            raise UserError(f"{flag} {path}: is a directory, expected a file name")
    if remote:
        local_only = [flag for flag, used in (("--nbest", args.nbest != 1), ("--trace", args.trace),
                                              ("--plot-attention", args.plot_attention),
                                              ("--length-penalty", args.length_penalty is not None),
                                              ("--max-length", args.max_length is not None)) if used]
        if local_only:
            raise UserError(f"{', '.join(local_only)} need(s) a local --model-dir: the export returns the best "
                            f"translation with the length penalty and limit it was exported with")


def read_sentences(args):
    """The sentences to translate: arguments, --input, or standard input (each UTF-8)."""
    if args.sentences:
        return args.sentences
    if args.input:
        return read_text_lines(args.input)
    raw = sys.stdin.buffer.read() if hasattr(sys.stdin, "buffer") else sys.stdin.read().encode("utf-8")
    return decode_lines(split_lines(raw), "standard input, line ")


def translate_remote(args, sentences):
    """[(translation, score)] from TF Serving, sent in batches of --batch-size."""
    client = (serving.GrpcClient(args.server, args.model_name, args.timeout) if args.server
              else serving.RestClient(args.rest, args.model_name, args.timeout))
    results = []
    for start in range(0, len(sentences), args.batch_size):
        translations, scores = client.translate(sentences[start:start + args.batch_size], args.beam_size)
        results += [[pair] for pair in zip(translations, scores)]
    return results


def translate_local(args, sentences, trace):
    """[[(translation, score)] * nbest] with the model directory's latest checkpoint, or with the
    average of its last checkpoints when that is current (:func:`~tf_transformer.average.current_average`)."""
    model_dir = current_average(args.model_dir) or args.model_dir
    if model_dir != args.model_dir:
        print(f"translating with {model_dir}: the average of {args.model_dir}'s last checkpoints, which "
              f"training kept (and exported) as better on dev", file=sys.stderr)
    hp, source_tokenizer, target_tokenizer, model = load_for_inference(model_dir)
    beam_size = args.beam_size or (1 if args.trace else hp.beam_size)
    if args.nbest > beam_size:
        raise UserError(f"--nbest {args.nbest}: at most the beam size, {beam_size} (give --beam-size)")
    length_penalty = hp.length_penalty if args.length_penalty is None else args.length_penalty
    max_length = args.max_length or hp.max_decode_length or None
    results = translate_nbest(sentences, source_tokenizer, target_tokenizer, model, args.batch_size, max_length,
                              beam_size, length_penalty, args.nbest, trace)
    if args.plot_attention and sentences:
        plot_sentence_attention(sentences[0], source_tokenizer, target_tokenizer, model, args.plot_attention,
                                beam_size, length_penalty, max_length)
    return results


def format_results(results, nbest):
    """One line per translation; with ``nbest > 1``, ``INDEX<TAB>SCORE<TAB>TRANSLATION`` lines."""
    if nbest == 1:
        return [hypotheses[0][0] for hypotheses in results]
    return [f"{index}\t{score:.4f}\t{text}" for index, hypotheses in enumerate(results) for text, score in hypotheses]


@report_user_errors
def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    check_args(args)
    sentences = read_sentences(args)
    trace = (lambda line: print(line, file=sys.stderr)) if args.trace else None
    if args.server or args.rest:
        results = translate_remote(args, sentences)
    else:
        results = translate_local(args, sentences, trace)
    lines = format_results(results, args.nbest)
    if args.output:
        try:
            write_atomic(args.output, "".join(line + "\n" for line in lines))
        except OSError as e:
            raise UserError(f"--output {args.output}: cannot write it ({e.strerror})") from None
    else:
        for line in lines:
            print(line)


if __name__ == "__main__":
    sys.exit(main())
