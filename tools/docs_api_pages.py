"""Write one API reference page per public module of tf_transformer (docs/api/) and its nav in mkdocs.yml.

Run it after adding, moving or removing a module (``tests/test_docs.py`` fails until the pages match)::

    python tools/docs_api_pages.py

A module is public when no part of its dotted name starts with ``_``. The list comes from
:func:`pkgutil.iter_modules` over the package's folders, so nothing is imported.
"""

import pathlib
import pkgutil
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
API = ROOT / "docs" / "api"
BEGIN, END = "# api-nav-begin", "# api-nav-end"


def public_modules(root=ROOT):
    """Every public module and package of tf_transformer, dotted, sorted; read from the files only."""
    found = ["tf_transformer"]

    def walk(path, prefix):
        for info in pkgutil.iter_modules([str(path)]):
            if info.name.startswith("_"):
                continue
            name = f"{prefix}.{info.name}"
            found.append(name)
            if info.ispkg:
                walk(path / info.name, name)

    walk(root / "tf_transformer", "tf_transformer")
    return sorted(found)


def page_path(module):
    """``docs/api/<dotted name>.md``."""
    return API / f"{module}.md"


def page_text(module):
    return f"# `{module}`\n\n::: {module}\n"


def nav_lines(modules):
    lines = [f"      - {m}: api/{m}.md" for m in modules]
    return ["  - API reference:", "      - Overview: api/index.md", *lines]


def main():
    modules = public_modules()
    API.mkdir(parents=True, exist_ok=True)
    for old in API.glob("tf_transformer*.md"):
        if old.stem not in modules:
            old.unlink()
    for module in modules:
        page_path(module).write_text(page_text(module))
    index = ["# API reference", "",
             "One page per public module, generated from the docstrings by mkdocstrings (griffe reads the",
             "source; nothing is imported). The package's overview is [`tf_transformer`](tf_transformer.md).", ""]
    index += [f"* [`{m}`]({m}.md)" for m in modules]
    (API / "index.md").write_text("\n".join(index) + "\n")
    config = ROOT / "mkdocs.yml"
    text = config.read_text()
    block = "\n".join([BEGIN, *nav_lines(modules), END])
    text = re.sub(re.escape(BEGIN) + ".*?" + re.escape(END), lambda _: block, text, flags=re.S)
    config.write_text(text)
    print(f"{len(modules)} API pages in {API.relative_to(ROOT)}; nav written to mkdocs.yml")


if __name__ == "__main__":
    main()
