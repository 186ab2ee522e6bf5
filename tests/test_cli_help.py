"""Every command line of the package answers ``--help`` with its usage, and exit code 0."""

import importlib

import pytest

COMMANDS = [
    ("tf_transformer.cli.train", []),
    ("tf_transformer.cli.translate", []),
    ("tf_transformer.cli.export", []),
    ("tf_transformer.cli.average", []),
    ("tf_transformer.cli.plots", []),
    ("tf_transformer.cli.datasets", []),
    ("tf_transformer.cli.datasets", ["build"]),  # argparse expands each "%" of a sub-command's help
]


@pytest.mark.parametrize("module, prefix", COMMANDS, ids=[" ".join([m] + p) for m, p in COMMANDS])
def test_help_prints_usage_and_exits_0(module, prefix, capsys):
    parse_args = importlib.import_module(module).parse_args
    with pytest.raises(SystemExit) as exit_:
        parse_args(prefix + ["--help"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.startswith("usage:")
