"""The command lines: each module parses its arguments, calls the library and prints.

``train.py`` and ``translate.py`` at the top of the repository run :mod:`tf_transformer.cli.train` and
:mod:`tf_transformer.cli.translate`; the others run as ``python -m tf_transformer.cli.NAME``
(:mod:`~tf_transformer.cli.export`, :mod:`~tf_transformer.cli.average`, :mod:`~tf_transformer.cli.plots`,
:mod:`~tf_transformer.cli.datasets`). Nothing in the library imports this package.
"""
