"""Building a real German-English corpus from Debian's package archive.

``python -m tf_transformer.cli.datasets build debian-de-en --out DIR`` downloads the
sources (:mod:`.debian`), parses and aligns them (one module per source:
:mod:`.ding`, :mod:`.ddtp`, :mod:`.libreoffice`, :mod:`.manpages`), then splits
sentences, cleans (:mod:`.cleaning`), de-duplicates and splits train/dev/test
by document (:mod:`.build`). The sources by name: :mod:`.sources`.

A source module exposes ``NAME``, ``LICENSE``, ``PACKAGES`` and
``documents(cache, log)``, which yields ``(document_id, [(german, english), ...])``.
"""

import os

from tf_transformer.data.datasets.sources import BUILT_ON_FIRST_USE, SOURCES, load_source, source_names  # noqa: F401
from tf_transformer.errors import UserError

# Where corpora built on first use live (``train.py --data debian-de-en``), unless
# ``TF_TRANSFORMER_DATA`` names another folder; a fresh clone reuses what an earlier one built.
DATA_HOME = os.path.join(os.path.expanduser("~"), ".cache", "tf-transformer")


def data_home():
    """The folder of built corpora: ``$TF_TRANSFORMER_DATA``, else :data:`DATA_HOME`."""
    return os.environ.get("TF_TRANSFORMER_DATA") or DATA_HOME


def ensure_built(name, home=None, log=print):
    """The directory of corpus ``name`` under ``home`` (default :func:`data_home`), built
    there first unless a complete build is already there.

    Returns:
      The corpus directory (``train``, ``dev``, ``test`` .de/.en and ``SOURCES.md``).
    Raises:
      UserError: ``name`` is not a corpus the builder knows;
        :class:`~tf_transformer.data.datasets.debian.DownloadError` (a UserError): Debian's archive
        could not be reached; a build that fails leaves no partial corpus behind.
    """
    from tf_transformer.data.datasets import build  # late: building needs far more than naming the sources

    if name != BUILT_ON_FIRST_USE:
        raise UserError(f"unknown corpus '{name}'; the builder makes {BUILT_ON_FIRST_USE}")
    directory = os.path.join(home or data_home(), name)
    if build.is_complete(directory):
        log(f"corpus {name}: reusing {directory}")
        return directory
    log(f"corpus {name}: building it into {directory} from Debian's archive (about 5 minutes, once)")
    build.build(directory, log=log)
    return directory
