"""The documentation covers every public module and resolves every source-document citation."""

import re
import sys
from pathlib import Path

import pytest

import gpext

DOCS = Path(__file__).resolve().parents[1] / "docs"

pytest.importorskip("sphinx", reason="the docs extra is not installed")
sys.path.insert(0, str(DOCS / "_ext"))
from gpext_docs import DOCUMENTED_MODULES  # noqa: E402


def test_every_documented_module_has_a_page_in_the_toctree():
    index = (DOCS / "api" / "index.rst").read_text()
    for modname in DOCUMENTED_MODULES:
        page = DOCS / "api" / f"{modname}.rst"
        assert page.exists(), f"docs/api/{modname}.rst is missing"
        assert f".. public-names:: {modname}" in page.read_text()
        assert re.search(rf"^   {re.escape(modname)}$", index, re.M), (
            f"{modname} not in the toctree"
        )
    pages = {p.stem for p in (DOCS / "api").glob("*.rst")} - {"index"}
    assert pages == set(DOCUMENTED_MODULES)


def test_every_subpackage_is_documented():
    subpackages = {f"gpext.{name}" for name in gpext.__all__ if not name.startswith("_")}
    missing = subpackages - set(DOCUMENTED_MODULES)
    assert not missing, f"no API page for {sorted(missing)}"


def test_bibliography_has_every_source_document():
    text = (DOCS / "bibliography.rst").read_text()
    papers = Path(__file__).resolve().parents[2] / "shared" / "papers"  # beside the clone
    for number in ("000", "001", "002", "003", "004"):
        assert f".. _bib-{number}:" in text
    for path in sorted(papers.glob("00*.txt")):
        assert path.name in text, f"{path.name} is not in the bibliography"
