"""Translation: ``python translate.py --model-dir DIR [SENTENCE ...]``.

Translates the sentences given as arguments, or one per line from standard
input, and prints one translation per line in input order. ``--trace`` prints
the decoder's output after every step to standard error, as in the seeds' log.
"""

import argparse
import sys

from tf_transformer import data_load
from tf_transformer.decoding import greedy_decode
from tf_transformer.errors import UserError, report_user_errors
from tf_transformer.model_dir import load_for_inference


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="translate.py", description=__doc__.split("\n")[0])
    parser.add_argument("sentences", nargs="*", help="source sentences (default: read standard input)")
    parser.add_argument("--model-dir", required=True, help="a directory written by train.py")
    parser.add_argument("--batch-size", type=int, default=32, help="sentences decoded together")
    parser.add_argument("--max-length", type=int, default=None,
                        help="most target tokens per sentence (default: source length + 50)")
    parser.add_argument("--trace", action="store_true", help="print the decoder output after every step")
    return parser.parse_args(argv)


def translate(sentences, source_tokenizer, target_tokenizer, model, batch_size=32, max_length=None, trace=None):
    """Translates a list of strings in batches; returns the translations in order.

    ``trace``, if given, is called with one line of text per decoding step.
    """
    translations = []
    for start in range(0, len(sentences), batch_size):
        x = data_load.tokenize_with_eos(source_tokenizer, sentences[start:start + batch_size]).to_tensor()

        def on_step(step, tokens):
            for row, ids in enumerate(tokens):
                pieces = " ".join(target_tokenizer.id_to_token(i) for i in ids)
                trace(f"[{start + row}] step {step}: <S> {pieces}")

        ids = greedy_decode(model, x, max_length, on_step if trace else None)
        translations += target_tokenizer.decode(ids)
    return translations


@report_user_errors
def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.batch_size < 1:
        raise UserError(f"--batch-size {args.batch_size}: must be at least 1")
    _, source_tokenizer, target_tokenizer, model = load_for_inference(args.model_dir)
    sentences = args.sentences or [line.rstrip("\n") for line in sys.stdin]
    trace = (lambda line: print(line, file=sys.stderr)) if args.trace else None
    for translation in translate(sentences, source_tokenizer, target_tokenizer, model,
                                 args.batch_size, args.max_length, trace):
        print(translation)


if __name__ == "__main__":
    sys.exit(main())
