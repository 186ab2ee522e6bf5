"""Building a real German-English corpus from Debian's package archive.

``python -m tf_transformer.cli.datasets build debian-de-en --out DIR`` downloads the
sources (:mod:`.debian`), parses and aligns them (one module per source:
:mod:`.ding`, :mod:`.ddtp`, :mod:`.libreoffice`, :mod:`.manpages`), then splits
sentences, cleans (:mod:`.cleaning`), de-duplicates and splits train/dev/test
by document (:mod:`.build`).

A source module exposes ``NAME``, ``LICENSE``, ``PACKAGES`` and
``documents(cache, log)``, which yields ``(document_id, [(german, english), ...])``.
"""

import importlib
import os

from tf_transformer.errors import UserError

SOURCES = ("ding", "ddtp", "libreoffice", "manpages")


def source_names(names):
    """``names`` without repeats, in the order of :data:`SOURCES`.

    Raises:
      UserError: a name not in :data:`SOURCES` (the message lists the valid ones).
    """
    for name in names:
        if name not in SOURCES:
            raise UserError(f"unknown source '{name}'; valid sources: {', '.join(SOURCES)}")
    return [name for name in SOURCES if name in names]


def load_source(name):
    """The source module called ``name`` (one of :data:`SOURCES`), imported on first use."""
    source_names([name])
    module_name = f"{__name__}.{name}"
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name != module_name:
            raise
        raise UserError(f"source '{name}' is not available in this installation "
                        f"(no module {module_name})") from None


# The corpus that ``train.py --data NAME`` builds when it is not there yet.
BUILT_ON_FIRST_USE = "debian-de-en"
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
    from tf_transformer.data.datasets import build  # late: the builder imports the source modules' helpers

    if name != BUILT_ON_FIRST_USE:
        raise UserError(f"unknown corpus '{name}'; the builder makes {BUILT_ON_FIRST_USE}")
    directory = os.path.join(home or data_home(), name)
    if build.is_complete(directory):
        log(f"corpus {name}: reusing {directory}")
        return directory
    log(f"corpus {name}: building it into {directory} from Debian's archive (about 5 minutes, once)")
    build.build(directory, log=log)
    return directory
