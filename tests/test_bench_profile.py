"""bench/step_profile.py: the op categories cover the profiled op time, ops are counted, and the table maps known op
types (and name scopes) to the right categories."""

import os
import sys

import pytest
import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import step_profile as profile  # noqa: E402
from bench import xplane  # noqa: E402
from bench.train_batches import BatchSet  # noqa: E402
from bench.train_contenders import Contender  # noqa: E402
from tests.helpers import tiny_batches  # noqa: E402
from tf_transformer.hparams import load_hparams  # noqa: E402

TINY = load_hparams("small").replace(num_blocks=1, num_units=16, num_heads=2, d_ff=32, precision="float32",
                                     lr_schedule="constant")

# (node name, op type, category), written out independently of bench/profile.py's tables.
KNOWN = [
    ("model/encoder_block_0/self_attention/MatMul", "MatMul", "matmuls"),
    ("model/encoder_block_0/self_attention/BiasAdd", "_MklNativeFusedMatMul", "matmuls"),
    ("gradient_tape/model/decoder_block_0/feedforward/MatMul_1", "BatchMatMulV2", "matmuls"),
    ("model/dense/Einsum", "Einsum", "matmuls"),
    ("SoftmaxCrossEntropyWithLogits", "SoftmaxCrossEntropyWithLogits", "loss"),
    ("OneHot", "OneHot", "loss"),
    ("model/encoder_block_0/self_attention/Softmax", "Softmax", "softmax and masks"),
    ("model/encoder_block_0/self_attention/SelectV2", "SelectV2", "softmax and masks"),
    ("model/encoder_block_0/self_attention/layer_norm/Mean", "Mean", "layer norm"),
    ("gradient_tape/model/encoder_block_0/self_attention/layer_norm/mul/Mul", "Mul", "layer norm"),
    ("model/decoder_block_0/feedforward/Rsqrt", "Rsqrt", "layer norm"),
    ("adam/Cast", "Cast", "casts"),
    ("model/encoder_block_0/self_attention/Cast", "Cast", "casts"),
    ("model/encoder_block_0/feedforward/Relu", "Relu", "other element-wise and reductions"),
    ("model/add", "AddV2", "other element-wise and reductions"),
    ("gradient_tape/model/logits/BiasAdd/BiasAddGrad", "BiasAddGrad", "other element-wise and reductions"),
    ("model/dropout/stateless_random_uniform/StatelessRandomUniformV2", "StatelessRandomUniformV2",
     "dropout (random numbers, masks)"),
    ("model/encoder_block_0/self_attention/dropout_1/Mul", "Mul", "dropout (random numbers, masks)"),
    ("model/encoder_block_0/self_attention/ScatterNd", "ScatterNd", "gather/scatter (packing, embeddings)"),
    ("model/GatherNd", "GatherNd", "gather/scatter (packing, embeddings)"),
    ("gradient_tape/model/enc_embedding/UnsortedSegmentSum", "UnsortedSegmentSum",
     "gather/scatter (packing, embeddings)"),
    ("model/encoder_block_0/self_attention/transpose", "Transpose", "transposes, reshapes, concat"),
    ("model/encoder_block_0/self_attention/concat", "ConcatV2", "transposes, reshapes, concat"),
    ("model/encoder_block_0/self_attention/split", "Split", "transposes, reshapes, concat"),
    ("adam/ResourceApplyAdam", "ResourceApplyAdam", "optimizer update"),
    ("adam/Mul_3", "Mul", "optimizer update"),
    ("Adam/Pow", "Pow", "optimizer update"),
    ("adam/AssignAddVariableOp", "AssignAddVariableOp", "optimizer update"),
    ("model/Range", "Range", "other"),
    ("some/NewOpNobodyKnows", "NewOpNobodyKnows", "other"),
]


@pytest.mark.parametrize("name,op_type,expected", KNOWN)
def test_known_op_types_fall_in_their_category(name, op_type, expected):
    assert profile.category(name, op_type) == expected


