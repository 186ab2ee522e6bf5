"""bench/xplane.py's per-type sums of profiled op events (:func:`bench.xplane.op_profile`), shared by
bench/serving_profile.py and bench/step_profile.py."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import xplane  # noqa: E402
from bench.xplane import OpEvent  # noqa: E402


def test_op_types_are_ranked_by_self_time_with_shares_per_batch_and_the_matmuls_share():
    events = ([OpEvent("a/MatMul", "_FusedMatMul", 0.003)] * 4 + [OpEvent("b", "GatherV2", 0.001)] * 6
              + [OpEvent("c", "BatchMatMulV3", 0.002)] * 2)  # 12 + 6 + 4 = 22 ms over 2 batches
    profile = xplane.op_profile(events, batches=2)
    assert [row.type for row in profile.types] == ["_FusedMatMul", "GatherV2", "BatchMatMulV3"]
    fused = profile.types[0]
    assert fused.share == pytest.approx(12 / 22) and fused.ms_per_batch == pytest.approx(6.0)
    assert fused.calls_per_batch == 2 and fused.us_per_call == pytest.approx(3000.0)
    assert profile.matmul_share == pytest.approx(16 / 22)
    assert profile.op_ms_per_batch == pytest.approx(11.0)
    assert sum(row.share for row in profile.types) == pytest.approx(1.0)
