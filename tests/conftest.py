"""Fixtures shared by several test files: the tiny trained toy model of :mod:`tests.toy_model`."""

import os

import pytest

# No persistent XLA cache for the tests' many tiny models (tf_transformer.train.xla_cache keeps a user's choice;
# an empty directory is TensorFlow's "none"): they would fill ~/.cache/tf-transformer/xla run after run.
os.environ.setdefault("TF_XLA_FLAGS", "--tf_xla_persistent_cache_directory=")

from tests.toy_model import toy_model_dir
from tf_transformer.infer.load import load_for_inference


@pytest.fixture(scope="session")
def toy_dir(tmp_path_factory):
    """The trained toy model directory (:func:`tests.toy_model.toy_model_dir`)."""
    return toy_model_dir(tmp_path_factory)


@pytest.fixture(scope="session")
def toy_loaded(toy_dir):
    """:class:`~tf_transformer.infer.load.LoadedModel` of :func:`toy_dir`."""
    return load_for_inference(toy_dir)