def tiny_set(count=4, vocab=40):
    return BatchSet("real 1024", tiny_batches(count, vocab), vocab, "tests", 1024)


def test_the_categories_cover_the_op_time_of_a_profiled_step(tmp_path):
    contender = Contender("ours", "small", TINY, 2, tiny_set())
    summary = profile.profile_contender(contender, 2, str(tmp_path))
    shares = [summary["categories"][key]["share"] for key in profile.CATEGORIES]
    assert sum(shares) == pytest.approx(1.0)
    assert summary["categories"]["matmuls"]["share"] > 0
    assert summary["categories"]["optimizer update"]["ops_per_step"] > 0
    assert summary["ops_per_step"] > 100  # a training step runs hundreds of ops, even at toy dims
    assert sum(summary["categories"][key]["ops_per_step"] for key in profile.CATEGORIES) == \
        pytest.approx(summary["ops_per_step"])
    assert summary["steps"] == 2 and summary["target_tokens_per_sec"] > 0
    table = profile.table([{"contender": "ours", "precision": "float32", **summary}])
    assert all(key in table for key in profile.CATEGORIES)


def test_written_bytes_leave_out_matmuls_and_aliases():
    float32, int64 = 1, 9  # DataType enums
    traces = [("a/MatMul", "MatMul", [0, float32, 2, 100, 10, 10]),
              ("a/Mul", "Mul", [1, float32, 2, 100, 10, 10]),
              ("a/Reshape", "Reshape", [2, float32, 1, 100, 100]),
              ("a/Where", "Where", [3, int64, 2, 6, 3, 2]),
              ("a/Split", "Split", [4, float32, 2, 50, 10, 5]),
              ("a/Split", "Split", [5, float32, 2, 50, 10, 5])]  # a second output of the same op
    assert profile.written_bytes(traces) == (5, 100 * 4 + 6 * 8 + 2 * 50 * 4)


def test_written_bytes_count_a_compiled_function_as_one_op_writing_its_outputs():
    traces = [("a/Mul", "Mul", [1, 1, 2, 100, 10, 10])]
    assert profile.written_bytes(traces, {"__inference_update_1": 0, "__inference_loss_2": 8}) == (3, 408)


@pytest.mark.parametrize("jit", [True, False])
def test_a_compiled_function_counts_as_one_op_writing_its_outputs(tmp_path, jit):
    inner = tf.function(lambda a: tf.exp(a * 2.0) + 1.0, jit_compile=jit)  # three ops inside

    def build():
        return tf.function(lambda x, y: inner(tf.cast(x, tf.float32)) * y)

    x, y = tf.ones([10, 10], tf.int32), tf.ones([10, 10])
    ops, written = profile.traced_bytes(build, x, y, str(tmp_path / "dump"))
    # compiled: Cast, the function, Mul, each writing 100 float32; else Cast, Mul, Exp, AddV2, Mul (the two Muls
    # share a name: one op)
    assert (ops, written) == ((3, 3 * 400) if jit else (4, 5 * 400))


def test_xla_kernels_count_as_ops_of_their_module_s_category(tmp_path):
    variable = tf.Variable(tf.ones([64]))

    def _optimizer_update(g):
        variable.assign_sub(0.1 * tf.exp(g) * g)
        return tf.reduce_sum(variable)

    compiled = tf.function(_optimizer_update, jit_compile=True)
    compiled(tf.ones([64]))
    events, _ = profile.profile_steps(lambda x, y: compiled(x), [(tf.ones([64]), None)] * 2, str(tmp_path))
    kernels = [e for e in events if e.type == xplane.XLA_KERNEL]
    assert kernels and all("optimizer_update" in e.name for e in kernels)
    assert {profile.category(e.name, e.type) for e in kernels} == {profile.OPTIMIZER}
    assert sum(e.seconds for e in kernels) > 0
