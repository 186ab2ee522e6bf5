"""A griffe extension for the API reference: the docstrings' reStructuredText, read as Markdown.

The package's docstrings are Google-style with reST inline markup (``:class:`~x.Y```, ``::``
literal blocks), which Markdown would print as it is. Before mkdocstrings renders a docstring,
this extension rewrites

* a role, ``:class:`~tf_transformer.nn.model.Transformer``` (also ``func``, ``meth``, ``mod``,
  ``data``, ``attr``, ``exc``, ``obj``, ``const``), as inline code: ```Transformer```
  (the full path without ``~``);
* a paragraph ending in ``::`` and the indented block after it as the paragraph ending in ``:``
  and a fenced ``text`` block.

mkdocs.yml loads it (``extensions: [tools/griffe_rst.py]``); nothing else uses it.
"""

import re
import textwrap

from griffe import Extension

ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|data|attr|exc|obj|const):`(~?)([^`]+)`")


def _role(match):
    tilde, target = match.groups()
    target = target.strip()
    if target.startswith("~"):
        tilde, target = "~", target[1:]
    return f"`{target.rsplit('.', 1)[-1] if tilde else target}`"


def _indent(line):
    return len(line) - len(line.lstrip(" "))


def markdown_from_rst(text):
    """``text`` with its reST roles as inline code and its ``::`` literal blocks fenced."""
    lines = ROLE.sub(_role, text).split("\n")
    out, i = [], 0
    while i < len(lines):
        line = lines[i]
        stripped = line.rstrip()
        if stripped.endswith("::"):
            base = _indent(line)
            j = i + 1
            while j < len(lines) and not lines[j].strip():
                j += 1
            if j < len(lines) and _indent(lines[j]) > base:
                k = j
                while k < len(lines) and (not lines[k].strip() or _indent(lines[k]) > base):
                    k += 1
                while k > j and not lines[k - 1].strip():
                    k -= 1
                lead = stripped[:-2].rstrip()
                if lead.strip():
                    out.append(lead + ":" if not stripped.endswith(" ::") else lead)
                pad = " " * base
                block = textwrap.dedent("\n".join(lines[j:k])).split("\n")
                out += ["", pad + "```text", *[(pad + b).rstrip() for b in block], pad + "```", ""]
                i = k
                continue
        out.append(line)
        i += 1
    return "\n".join(out)


class RstToMarkdown(Extension):
    """Rewrites every object's docstring with :func:`markdown_from_rst` once the tree is built."""

    def on_object(self, *, obj, **kwargs):
        if obj.docstring is not None:
            obj.docstring.value = markdown_from_rst(obj.docstring.value)

    def on_package(self, *, pkg, **kwargs):
        # The top-level package is not among the objects on_object visits.
        self.on_object(obj=pkg)
