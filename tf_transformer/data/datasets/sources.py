"""The sources of the corpus builder, by name, and the corpus it builds on first use."""

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
    module_name = f"{__package__}.{name}"
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name != module_name:
            raise
        raise UserError(f"source '{name}' is not available in this installation "
                        f"(no module {module_name})") from None


# The corpus that ``train.py --data NAME`` builds when it is not there yet.
BUILT_ON_FIRST_USE = "debian-de-en"
