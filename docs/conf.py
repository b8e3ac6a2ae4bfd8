"""Sphinx configuration of the gpext documentation.

Build with ``sphinx-build -W --keep-going -b html docs docs/_build/html`` (the ``docs`` extra
installs what it needs).  The API pages document every name in each subpackage's ``__all__``;
the tutorials are rendered from the outputs stored in the notebooks, without executing them.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent / "_ext"))
os.environ.setdefault("GPEXT_PROGRESS", "0")

import gpext  # noqa: E402

project = "gpext"
author = "The gpext developers"
copyright = "The gpext developers (MIT License)"
release = gpext.__version__
version = release

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
    "myst_nb",
    "gpext_docs",
]

source_suffix = {".rst": "restructuredtext", ".md": "myst-nb", ".ipynb": "myst-nb"}
exclude_patterns = ["_build", "**/.ipynb_checkpoints", "Thumbs.db", ".DS_Store"]
root_doc = "index"

# --- autodoc / napoleon -------------------------------------------------------------------
autodoc_default_options = {
    "members": True,
    "show-inheritance": True,
}
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autoclass_content = "class"
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
# Attributes sections as field lists: dataclass fields are also documented by autodoc.
napoleon_use_ivar = True
autosummary_generate = False

# --- notebooks: render the stored outputs, never execute ----------------------------------
nb_execution_mode = "off"
nb_merge_streams = True
myst_enable_extensions = ["dollarmath", "amsmath"]
myst_heading_anchors = 3

# --- HTML ----------------------------------------------------------------------------------
html_theme = "furo"
html_title = f"gpext {release}"
html_static_path: list[str] = []
