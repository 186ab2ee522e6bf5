"""The command lines: each module parses its arguments, calls the library and prints.

``train.py`` and ``translate.py`` at the top of the repository run :mod:`tf_transformer.cli.train` and
:mod:`tf_transformer.cli.translate`; the others run as ``python -m tf_transformer.cli.NAME``
(:mod:`~tf_transformer.cli.export`, :mod:`~tf_transformer.cli.average`, :mod:`~tf_transformer.cli.plots`,
:mod:`~tf_transformer.cli.datasets`). Nothing in the library imports this package.

Importing it keeps TensorFlow's start-up notices quiet (:func:`tf_transformer.quiet.quiet_tensorflow`) unless
the command line has ``--verbose``, takes TensorFlow's CPU tensors from its BFC allocator
(:func:`tf_transformer.allocator.reuse_cpu_memory`) and has Python's garbage collector run less often
(:func:`tf_transformer.collector.collect_less_often`): each command module imports TensorFlow after this.

Each command module parses and checks its arguments first and imports the library's modules that import TensorFlow
(seconds) only where they are used, so ``--help`` and a usage error answer at once (``tests/test_cli_help.py``).
"""

import sys

from tf_transformer.allocator import reuse_cpu_memory
from tf_transformer.collector import collect_less_often
from tf_transformer.quiet import quiet_tensorflow

quiet_tensorflow(verbose="--verbose" in sys.argv[1:])
reuse_cpu_memory()
collect_less_often()
