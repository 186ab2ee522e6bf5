"""``python -m tf_transformer.datasets build ...``: runs :mod:`tf_transformer.cli.datasets` (the command
that a built corpus's SOURCES.md names)."""

import sys

from tf_transformer.cli.datasets import main

if __name__ == "__main__":
    sys.exit(main())
