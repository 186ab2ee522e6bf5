"""The documentation: the MkDocs site builds strictly, every public module has an API page, every
relative link and anchor of README.md, CHANGELOG.md and docs/ resolves, and the README stays short.

Nothing here imports TensorFlow: mkdocstrings reads the package's source with griffe, and the module
list comes from pkgutil over the files.
"""

import os
import pathlib
import pkgutil
import re
import subprocess
import sys
import unicodedata
import urllib.parse

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
README_MAX_LINES = 250


# ---------------------------------------------------------------------------------------------
# Markdown: links and headings, outside code


def _outside_fences(text):
    """``(line number, line)`` of the lines of ``text`` outside fenced code blocks."""
    fence = None
    for number, line in enumerate(text.split("\n"), 1):
        stripped = line.lstrip()
        match = re.match(r"(`{3,}|~{3,})", stripped)
        if fence is None and match:
            fence = match.group(1)
            continue
        if fence is not None:
            if stripped.startswith(fence) and stripped.strip() == fence[0] * len(stripped.strip()):
                fence = None
            continue
        yield number, line


def _prose_lines(text):
    """The lines of ``text`` outside fenced code blocks, with inline code spans blanked."""
    for number, line in _outside_fences(text):
        yield number, re.sub(r"(`+)(?:(?!\1).)+?\1", lambda m: " " * len(m.group(0)), line)


LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")


def links(path):
    """``(line number, target)`` of every inline link and image of a Markdown file, outside code."""
    found = []
    for number, line in _prose_lines(path.read_text(encoding="utf-8")):
        found += [(number, m.group(1)) for m in LINK.finditer(line)]
        found += [(number, m.group(1)) for m in re.finditer(r"<(https?://[^>\s]+)>", line)]
    return found


def headings(path):
    """The text of every ATX heading of a Markdown file, outside code, inline Markdown stripped."""
    texts = []
    for _, line in _outside_fences(path.read_text(encoding="utf-8")):
        match = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if match:
            text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", match.group(1))  # links: their text
            texts.append(text.replace("`", "").replace("**", ""))
    return texts


def github_slug(text):
    """The anchor GitHub gives a heading: lower case, punctuation but ``-`` and ``_`` dropped, spaces to ``-``."""
    text = text.strip().lower()
    text = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LNM")
    return text.replace(" ", "-")


def mkdocs_slug(text):
    """The anchor MkDocs (Python-Markdown's toc extension) gives a heading."""
    from markdown.extensions.toc import slugify

    return slugify(text, "-")


def anchors(path, slug, duplicate):
    """Every anchor of a Markdown file's headings, repeated headings numbered as the renderer does."""
    seen, result = {}, set()
    for text in headings(path):
        anchor = slug(text)
        if anchor in seen:
            seen[anchor] += 1
            anchor = duplicate(anchor, seen[anchor])
        else:
            seen[anchor] = 0
        result.add(anchor)
    return result


def github_anchors(path):
    return anchors(path, github_slug, lambda a, n: f"{a}-{n}")


def mkdocs_anchors(path):
    return anchors(path, mkdocs_slug, lambda a, n: f"{a}_{n}")


def checked_files():
    """README.md, CHANGELOG.md and every Markdown page of docs/."""
    return [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted(DOCS.rglob("*.md"))]


def link_problems(path):
    """What is wrong with the links of one Markdown file, one line each (empty when all resolve).

    Relative targets must exist; an ``#anchor`` must be a heading of its target, with GitHub's
    anchors for links from README.md and CHANGELOG.md (read on GitHub) and MkDocs' for the pages
    of docs/ (read on the site). External ``http(s)`` links are only checked for their syntax.
    """
    on_github = path.parent == ROOT
    anchors_of = github_anchors if on_github else mkdocs_anchors
    problems = []
    where = path.relative_to(ROOT)
    for number, target in links(path):
        at = f"{where}:{number}: {target}"
        parts = urllib.parse.urlsplit(target)
        if parts.scheme in ("http", "https"):
            if not parts.netloc or not re.fullmatch(r"[\w.-]+(:\d+)?", parts.netloc):
                problems.append(f"{at}: not a valid URL")
            continue
        if parts.scheme == "mailto":
            continue
        if parts.scheme or parts.netloc:
            problems.append(f"{at}: only relative links and http(s) URLs are expected")
            continue
        if target.startswith("/"):
            problems.append(f"{at}: an absolute path breaks outside this checkout")
            continue
        file = (path.parent / urllib.parse.unquote(parts.path)).resolve() if parts.path else path
        if not file.exists():
            problems.append(f"{at}: no such file {file.relative_to(ROOT) if ROOT in file.parents else file}")
            continue
        if parts.fragment:
            if file.suffix != ".md":
                problems.append(f"{at}: an anchor into a file that is not Markdown")
            elif parts.fragment not in anchors_of(file):
                problems.append(f"{at}: no heading of {file.relative_to(ROOT)} has the anchor #{parts.fragment}")
    return problems


# ---------------------------------------------------------------------------------------------
# The module list, from the files


def public_modules():
    """Every module and package of tf_transformer no part of whose name starts with ``_``."""
    found = ["tf_transformer"]

    def walk(folder, prefix):
        for info in pkgutil.iter_modules([str(folder)]):
            if not info.name.startswith("_"):
                found.append(f"{prefix}.{info.name}")
                if info.ispkg:
                    walk(folder / info.name, f"{prefix}.{info.name}")

    walk(ROOT / "tf_transformer", "tf_transformer")
    return sorted(found)


# ---------------------------------------------------------------------------------------------
# Tests


