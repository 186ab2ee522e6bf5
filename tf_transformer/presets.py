"""``hparams.yaml`` read: its YAML, a fault naming the file and line, and the names of its presets.

Free of TensorFlow, like :mod:`tf_transformer.options`: ``train.py --help`` lists the presets without
TensorFlow's import. :mod:`tf_transformer.hparams` builds the typed record from what this reads.
"""

import os

import yaml

from tf_transformer.errors import UserError
from tf_transformer.files import read_text_lines

PRESETS_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hparams.yaml")


class HParamsError(UserError):
    """A bad hyper-parameter key or value."""


def read_yaml(path):
    """The YAML document of the file ``path`` (None when it is empty). Raises :class:`HParamsError` naming the
    file, and the line of a YAML fault."""
    try:
        text = "\n".join(read_text_lines(path))
    except UserError as e:
        raise HParamsError(str(e)) from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        raise HParamsError(f"{path}{line}: not valid YAML ({getattr(e, 'problem', e)})") from None


def preset_names(presets_path=PRESETS_PATH):
    """The names under ``presets`` in ``presets_path``, in the file's order."""
    return list((read_yaml(presets_path) or {}).get("presets", {}))
