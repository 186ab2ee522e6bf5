"""docs/walkthrough.ipynb, the blog as a notebook: it runs without a cell error and shows what it claims.

The notebook is executed again (nbclient, kernel ``python3`` of this interpreter, cwd = the repository
root) into a copy; the stored file is not touched (``python tools/build_walkthrough.py`` rewrites it).
"""

import os
import re
import sys

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOK = os.path.join(ROOT, "docs", "walkthrough.ipynb")
sys.path.insert(0, os.path.join(ROOT, "tools"))

import build_walkthrough  # noqa: E402
from tf_transformer.quiet import NOTICES  # noqa: E402


def _text(notebook):
    """Every stream and text/plain output of the code cells, joined."""
    parts = []
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            if output.output_type == "stream":
                parts.append(output.text)
            elif "text/plain" in output.get("data", {}):
                parts.append(output.data["text/plain"])
    return "\n".join(parts)


def _images(notebook):
    return [output.data["image/png"] for cell in notebook.cells for output in cell.get("outputs", [])
            if "image/png" in output.get("data", {})]


def _number(pattern, text):
    match = re.search(pattern, text)
    assert match, f"no {pattern!r} in the notebook's outputs"
    return float(match.group(1))


def check_outputs(notebook):
    """The behaviour the notebook demonstrates, read back from its outputs."""
    errors = [output for cell in notebook.cells for output in cell.get("outputs", [])
              if output.output_type == "error"]
    assert not errors, errors[0].get("ename", "") + ": " + errors[0].get("evalue", "")
    text = _text(notebook)
    # the kernel starts quietly, as the commands do: no TensorFlow start-up notice among the outputs
    noise = [line for line in text.splitlines() if NOTICES.search(line.encode())]
    assert not noise, f"TensorFlow's start-up notice in the notebook: {noise[0]}"
    # masks: pads get no attention, the causal mask hides the future, Keras' layer with the
    # tutorial's inverted mask does not
    assert ("padded keys get weight 0: True | padded queries' rows are 0: True | "
            "nothing above the diagonal: True") in text
    assert "causal check (no dependence of position <= 2 on later tokens): True" in text
    assert _number(r"True = attend mask: max \|change\| at positions <= 2: (\S+)", text) == 0.0
    assert _number(r"inverted mask: max \|change\| at positions <= 2: (\S+)", text) > 1e-3
    # heads: our split is the blog's split/concat
    assert "equals the blog's concat(split(x, h, axis=2), axis=0): True" in text
    assert "inverse of split_heads: True" in text
    # the toy corpus: converged, translated exactly, BLEU 100
    assert _number(r"final training accuracy: (\S+)", text) == 1.0
    assert _number(r"toy dev BLEU: (\S+)", text) == 100.0
    assert "[2] step 4: <S> i want a orange juice" in text
    # the blog switch: its masks miss every pad, so padding moves the real tokens' outputs
    default, blog = text.split("[default] mask_source=embedding")[1].split("[blog] mask_source=inputs")
    padded = r"padded to 9 vs unpadded: max \|diff\| = (\S+)"
    assert _number(padded, default) < 1e-4 < 1e-2 < _number(padded, blog)
    on_pads = r"attention on pads \(block 1, mean over heads\): (\S+)"
    assert _number(on_pads, default) == 0.0 and _number(on_pads, blog) > 0.05
    assert "blog rule sign(abs(sum(x))): [0. 1.] | our rule sign(sum(abs(x))): [1. 1.]" in text
    assert "positions 10-13 repeat row 9: True" in text
    # pictures: the positional encoding and the attention, kept small
    images = _images(notebook)
    assert len(images) == 2 and all(100 < len(image) < 300_000 for image in images)


def test_stored_notebook_has_its_outputs():
    """The committed notebook holds the outputs a docs site shows, the same checks passing, and stays small."""
    assert os.path.getsize(NOTEBOOK) < 1_000_000
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(notebook)
    check_outputs(notebook)
    # it is what the builder writes, cell for cell
    assert [cell.source for cell in notebook.cells] == [cell.source for cell in build_walkthrough.build().cells]


@pytest.mark.slow
def test_notebook_executes(tmp_path):
    """A kernel, TensorFlow and 60 toy training steps: 70 s on 2 cores shared with other jobs (load 10)."""
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    for cell in notebook.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    build_walkthrough.execute(notebook, timeout=240)
    nbformat.write(notebook, os.fspath(tmp_path / "walkthrough.ipynb"))
    check_outputs(notebook)


def test_check_outputs_can_fail():
    """A notebook whose toy model did not converge, or that printed an error, fails the checks."""
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            if output.output_type == "stream":
                output.text = output.text.replace("toy dev BLEU: 100.0", "toy dev BLEU: 42.7")
    with pytest.raises(AssertionError):
        check_outputs(notebook)
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    notebook.cells[-1].outputs.append(nbformat.v4.new_output("error", ename="ValueError", evalue="boom",
                                                             traceback=[]))
    with pytest.raises(AssertionError, match="boom"):
        check_outputs(notebook)
