"""``python -m tf_transformer.cli.datasets build debian-de-en --out DIR [options]``: builds the corpus.

Writes ``DIR/{train,dev,test}.{de,en}`` and ``DIR/SOURCES.md``; downloads go
to ``DIR/cache`` (or ``--cache``) and are reused by the next build.
"""

import argparse
import sys

from tf_transformer.data.datasets import SOURCES, build
from tf_transformer.errors import report_user_errors
from tf_transformer.quiet import VERBOSE_HELP


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m tf_transformer.cli.datasets",
                                     description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    command = commands.add_parser("build", help="download, align, clean and split a corpus")
    command.add_argument("corpus", choices=[build.CORPUS], help="the corpus to build")
    command.add_argument("--out", required=True, help="folder for the splits and SOURCES.md")
    command.add_argument("--sources", default=",".join(SOURCES),
                         help=f"comma-separated sources (default: {','.join(SOURCES)})")
    command.add_argument("--cache", help="download cache (default: OUT/cache)")
    # "5%%": argparse %-formats help strings, so the percent sign of the format is doubled
    command.add_argument("--dev-size", type=int, default=build.DEV_SIZE,
                         help=f"about this many dev pairs, at most {build.MAX_HELDOUT_FRACTION:.0%}% "
                              f"of all (default: {build.DEV_SIZE})")
    command.add_argument("--test-size", type=int, default=build.TEST_SIZE,
                         help=f"about this many test pairs, at most {build.MAX_HELDOUT_FRACTION:.0%}% "
                              f"of all (default: {build.TEST_SIZE})")
    command.add_argument("--seed", type=int, default=build.SEED,
                         help=f"seed of the split by document (default: {build.SEED})")
    command.add_argument("--verbose", action="store_true", help=VERBOSE_HELP)
    args = parser.parse_args(argv)
    if args.dev_size < 0 or args.test_size < 0:
        command.error("--dev-size and --test-size must be 0 or more")
    args.sources = [name.strip() for name in args.sources.split(",") if name.strip()]
    if not args.sources:
        command.error(f"--sources names none; choose from {','.join(SOURCES)}")
    return args


@report_user_errors
def main(argv=None):
    args = parse_args(argv)
    build.build(args.out, args.sources, args.cache, args.dev_size, args.test_size, args.seed)


if __name__ == "__main__":
    sys.exit(main())
