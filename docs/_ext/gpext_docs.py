"""Sphinx helpers of the gpext documentation.

``.. public-names:: module`` documents every name in a module's ``__all__``.  It renders the
module docstring, a summary table of the names the module owns, links to the names it
re-exports from another documented module (documented once, where they are defined, so that no
object is described twice), and one autodoc entry per owned name in ``__all__`` order.  The
list comes from ``__all__`` at build time, so a new public name cannot be left out of the
reference.

The ``autodoc-process-docstring`` hook renders two house conventions of the docstrings:
shape comments (``# shape: (*batch, N)``, STYLE.md) become inline literals instead of being read
as reStructuredText emphasis, and citations of a source document by its file-name prefix
(``000_...``, ``003_4a6349f7433d9fd1.txt``) become links to its bibliography entry instead of
being read as hyperlink references.  The docstrings themselves are left as they are.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.pycode import ModuleAnalyzer
from sphinx.util.docutils import SphinxDirective

# Modules that have an API page; a re-exported object is documented on the page of the module
# it is defined under (the longest of these that is a prefix of its ``__module__``).
DOCUMENTED_MODULES = (
    "gpext",
    "gpext.likelihoods",
    "gpext.kernels",
    "gpext.variational",
    "gpext.mlls",
    "gpext.operators",
    "gpext.nn",
    "gpext.models",
    "gpext.subspace",
    "gpext.bootstrap",
    "gpext.fit",
    "gpext.metrics",
    "gpext.errors",
    "gpext.utils",
    "gpext.integrations.botorch",
    "gpext_bench",
    "gpext_bench.data",
)


def _home(modname: str, name: str, obj: object) -> str:
    """The documented module whose page describes ``obj`` (``modname`` unless re-exported)."""
    defined_in = getattr(obj, "__module__", None)
    if not isinstance(defined_in, str) or not (inspect.isclass(obj) or callable(obj)):
        return modname
    best = modname
    best_len = -1
    for candidate in DOCUMENTED_MODULES:
        if not (defined_in == candidate or defined_in.startswith(candidate + ".")):
            continue
        module = importlib.import_module(candidate)
        if name in getattr(module, "__all__", ()) and getattr(module, name, None) is obj:
            if len(candidate) > best_len:
                best, best_len = candidate, len(candidate)
    return best


_MISSING = object()


def _data_doc(modname: str, name: str, obj: object) -> list[str]:
    """The ``#:`` comment above a constant, read from the module that assigns it."""
    module = importlib.import_module(modname)
    candidates = [modname]
    if hasattr(module, "__path__"):
        candidates += [info.name for info in pkgutil.iter_modules(module.__path__, modname + ".")]
    for candidate in candidates:
        try:
            sub = importlib.import_module(candidate)
        except ImportError:
            continue
        if vars(sub).get(name, _MISSING) is not obj:
            continue
        docs = ModuleAnalyzer.for_module(candidate).find_attr_docs()
        if ("", name) in docs:
            return list(docs[("", name)])
    return []


def _describe(value: object) -> str:
    if inspect.isclass(value):
        return f"{value.__module__}.{value.__qualname__}"
    if isinstance(value, tuple | list):
        inner = ", ".join(_describe(v) for v in value)
        return (
            f"({inner}{',' if len(value) == 1 else ''})"
            if isinstance(value, tuple)
            else f"[{inner}]"
        )
    return repr(value)


def _data_lines(modname: str, name: str, obj: object) -> list[str]:
    lines = [f".. py:data:: {name}", f"   :value: {_describe(obj)}", ""]
    lines += [f"   {line}" if line else "" for line in _data_doc(modname, name, obj)]
    return lines + [""]


def _directive(obj: object) -> str:
    if inspect.isclass(obj):
        return "autoexception" if issubclass(obj, BaseException) else "autoclass"
    if inspect.isfunction(obj) or inspect.isbuiltin(obj):
        return "autofunction"
    return "autodata"


