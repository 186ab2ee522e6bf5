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
``--alignments`` adds each translation's word alignment in Pharaoh format
(``TRANSLATION<TAB>0-0 1-2 ...``; with ``--nbest``, a fourth column), from the
encoder-decoder attention of ``--alignment-block`` (default the last,
:mod:`tf_transformer.infer.align`). ``--sampling-topk K`` draws each translation among
the K most likely tokens of each step instead of searching (back-translation), at
``--sampling-temperature``, reproducibly with ``--seed``.
``--score --target FILE`` prints the model's log-probability of each target line
given its source line instead of translating: ``TOTAL<TAB>PER_TOKEN<TAB>NORMALISED``
(:mod:`tf_transformer.infer.score`).
``--server HOST:PORT`` (gRPC) or ``--rest URL`` send the sentences to a running
TF Serving that serves an export (:mod:`tf_transformer.infer.export`) instead of
loading the model here. ``--ctranslate2 DIR`` translates with a CTranslate2 model
directory that ``python -m tf_transformer.cli.export --format ctranslate2`` wrote
(:mod:`tf_transformer.infer.ct2`).

The input rules are the library's (:mod:`tf_transformer.infer.translate`), except that files
and standard input with invalid UTF-8 are refused, with the line at fault.
"""

import argparse
import math
import os
import secrets
import sys

from tf_transformer.errors import UserError, report_user_errors
from tf_transformer.files import decode_lines, read_text_lines, split_lines, write_atomic
from tf_transformer.options import (DEFAULT_BLOCK, DEFAULT_MODEL_NAME, MAX_BEAM_PATIENCE, MAX_BEAM_SIZE,
                                    MAX_DECODE_LENGTH, MAX_INT32, MAX_LENGTH_FACTOR, MAX_SEED)
from tf_transformer.quiet import VERBOSE_HELP

# The modules that import TensorFlow are imported where they are used (the package's rule: tf_transformer.cli).


# Seconds: a socket's timeout must fit the system's time values; a day is more than any answer needs.
MAX_TIMEOUT = 86400.0


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
    parser.add_argument("--beam-patience", type=float, default=None,
                        help="beam search ends a sentence once ceil(P x beam size) hypotheses ended "
                             "(CTranslate2's patience; faster); 0 = only when no hypothesis can still win "
                             "(default: the model's beam_patience; with --ctranslate2: 2)")
    parser.add_argument("--nbest", type=int, default=1,
                        help="print the N best translations (at most --beam-size) as INDEX<TAB>SCORE<TAB>TEXT")
    parser.add_argument("--max-length", type=int, default=None,
                        help="most target tokens per sentence (default: the model's max_decode_length, "
                             "0 there = source length + 50)")
    parser.add_argument("--max-length-factor", type=float, default=None,
                        help="also at most this many target tokens per source token (default: the model's "
                             "max_length_factor, 0 there = no such limit)")
    parser.add_argument("--xla", action="store_true",
                        help="decode with the loop compiled by XLA: faster per batch, but each new batch shape "
                             "compiles first (seconds), so it pays on long inputs")
    parser.add_argument("--trace", action="store_true",
                        help="print the decoder output after every (greedy) step to standard error")
    parser.add_argument("--plot-attention", metavar="FILE.png",
                        help="draw the encoder-decoder attention of every head and decoder block for the "
                             "first sentence")
    parser.add_argument("--server", metavar="HOST:PORT", help="translate with TF Serving's gRPC API there")
    parser.add_argument("--rest", metavar="URL",
                        help="translate with TF Serving's REST API: http://HOST:8501, or the full "
                             ".../v1/models/NAME:predict")
    parser.add_argument("--ctranslate2", metavar="DIR",
                        help="translate with this CTranslate2 model directory (python -m tf_transformer.cli.export "
                             "--format ctranslate2 writes it; needs pip install -e \".[ctranslate2]\")")
    parser.add_argument("--model-name", default=DEFAULT_MODEL_NAME,
                        help="the model's name in TF Serving (default: %(default)s)")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for each server answer")
    parser.add_argument("--alignments", action="store_true",
                        help="print each translation's source-target word alignment in Pharaoh format (0-0 1-2 ...) "
                             "after a TAB")
    parser.add_argument("--alignment-block", type=int, metavar="N",
                        help="the decoder block whose head-averaged attention aligns: 0 the first, -1 the last "
                             f"(default: {DEFAULT_BLOCK})")
    parser.add_argument("--sampling-topk", type=int, metavar="K",
                        help="draw each translation among the K most likely tokens of each step instead of "
                             "searching (back-translation); 1 = greedy")
    parser.add_argument("--sampling-temperature", type=float, metavar="T",
                        help="divide the logits by T before drawing: below 1 sharper, above 1 flatter (default: 1)")
    parser.add_argument("--seed", type=int,
                        help=f"the draws' seed, 0 to {MAX_SEED}: the same seed, the same translations (default: a "
                             "random one, printed to standard error)")
    parser.add_argument("--score", action="store_true",
                        help="print the log-probability of each --target line given its source line instead of "
                             "translating: TOTAL<TAB>PER_TOKEN<TAB>NORMALISED (by the length penalty)")
    parser.add_argument("--target", metavar="FILE", help="with --score: the translations to score, one per line")
    parser.add_argument("--verbose", action="store_true", help=VERBOSE_HELP)
    return parser.parse_args(argv)


def check_args(args):
    """Refuses impossible flag combinations and values, each with one line naming the flag."""
    remote = args.server or args.rest
    if args.server and args.rest:
        raise UserError("give either --server or --rest, not both")
    check_ctranslate2_args(args)
    if not remote and not args.model_dir and not args.ctranslate2:
        raise UserError("give --model-dir DIR (a directory written by train.py), or --server/--rest")
    if remote and args.model_dir:
        raise UserError("--model-dir translates here; --server/--rest ask TF Serving: give one of them")
    if args.sentences and args.input:
        raise UserError("give sentences as arguments or --input FILE, not both")
    for flag, value, least, most in (("--batch-size", args.batch_size, 1, MAX_INT32),
                                     ("--beam-size", args.beam_size, 1, MAX_BEAM_SIZE),
                                     ("--nbest", args.nbest, 1, MAX_BEAM_SIZE),
                                     ("--max-length", args.max_length, 1, MAX_DECODE_LENGTH),
                                     ("--timeout", args.timeout, 1e-3, MAX_TIMEOUT)):
        if value is not None and not least <= value <= most:
            raise UserError(f"{flag} {value}: must be between {least} and {most}")
    for flag, value in (("--length-penalty", args.length_penalty), ("--timeout", args.timeout),
                        ("--max-length-factor", args.max_length_factor), ("--beam-patience", args.beam_patience)):
        if value is not None and not math.isfinite(value):
            raise UserError(f"{flag} {value}: must be a finite number")
    for flag, value in (("--length-penalty", args.length_penalty), ("--max-length-factor", args.max_length_factor),
                        ("--beam-patience", args.beam_patience)):
        if value is not None and value < 0:
            raise UserError(f"{flag} {value}: must be 0 (none) or more")
    if args.beam_patience is not None and args.beam_patience > MAX_BEAM_PATIENCE:
        raise UserError(f"--beam-patience {args.beam_patience}: must be at most {MAX_BEAM_PATIENCE:g}")
    if args.ctranslate2 and args.beam_patience == 0:
        raise UserError("--beam-patience 0: CTranslate2's beam search has no exact rule; give a patience above 0 "
                        "(1: its default)")
    if args.max_length_factor is not None and args.max_length_factor > MAX_LENGTH_FACTOR:
        raise UserError(f"--max-length-factor {args.max_length_factor}: must be at most {MAX_LENGTH_FACTOR:g} (a "
                        f"sentence of n tokens gets at most n + 50 anyway, which any factor from 51 up allows)")
    if args.xla and args.trace:
        raise UserError("--trace shows the reference decoder's steps; it does not run compiled: drop --xla")
    if args.trace and (args.beam_size or 1) > 1:
        raise UserError(f"--trace shows greedy decoding steps; it needs --beam-size 1, not {args.beam_size}")
    if args.beam_size and args.nbest > args.beam_size:
        raise UserError(f"--nbest {args.nbest}: at most --beam-size, {args.beam_size}")
    if args.input and args.output and os.path.isfile(args.input) and os.path.exists(args.output) \
            and os.path.samefile(args.input, args.output):
        raise UserError(f"--output {args.output}: is the --input file; translations would replace the sentences, "
                        f"give another --output")
    check_modes(args)
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
                                              ("--beam-patience", args.beam_patience is not None),
                                              ("--max-length", args.max_length is not None),
                                              ("--max-length-factor", args.max_length_factor is not None),
                                              ("--xla", args.xla)) if used]
        if local_only:
            raise UserError(f"{', '.join(local_only)} need(s) a local --model-dir: the export returns the best "
                            f"translation with the length penalty and limit it was exported with")


def check_ctranslate2_args(args):
    """Refuses what --ctranslate2 cannot do, in one line naming the flags."""
    if not args.ctranslate2:
        return
    others = [flag for flag, used in (("--model-dir", args.model_dir), ("--server", args.server),
                                      ("--rest", args.rest)) if used]
    if others:
        raise UserError(f"--ctranslate2 translates with a CTranslate2 model; {', '.join(others)} too: give one of them")
    unsupported = [flag for flag, used in (("--trace", args.trace), ("--plot-attention", args.plot_attention),
                                           ("--xla", args.xla),
                                           ("--max-length-factor", args.max_length_factor is not None)) if used]
    if unsupported:
        raise UserError(f"{', '.join(unsupported)}: not available with --ctranslate2 (our decoder's options; "
                        f"translate with --model-dir for them)")


def translate_ctranslate2(args, sentences):
    """[[(translation, CTranslate2's score)] * nbest] with the CTranslate2 model directory ``--ctranslate2``."""
    from tf_transformer.infer.ct2 import PATIENCE, Ct2Model

    model = Ct2Model.load(args.ctranslate2)
    hp = model.hp
    beam_size = args.beam_size or hp.beam_size
    if args.nbest > beam_size:
        raise UserError(f"--nbest {args.nbest}: at most the beam size, {beam_size} (give --beam-size)")
    return model.translate_nbest(sentences, batch_size=args.batch_size, max_length=args.max_length,
                                 beam_size=beam_size, nbest=args.nbest, patience=args.beam_patience or PATIENCE,
                                 length_penalty=hp.length_penalty if args.length_penalty is None else args.length_penalty)


def check_modes(args):
    """Refuses bad values and combinations of --score, --alignments and --sampling-*, one line each."""
    remote = [flag for flag, used in (("--score", args.score), ("--alignments", args.alignments),
                                      ("--sampling-topk", args.sampling_topk is not None)) if used]
    if (args.server or args.rest or args.ctranslate2) and remote:
        raise UserError(f"{', '.join(remote)} need(s) a local --model-dir: TF Serving and CTranslate2 answer with "
                        f"translations only")
    for flag, value, needs, used in (("--alignment-block", args.alignment_block, "--alignments", args.alignments),
                                     ("--sampling-temperature", args.sampling_temperature, "--sampling-topk",
                                      args.sampling_topk is not None),
                                     ("--seed", args.seed, "--sampling-topk", args.sampling_topk is not None),
                                     ("--target", args.target, "--score", args.score)):
        if value is not None and not used:
            raise UserError(f"{flag} {value}: only with {needs}")
    if args.sampling_topk is not None and not 1 <= args.sampling_topk <= MAX_INT32:
        raise UserError(f"--sampling-topk {args.sampling_topk}: must be between 1 and {MAX_INT32} (more than the "
                        f"vocabulary draws from all of it)")
    if args.sampling_temperature is not None and not 0 < args.sampling_temperature < math.inf:
        raise UserError(f"--sampling-temperature {args.sampling_temperature}: must be a positive finite number")
    if args.seed is not None and not 0 <= args.seed <= MAX_SEED:
        raise UserError(f"--seed {args.seed}: must be between 0 and {MAX_SEED}")
    if args.sampling_topk is not None:
        _refuse_with("--sampling-topk", "draws one translation per sentence", beam=args.beam_size not in (None, 1),
                     nbest=args.nbest != 1, trace=args.trace, xla=args.xla)
    if args.score:
        _refuse_with("--score", "scores the given --target instead of translating", beam=args.beam_size is not None,
                     nbest=args.nbest != 1, trace=args.trace, xla=args.xla, alignments=args.alignments,
                     plot=args.plot_attention, sampling=args.sampling_topk is not None,
                     length=args.max_length is not None, factor=args.max_length_factor is not None)
        if not args.target:
            raise UserError("--score needs --target FILE: the translations to score, one per source line")
        if args.output and os.path.exists(args.output) and os.path.isfile(args.target) \
                and os.path.samefile(args.target, args.output):
            raise UserError(f"--output {args.output}: is the --target file; give another --output")


_FLAGS = {"beam": "--beam-size", "nbest": "--nbest", "trace": "--trace", "xla": "--xla", "alignments": "--alignments",
          "plot": "--plot-attention", "sampling": "--sampling-topk", "length": "--max-length",
          "factor": "--max-length-factor"}


def _refuse_with(flag, what, **used):
    """Refuses the flags of ``used`` (keys of _FLAGS) that are set, naming them: ``flag`` does ``what``."""
    clashing = [_FLAGS[key] for key, value in used.items() if value]
    if clashing:
        raise UserError(f"{flag} {what}: drop {', '.join(clashing)}")


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
    from tf_transformer.infer import serving

    client = (serving.GrpcClient(args.server, args.model_name, args.timeout) if args.server
              else serving.RestClient(args.rest, args.model_name, args.timeout))
    results = []
    for start in range(0, len(sentences), args.batch_size):
        translations, scores = client.translate(sentences[start:start + args.batch_size], args.beam_size)
        results += [[pair] for pair in zip(translations, scores)]
    return results


def load_local(args):
    """The model of --model-dir: its latest checkpoint, or the average of its last checkpoints when that is
    current (:func:`~tf_transformer.train.average.current_average`)."""
    from tf_transformer.infer.load import load_for_inference
    from tf_transformer.train.average import current_average

    model_dir = current_average(args.model_dir) or args.model_dir
    if model_dir != args.model_dir:
        print(f"translating with {model_dir}: the average of {args.model_dir}'s last checkpoints, which "
              f"training kept (and exported) as better on dev", file=sys.stderr)
    return load_for_inference(model_dir)


def translate_local(args, sentences, trace):
    """[[:class:`~tf_transformer.infer.translate.Hypothesis`] * nbest] with the model of :func:`load_local`."""
    from tf_transformer.infer.translate import plot_sentence_attention, translate_nbest

    loaded = load_local(args)
    hp = loaded.hp
    beam_size = args.beam_size or (1 if args.trace or args.sampling_topk else hp.beam_size)
    if args.nbest > beam_size:
        raise UserError(f"--nbest {args.nbest}: at most the beam size, {beam_size} (give --beam-size)")
    length_penalty = hp.length_penalty if args.length_penalty is None else args.length_penalty
    max_length = args.max_length or hp.max_decode_length or None
    factor = hp.max_length_factor if args.max_length_factor is None else args.max_length_factor
    results = translate_nbest(sentences, *loaded.tokenizers, loaded.model, batch_size=args.batch_size,
                              max_length=max_length, beam_size=beam_size, length_penalty=length_penalty,
                              nbest=args.nbest, trace=trace, max_length_factor=factor, jit_compile=args.xla,
                              sampling=sampling_of(args), alignment_block=alignment_block_of(args, hp),
                              patience=hp.beam_patience if args.beam_patience is None else args.beam_patience,
                              once=True)
    if args.plot_attention and sentences:
        plot_sentence_attention(sentences[0], *loaded.tokenizers, loaded.model, args.plot_attention,
                                max_length=max_length, beam_size=beam_size, length_penalty=length_penalty,
                                max_length_factor=factor)
    return results


def sampling_of(args):
    """The :class:`~tf_transformer.infer.decode.Sampling` of --sampling-* and --seed (a random seed, printed
    to standard error, when none is given), or None."""
    from tf_transformer.infer.decode import Sampling

    if args.sampling_topk is None:
        return None
    seed = secrets.randbelow(MAX_SEED + 1) if args.seed is None else args.seed
    if args.seed is None:
        print(f"sampling with --seed {seed} (give it to draw the same translations again)", file=sys.stderr)
    temperature = 1.0 if args.sampling_temperature is None else args.sampling_temperature
    return Sampling(args.sampling_topk, temperature, seed)


def alignment_block_of(args, hp):
    """The decoder block of --alignments (a Python index), None without it; refuses one the model lacks."""
    if not args.alignments:
        return None
    block = DEFAULT_BLOCK if args.alignment_block is None else args.alignment_block
    if not -hp.num_blocks <= block < hp.num_blocks:
        raise UserError(f"--alignment-block {block}: the model has {hp.num_blocks} decoder blocks; give 0 to "
                        f"{hp.num_blocks - 1}, or -{hp.num_blocks} to -1 from the last")
    return block


def score_local(args, sentences):
    """``TOTAL<TAB>PER_TOKEN<TAB>NORMALISED`` lines of --score: each --target line given its source."""
    from tf_transformer.infer.score import score_pairs

    targets = read_text_lines(args.target)
    if len(targets) != len(sentences):
        raise UserError(f"--target {args.target}: {len(targets)} lines, but {len(sentences)} source sentences; "
                        f"give one translation per source line")
    loaded = load_local(args)
    length_penalty = loaded.hp.length_penalty if args.length_penalty is None else args.length_penalty
    scores = score_pairs(sentences, targets, *loaded.tokenizers, loaded.model, batch_size=args.batch_size,
                         length_penalty=length_penalty)
    return [f"{s.total:.6f}\t{s.per_token:.6f}\t{s.normalised:.6f}" for s in scores]


def format_results(results, nbest, alignments=False):
    """One line per translation; with ``nbest > 1``, ``INDEX<TAB>SCORE<TAB>TRANSLATION`` lines; with
    ``alignments``, ``<TAB>ALIGNMENT`` after each translation."""
    def text(hypothesis):
        return f"{hypothesis[0]}\t{hypothesis.alignment}" if alignments else hypothesis[0]

    if nbest == 1:
        return [text(hypotheses[0]) for hypotheses in results]
    return [f"{index}\t{hypothesis[1]:.4f}\t{text(hypothesis)}" for index, hypotheses in enumerate(results)
            for hypothesis in hypotheses]


@report_user_errors
def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    check_args(args)
    sentences = read_sentences(args)
    trace = (lambda line: print(line, file=sys.stderr)) if args.trace else None
    if args.score:
        lines = score_local(args, sentences)
    elif args.server or args.rest:
        lines = format_results(translate_remote(args, sentences), args.nbest)
    elif args.ctranslate2:
        lines = format_results(translate_ctranslate2(args, sentences), args.nbest)
    else:
        lines = format_results(translate_local(args, sentences, trace), args.nbest, args.alignments)
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
