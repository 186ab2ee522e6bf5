"""test_train_resume.py's interrupted and resumed runs on the streamed input pipeline
(tf_transformer/data/shards.py, 5 shards of 8 pairs), in a file of their own so that the test
processes run the two pipelines' runs side by side."""

import pytest

from test_train_resume import corpus_dir, interrupted, uninterrupted  # noqa: F401 (fixtures)
from test_train_resume import (  # noqa: F401 (the tests, collected here with this file's pipeline)
    test_a_run_killed_anywhere_resumes_to_the_weights_of_an_uninterrupted_one,
    test_sigterm_saves_the_current_step_and_exits_143)


@pytest.fixture(scope="module")
def pipeline():
    return "stream"
