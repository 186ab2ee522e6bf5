"""Every command line of the package answers ``--help`` with its usage, and exit code 0."""

import importlib

import pytest

COMMANDS = [
    ("tf_transformer.train", []),
    ("tf_transformer.translate", []),
    ("tf_transformer.export", []),
    ("tf_transformer.average", []),
    ("tf_transformer.plots", []),
    ("tf_transformer.datasets.__main__", []),
    ("tf_transformer.datasets.__main__", ["build"]),  # argparse expands each "%" of a sub-command's help
]


@pytest.mark.parametrize("module, prefix", COMMANDS, ids=[" ".join([m] + p) for m, p in COMMANDS])
def test_help_prints_usage_and_exits_0(module, prefix, capsys):
    parse_args = importlib.import_module(module).parse_args
    with pytest.raises(SystemExit) as exit_:
        parse_args(prefix + ["--help"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.startswith("usage:")