@pytest.mark.slow
def test_the_documentation_builds_with_mkdocs_strict(tmp_path):
    """``mkdocs build --strict``: a broken link or anchor, a missing page or an unknown API reference fails.

    Run under ``python -X importtime`` to show that the build imports no TensorFlow.
    """
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1", TF_CPP_MIN_LOG_LEVEL="2")
    site = tmp_path / "site"
    # cwd is the temporary folder: mkdocs-jupyter keeps its cache under the working directory.
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "mkdocs", "build", "--strict", "--config-file", str(ROOT / "mkdocs.yml"),
         "--site-dir", str(site)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )
    warnings = [line for line in result.stderr.splitlines() if line.startswith(("WARNING", "ERROR"))]
    assert result.returncode == 0, "mkdocs build --strict failed:\n" + "\n".join(warnings or [result.stderr[-3000:]])
    for page in ["index.html", "getting-started/index.html", "walkthrough/index.html",
                 "api/tf_transformer.nn.modules/index.html"]:
        assert (site / page).is_file(), page
    # griffe read the source: building the site imported neither TensorFlow nor Keras.
    imported = re.findall(r"^import time:.*\|\s*(tensorflow|keras)$", result.stderr, re.M)
    assert not imported, f"building the documentation imported {sorted(set(imported))}"
    # The API page holds the docstrings griffe read: the blog's layer under its name.
    assert "MultiheadAttention" in (site / "api/tf_transformer.nn.modules/index.html").read_text(encoding="utf-8")


def test_every_public_module_has_an_api_page_in_the_navigation():
    modules = public_modules()
    assert "tf_transformer.nn.modules" in modules and "tf_transformer.cli.train" in modules
    config = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    hint = " (python tools/docs_api_pages.py writes the pages and the navigation)"
    for module in modules:
        page = DOCS / "api" / f"{module}.md"
        assert page.is_file(), f"no API page {page.relative_to(ROOT)}{hint}"
        assert re.search(rf"^::: {re.escape(module)}\s*$", page.read_text(encoding="utf-8"), re.M), (
            f"{page.relative_to(ROOT)} does not render ::: {module}{hint}")
        assert f"api/{module}.md" in config, f"mkdocs.yml's nav has no api/{module}.md{hint}"
    stale = sorted(p.stem for p in (DOCS / "api").glob("tf_transformer*.md") if p.stem not in modules)
    assert not stale, f"API pages of modules that do not exist: {stale}{hint}"


def test_every_relative_link_and_anchor_resolves():
    files = checked_files()
    assert len(files) > 10 and all(f.exists() for f in files)
    assert sum(len(links(f)) for f in files) > 50  # the parser finds links at all
    problems = [problem for f in files for problem in link_problems(f)]
    assert not problems, "broken links:\n" + "\n".join(problems)


def test_the_link_check_finds_broken_files_anchors_and_urls(tmp_path, monkeypatch):
    """The checker itself: each kind of broken link is reported, the good ones are not."""
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "page.md").write_text(
        "# Page\n\n## `precision: auto` on a CPU\n\n## Real text (`bench/real_text.py`)\n\n## Größe - Test\n", encoding="utf-8")
    (tmp_path / "README.md").write_text(
        "# Title\n\n## A B\n\n"
        "[ok](docs/page.md#precision-auto-on-a-cpu) [ok](#a-b) [ok](https://example.org/x)\n"
        "[gh](docs/page.md#real-text-benchreal_textpy) [gh](docs/page.md#größe---test)\n"
        "[file](docs/missing.md) [anchor](docs/page.md#nowhere) [url](https:///no-host) [self](#title-2)\n"
        "```\n[in code](docs/missing.md)\n```\n`[in a span](docs/missing.md)`\n")
    problems = link_problems(tmp_path / "README.md")
    assert len(problems) == 4, problems
    assert "no such file docs/missing.md" in problems[0]
    assert "#nowhere" in problems[1] and "not a valid URL" in problems[2] and "#title-2" in problems[3]
    # The site's pages are read with Python-Markdown's anchors: ASCII only, runs of spaces and
    # hyphens made one hyphen; GitHub keeps the letters and every hyphen.
    (tmp_path / "docs" / "other.md").write_text(
        "[x](page.md#real-text-benchreal_textpy) [y](page.md#groe-test) [z](page.md#größe---test)\n", encoding="utf-8")
    problems = link_problems(tmp_path / "docs" / "other.md")
    assert len(problems) == 1 and "#größe---test" in problems[0], problems


def test_the_readme_is_short_and_names_its_commands():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    lines = text.count("\n") + (not text.endswith("\n"))
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; at most {README_MAX_LINES}: move detail to docs/"
    assert 'pip install -e ".[test]" && python -m pytest -q -n auto --dist loadfile' in text
    assert 'pip install -e ".[docs]" && mkdocs serve' in text
    assert "python3 -m venv .venv && . .venv/bin/activate && pip install -e . && python train.py" in text


def test_the_docstrings_rest_reads_as_markdown():
    """tools/griffe_rst.py: roles as inline code, ``::`` blocks fenced, the rest untouched."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("griffe_rst", ROOT / "tools" / "griffe_rst.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    text = ("See :class:`~tf_transformer.nn.model.Transformer` and :func:`tf_transformer.files.write_atomic`.\n\n"
            "Usage::\n\n  python -m x [--units 512]\n  python -m y\n\nAfter.\n\n  Indented, no block.")
    assert module.markdown_from_rst(text) == (
        "See `Transformer` and `tf_transformer.files.write_atomic`.\n\n"
        "Usage:\n\n```text\npython -m x [--units 512]\npython -m y\n```\n\n\nAfter.\n\n  Indented, no block.")
