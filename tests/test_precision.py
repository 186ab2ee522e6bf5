"""precision: auto on a CPU: float32 unless the whole training step is measured clearly faster in mixed bfloat16;
measured once per machine and model (cached), the decision and its figures in one line. The measurement is injected:
no timing is asserted."""

import json

import numpy as np
import pytest
import tensorflow as tf

from tf_transformer.hparams import load_hparams
from tf_transformer.train import precision
from tf_transformer.train.precision import BF16_MIN_SPEEDUP, StepSpeed, auto_cpu_precision, step_shape
from tf_transformer.train.step_speed import measure_step_speed, synthetic_batch

SHAPE = step_shape(load_hparams("debian"))


def fails():
    raise AssertionError("measured where it should not be")


def test_without_bfloat16_instructions_it_is_float32_and_nothing_is_measured(tmp_path):
    choice = auto_cpu_precision(SHAPE, fails, cpu_flags=["fpu", "avx2", "fma"], path=str(tmp_path / "c.json"))
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
                                measure=lambda: StepSpeed(float32, bfloat16), path=str(tmp_path / "c.json"))
    assert choice.policy == policy
    assert f"the training step in mixed bfloat16 {bfloat16 / float32:.2f}x float32 here ({bfloat16:.0f} vs " \
           f"{float32:.0f} target tokens/s, {SHAPE}, measured in " in choice.reason
    assert SHAPE.startswith("1+1 blocks x 256 units, 4 heads, d_ff 1024, vocab ")
    assert "CPU has avx512_bf16" in choice.reason
    assert (f"under the {BF16_MIN_SPEEDUP}x" in choice.reason) == (policy == "float32")
    assert "\n" not in choice.reason


def test_the_figures_are_measured_once_per_machine_and_model(tmp_path):
    path, calls = str(tmp_path / "sub" / "precision.json"), []

    def measure():
        calls.append(1)
        return StepSpeed(100.0, 190.0)

    first = auto_cpu_precision(SHAPE, cpu_flags=["amx_bf16"], measure=measure, path=path)
    again = auto_cpu_precision(SHAPE, cpu_flags=["amx_bf16"], measure=fails, path=path)
    assert first.policy == again.policy == "mixed_bfloat16"
    assert f"cached in {path}" in first.reason and f"measured earlier, cached in {path}" in again.reason
    auto_cpu_precision(step_shape(load_hparams("small")), measure, cpu_flags=["amx_bf16"], path=path)  # another model
    auto_cpu_precision(SHAPE, cpu_flags=["amx_bf16", "avx512_bf16"], measure=measure, path=path)  # other flags
    assert len(calls) == 3
    with open(path) as f:
        keys = sorted(json.load(f))
    assert len(keys) == 3 and all(f"TensorFlow {tf.__version__}" in key for key in keys)


def test_an_unreadable_cache_is_measured_again_and_an_unwritable_one_is_said(tmp_path):
    path = tmp_path / "precision.json"
    path.write_text("{not json")
    choice = auto_cpu_precision(SHAPE, cpu_flags=["amx_bf16"], measure=lambda: StepSpeed(100.0, 50.0),
                                path=str(path))
    assert choice.policy == "float32" and "measured in" in choice.reason
    assert list(json.loads(path.read_text()).values()) == [[100.0, 50.0]]
    blocked = tmp_path / "file"
    blocked.write_text("")
    choice = auto_cpu_precision(SHAPE, cpu_flags=["amx_bf16"], measure=lambda: StepSpeed(100.0, 300.0),
                                path=str(blocked / "precision.json"))
    assert choice.policy == "mixed_bfloat16" and "not writable" in choice.reason


def test_the_key_names_every_size_the_step_depends_on():
    hp = load_hparams("debian")
    shapes = {step_shape(hp.replace(**change)) for change in (
        {}, {"num_blocks": 2}, {"num_units": 512}, {"num_heads": 8}, {"d_ff": 2048}, {"vocab_size": 8000},
        {"batch_tokens": 2048}, {"batch_tokens": 0, "batch_size": 32})}
    assert len(shapes) == 8
    assert step_shape(hp.replace(learning_rate=1.0, seed=7)) == step_shape(hp)  # not a size: same figures


def test_the_synthetic_batch_fills_the_run_s_batch_with_real_ids():
    hp = load_hparams("toy").replace(batch_tokens=100, maxlen=30, vocab_size=50)
    x, y = synthetic_batch(hp)
    assert x.shape == y.shape == (4, 24) and x.dtype == np.int32  # 100 tokens // 24 a sentence
    assert x.min() >= 4 and y.max() < 50 and not np.array_equal(x, y)
    x, _ = synthetic_batch(hp.replace(batch_tokens=0, batch_size=3, maxlen=10))
    assert x.shape == (3, 10)


def test_the_measurement_times_the_trainer_s_step_in_both_precisions():
    hp = load_hparams("toy").replace(batch_tokens=0, batch_size=2, maxlen=8, vocab_size=20)
    speed = measure_step_speed(hp, steps=1, turns=1, warmup=1)
    assert speed.float32 > 0 and speed.bfloat16 > 0
    assert speed.speedup == speed.bfloat16 / speed.float32
