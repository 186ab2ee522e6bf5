"""precision: auto on a CPU: float32 unless bfloat16 matmuls are measured clearly faster; measured once per
machine (cached), the decision and its figures in one line. The measurement is injected: no timing is asserted."""

import json

import pytest
import tensorflow as tf

from tf_transformer.hparams import load_hparams
from tf_transformer.train import precision
from tf_transformer.train.precision import BF16_MIN_SPEEDUP, MatmulSpeed, auto_cpu_precision, matmul_shape

SHAPE = (1024, 256, 1024)


def fails():
    raise AssertionError("measured where it should not be")


def test_without_bfloat16_instructions_it_is_float32_and_nothing_is_measured(tmp_path):
    choice = auto_cpu_precision(SHAPE, cpu_flags=["fpu", "avx2", "fma"], measure=fails, path=str(tmp_path / "c.json"))
    assert choice.policy == "float32"
    assert choice.reason == ("auto: this CPU has no avx512_bf16 or amx_bf16, flags avx2: bfloat16 would be "
                             "emulated, so it is not measured")
    assert not (tmp_path / "c.json").exists()


@pytest.mark.parametrize("float32, bfloat16, policy", [
    (400.0, 760.0, "mixed_bfloat16"),
    (400.0, 400.0 * BF16_MIN_SPEEDUP, "mixed_bfloat16"),
    (400.0, 400.0 * BF16_MIN_SPEEDUP - 1, "float32"),
    (400.0, 200.0, "float32"),
])
def test_with_bfloat16_instructions_the_faster_measured_precision_wins(tmp_path, float32, bfloat16, policy):
    choice = auto_cpu_precision(SHAPE, cpu_flags=["avx2", "avx512f", "avx512_bf16"],
                                measure=lambda: MatmulSpeed(float32, bfloat16), path=str(tmp_path / "c.json"))
    assert choice.policy == policy
    assert f"bfloat16 matmul {bfloat16 / float32:.2f}x float32 here ({bfloat16:.0f} vs {float32:.0f} GFLOP/s, " \
           f"1024x256x1024, measured in " in choice.reason
    assert "CPU has avx512_bf16" in choice.reason
    assert ("under the 1.2x" in choice.reason) == (policy == "float32")
    assert "\n" not in choice.reason


def test_the_figures_are_measured_once_per_machine_and_shape(tmp_path):
    path, calls = str(tmp_path / "sub" / "precision.json"), []

    def measure():
        calls.append(1)
        return MatmulSpeed(100.0, 190.0)

    first = auto_cpu_precision(SHAPE, cpu_flags=["amx_bf16"], measure=measure, path=path)
    again = auto_cpu_precision(SHAPE, cpu_flags=["amx_bf16"], measure=fails, path=path)
    assert first.policy == again.policy == "mixed_bfloat16"
    assert f"cached in {path}" in first.reason and f"measured earlier, cached in {path}" in again.reason
    auto_cpu_precision((512, 256, 1024), cpu_flags=["amx_bf16"], measure=measure, path=path)  # another shape
    auto_cpu_precision(SHAPE, cpu_flags=["amx_bf16", "avx512_bf16"], measure=measure, path=path)  # other flags
    assert len(calls) == 3
    with open(path) as f:
        keys = sorted(json.load(f))
    assert len(keys) == 3 and all(f"TensorFlow {tf.__version__}" in key for key in keys)


def test_an_unreadable_cache_is_measured_again_and_an_unwritable_one_is_said(tmp_path):
    path = tmp_path / "precision.json"
    path.write_text("{not json")
    choice = auto_cpu_precision(SHAPE, cpu_flags=["amx_bf16"], measure=lambda: MatmulSpeed(100.0, 50.0),
                                path=str(path))
    assert choice.policy == "float32" and "measured in" in choice.reason
    assert list(json.loads(path.read_text()).values()) == [[100.0, 50.0]]
    blocked = tmp_path / "file"
    blocked.write_text("")
    choice = auto_cpu_precision(SHAPE, cpu_flags=["amx_bf16"], measure=lambda: MatmulSpeed(100.0, 300.0),
                                path=str(blocked / "precision.json"))
    assert choice.policy == "mixed_bfloat16" and "not writable" in choice.reason


def test_the_measured_shape_is_the_models_feed_forward_on_one_batch():
    hp = load_hparams("small")
    assert matmul_shape(hp) == (hp.batch_tokens, hp.num_units, hp.d_ff)
    assert matmul_shape(hp.replace(batch_tokens=0, batch_size=8, maxlen=10)) == (80, hp.num_units, hp.d_ff)
    assert matmul_shape(hp.replace(batch_tokens=100000))[0] == precision.MAX_ROWS


def test_the_measurement_gives_both_speeds():
    speed = precision.measure_matmul_speed((32, 16, 8))
    assert speed.float32 > 0 and speed.bfloat16 > 0
    assert speed.speedup == speed.bfloat16 / speed.float32
