"""What the CPU can do, read from /proc/cpuinfo without importing TensorFlow (the benchmarks' parent
process reports it too)."""

import platform


def _cpuinfo_field(name, cpuinfo="/proc/cpuinfo"):
    """The value of the first ``name : value`` line of ``cpuinfo`` (None where there is none)."""
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith(name):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return None


def cpu_flags_of(cpuinfo="/proc/cpuinfo"):
    """The CPU feature flags of ``cpuinfo`` (empty where there is no such file)."""
    return set((_cpuinfo_field("flags", cpuinfo) or "").split())


def cpu_model(cpuinfo="/proc/cpuinfo"):
    """The CPU's model name, e.g. ``"AMD EPYC"`` (the platform's machine name where cpuinfo has none)."""
    return _cpuinfo_field("model name", cpuinfo) or platform.processor() or platform.machine()


# The CPU features that decide float32 or bfloat16 speed, reported with every benchmark figure.
SPEED_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")


def cpu_speed_flags(cpu_flags=None):
    """Which of :data:`SPEED_FLAGS` the CPU has, e.g. ``"avx2"`` or ``"avx2 avx512f avx512_bf16"``
    (``"none"`` without any); ``cpu_flags`` defaults to /proc/cpuinfo's."""
    flags = cpu_flags_of() if cpu_flags is None else set(cpu_flags)
    return " ".join(flag for flag in SPEED_FLAGS if flag in flags) or "none"
