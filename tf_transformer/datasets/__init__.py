"""Building a real German-English corpus from Debian's package archive.

``python -m tf_transformer.datasets build debian-de-en --out DIR`` downloads the
sources (:mod:`.debian`), parses and aligns them (one module per source:
:mod:`.ding`, :mod:`.ddtp`, :mod:`.libreoffice`, :mod:`.manpages`), then splits
sentences, cleans (:mod:`.cleaning`), de-duplicates and splits train/dev/test
by document (:mod:`.build`).

A source module exposes ``NAME``, ``LICENSE``, ``PACKAGES`` and
``documents(cache, log)``, which yields ``(document_id, [(german, english), ...])``.
"""

import importlib

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
