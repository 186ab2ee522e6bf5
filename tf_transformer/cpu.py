"""What the CPU can do, read from /proc/cpuinfo without importing TensorFlow (the benchmarks' parent
process reports it too)."""


def cpu_flags_of(cpuinfo="/proc/cpuinfo"):
    """The CPU feature flags of ``cpuinfo`` (empty where there is no such file)."""
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.partition(":")[2].split())
    except OSError:
        pass
    return set()


# The CPU features that decide float32 or bfloat16 speed, reported with every benchmark figure.
SPEED_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")


def cpu_speed_flags(cpu_flags=None):
    """Which of :data:`SPEED_FLAGS` the CPU has, e.g. ``"avx2"`` or ``"avx2 avx512f avx512_bf16"``
    (``"none"`` without any); ``cpu_flags`` defaults to /proc/cpuinfo's."""
    flags = cpu_flags_of() if cpu_flags is None else set(cpu_flags)
    return " ".join(flag for flag in SPEED_FLAGS if flag in flags) or "none"
