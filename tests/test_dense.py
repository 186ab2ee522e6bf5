"""``modules.dense``: x @ kernel + bias over the last axis, for every rank, against numpy."""

import numpy as np
import pytest
import tensorflow as tf

from tf_transformer.nn.modules import dense


@pytest.mark.parametrize("spec", [(None, 8), (None, 1, 8), (None, 2, 3, 8), (None, None, 8)])
@pytest.mark.parametrize("activation", [None, "relu"])
def test_dense_is_a_matrix_product_over_the_last_axis(spec, activation):
    """Every rank gives ``x @ kernel + bias`` (relu'd), as one ``MatMul`` of rows: with only the leading dim
    unknown (a decoding step's (N, 1, C)) the graph computes no shape at all, and never ``tensordot``'s
    plumbing (``Prod``, ``GatherV2``)."""
    rng = np.random.default_rng(0)
    kernel, bias = rng.normal(size=(8, 5)).astype(np.float32), rng.normal(size=5).astype(np.float32)
    x = rng.normal(size=[3 if d is None else d for d in spec]).astype(np.float32)
    traced = tf.function(lambda x: dense(x, tf.constant(kernel), tf.constant(bias), activation),
                         input_signature=[tf.TensorSpec(spec, tf.float32)])
    expected = x @ kernel + bias
    np.testing.assert_allclose(traced(x).numpy(), np.maximum(expected, 0) if activation else expected,
                               rtol=1e-5, atol=1e-5)
    ops = [n.type for n in traced.get_concrete_function().graph.get_operations()]
    assert ops.count("MatMul") == 1 and not {"Prod", "GatherV2"} & set(ops), sorted(ops)
    if all(d is not None for d in spec[1:]):
        assert "Shape" not in ops, sorted(ops)
