"""test_train_resume.py's resume test on the streamed input pipeline (tf_transformer/data/shards.py, 5 shards of 8
pairs), interrupted by SIGKILL and a damaged checkpoint, in a file of its own so that the test processes run the two
pipelines' runs side by side."""

import pytest

from test_train_resume import corpus_dir, interrupted, uninterrupted  # noqa: F401 (fixtures)
from test_train_resume import (  # noqa: F401 (the test, collected here with this file's pipeline)
    test_an_interrupted_run_resumes_to_the_weights_of_an_uninterrupted_one)


@pytest.fixture(scope="module")
def pipeline():
    return "stream"


@pytest.fixture(scope="module")
def interruption():
    return "sigkill"
