"""Builds ``tf_translate`` (``tf_translate.c`` beside this file) with the system's C compiler against
the TensorFlow C API that the installed TensorFlow wheel ships: its headers
(``tf.sysconfig.get_include()``) and ``libtensorflow_cc.so.2`` / ``libtensorflow_framework.so.2``
(``tf.sysconfig.get_lib()``, also the program's run path, so it runs without ``LD_LIBRARY_PATH``).

    python tools/c_loader/build.py                 # builds tools/c_loader/tf_translate
    python tools/c_loader/build.py -o /tmp/tf_translate

It prints the program's path, then the command that translates with it: the
op libraries are TensorFlow Text's (``tensorflow_text/python/ops``), which
register the SentencePiece ops that an export with a SentencePiece tokenizer uses.
The test (tests/test_c_loader.py) and the benchmark (bench/c_loader.py) build with
:func:`build` too. The compiler: ``$CC``, else ``cc``, ``gcc`` or ``clang``.
"""

import argparse
import importlib.util
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.join(HERE, "tf_translate.c")
PROGRAM = os.path.join(HERE, "tf_translate")


def compiler():
    """The C compiler's path, or None."""
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def tensorflow_dirs():
    """(lib dir, include dir) of the installed TensorFlow wheel."""
    import tensorflow as tf

    return tf.sysconfig.get_lib(), tf.sysconfig.get_include()


def op_library_dir():
    """The folder of TensorFlow Text's op libraries (``--op-library`` of tf_translate)."""
    spec = importlib.util.find_spec("tensorflow_text")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("tensorflow_text is not installed")
    return os.path.join(spec.submodule_search_locations[0], "python", "ops")


def build_command(output, cc=None):
    """The compiler's argv that builds the program into ``output``."""
    lib, include = tensorflow_dirs()
    # gold links against the 1 GB libtensorflow_cc.so.2 in a quarter of the time of the default ld (bfd).
    linker = ["-fuse-ld=gold"] if shutil.which("ld.gold") else []
    return [cc or compiler(), "-std=c11", "-O2", "-Wall", "-Wextra", "-I", include, SOURCE, "-o", output, *linker,
            "-L", lib, "-l:libtensorflow_cc.so.2", "-l:libtensorflow_framework.so.2", f"-Wl,-rpath,{lib}"]


def build(output=PROGRAM, cc=None):
    """Compiles the program into ``output`` (its path returned); raises RuntimeError with the compiler's
    messages when that fails, or when there is no C compiler."""
    cc = cc or compiler()
    if cc is None:
        raise RuntimeError("no C compiler found (set CC, or install cc, gcc or clang)")
    result = subprocess.run(build_command(output, cc), capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"{cc} failed:\n{result.stderr}")
    return output


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-o", "--output", default=PROGRAM, help="the program's path (default: %(default)s)")
    args = parser.parse_args(argv)
    try:
        path = build(os.path.abspath(args.output))
    except RuntimeError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(path)
    print(f"{path} --op-library {op_library_dir()} EXPORT_DIR/VERSION 'Guten Morgen.'")
    return 0


if __name__ == "__main__":
    sys.exit(main())