class PublicNames(SphinxDirective):
    required_arguments = 1
    has_content = False

    def run(self) -> list[nodes.Node]:
        modname = self.arguments[0]
        module = importlib.import_module(modname)
        public = getattr(module, "__all__", None)
        if public is None:
            raise self.error(f"{modname} defines no __all__")
        own: list[tuple[str, object]] = []
        reexported: list[tuple[str, str]] = []
        submodules: list[str] = []
        for name in public:
            obj = getattr(module, name)
            if inspect.ismodule(obj):
                submodules.append(obj.__name__)
                continue
            home = _home(modname, name, obj)
            if home == modname:
                own.append((name, obj))
            else:
                reexported.append((name, home))

        lines = [f".. automodule:: {modname}", "   :no-members:", ""]
        lines += [
            ".. note::",
            "",
            '   Citations such as "000 Eq. 2" or "Maddox et al. 2019" are resolved in the',
            "   :doc:`/bibliography`.",
            "",
        ]
        if submodules:
            lines += [".. rubric:: Subpackages", ""]
            lines += [f"* :mod:`{sub}`" for sub in submodules]
            lines.append("")
        callables = [name for name, obj in own if _directive(obj) != "autodata"]
        constants = [(name, obj) for name, obj in own if _directive(obj) == "autodata"]
        if callables:
            lines += [".. rubric:: Summary", "", ".. autosummary::", "   :nosignatures:", ""]
            lines += [f"   {name}" for name in callables]
            lines.append("")
        if constants:
            lines += [".. rubric:: Constants", ""]
            for name, obj in constants:
                doc = _data_doc(modname, name, obj)
                summary = f": {doc[0]}" if doc else ""
                lines.append(f"* :py:data:`{name}`{summary}")
            lines.append("")
        if reexported:
            links = ", ".join(f":py:obj:`{name} <{home}.{name}>`" for name, home in reexported)
            lines += [
                ".. rubric:: Re-exported names",
                "",
                f"Also exported by ``{modname}`` and documented where they are defined: {links}.",
                "",
            ]
        for name, obj in own:
            if _directive(obj) == "autodata":
                lines += _data_lines(modname, name, obj)
            else:
                lines += [f".. {_directive(obj)}:: {name}", ""]

        container = nodes.container()
        self.state.nested_parse(StringList(lines, source=f"<public-names {modname}>"), 0, container)
        return container.children


_SHAPE_COMMENT = re.compile(r"#\s*(?:(\w+)\s+)?(shapes?):\s*(.*)$")
_PAREN_GROUP = re.compile(r"\([^()]*(?:\([^()]*\)[^()]*)*\)")
_SOURCE_FILE = re.compile(r"(?<![\w`])(00[0-4])_(?:[0-9a-f]{16}\.txt|\.\.\.(?:\.?txt)?)")


def _render_shape(match: re.Match[str]) -> str:
    # No colon in the result: napoleon would split a Returns line at it.
    name, label, rest = match.groups()
    label = f"``{name}`` {label}" if name else label.capitalize()
    rest = _PAREN_GROUP.sub(lambda m: f"``{m.group(0)}``", rest)
    return f"{label} {rest}"


def process_docstring(app, what, name, obj, options, lines: list[str]) -> None:
    """Render shape comments as literals and source-file citations as bibliography links."""
    for i, line in enumerate(lines):
        stripped = line.lstrip()
        if stripped.startswith((">>>", "... ")):
            continue
        line = _SHAPE_COMMENT.sub(_render_shape, line)
        line = _SOURCE_FILE.sub(lambda m: f":ref:`{m.group(1)} <bib-{m.group(1)}>`", line)
        lines[i] = line


def setup(app):
    app.add_directive("public-names", PublicNames)
    # Before napoleon (priority 500), which reads a colon in a Returns line as a type separator.
    app.connect("autodoc-process-docstring", process_docstring, priority=100)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
