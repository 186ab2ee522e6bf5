"""Fixtures shared by several test files: the tiny trained toy model of :mod:`tests.toy_model`."""

import pytest

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
