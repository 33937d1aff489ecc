"""Sphinx settings of tinax's documentation site (``make docs``).

The site is built the way the JAX ecosystem builds its own (Orbax, Flax, Optax): MyST
pages, the notebooks executed by myst-nb at build time, the book theme, and an API
reference from the docstrings (autodoc and autosummary, napoleon for the Google-style
sections, sphinx-autodoc-typehints for the annotations). Warnings are errors
(``make docs`` runs ``sphinx-build -W -n``): a broken reference, a notebook cell that
raises, or a docstring that does not parse fails the build.
"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path

DOCS = Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS / "_ext"))

# sphinx-autodoc-typehints still calls an API Sphinx 10 removes; it works in this
# Sphinx, and the notice would be printed once per docstring.
warnings.filterwarnings("ignore", message=".*set_application.*is deprecated")

project = "tinax"
author = "the tinax authors"
copyright = "the tinax authors"
from tinax import __version__ as release  # noqa: E402

version = release

extensions = [
    "myst_nb",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinx_autodoc_typehints",
    "sphinxarg.ext",
    "tinax_docs",
    "widget_assets",
]

exclude_patterns = ["_build", "**.ipynb_checkpoints", "api/_templates"]
templates_path = ["api/_templates"]
root_doc = "index"

# Every reference to a tinax name must resolve (nitpicky). References into other
# projects (JAX, NumPy, pandas, Orbax, Python's own library…) would need their
# inventories, which an offline build cannot fetch: they are shown as text.
nitpicky = True
nitpick_ignore_regex = [
    (
        r"py:.*",
        r"(?!tinax\b)[A-Za-z_][\w.]*",  # any dotted name outside the tinax package
    ),
    # Types of private modules that no public name documents (a storage ``Location``,
    # a ``TypeVar``): shown as text. A private path to a public object resolves to its
    # public page (docs/_ext/tinax_docs.py) before this applies.
    (r"py:.*", r"tinax(\.\w+)*\._\w+(\.\w+)*"),
]

# MyST: ::: fences, and anchors for headings three deep so that a page can link to
# another page's section as [text](page.md#a-heading).
myst_enable_extensions = ["colon_fence"]
myst_heading_anchors = 3

# Notebooks: executed at every build in their own folder (notebooks/, which docs/
# links as tutorials/), each cell given two minutes; a cell that raises fails the build.
nb_execution_mode = os.environ.get("TINAX_DOCS_EXECUTE", "force")
nb_execution_timeout = 120
nb_execution_raise_on_error = True
nb_execution_show_tb = True
nb_merge_streams = True
# The widgets a notebook left on screen are drawn on its page from the state the run
# saved, by scripts the site serves itself (RequireJS, the ipywidgets HTML manager and
# anywidget's front end, put in _static/widgets/ by docs/_ext/widget_assets.py):
# myst-nb's default loads them from CDNs, and a page opened offline showed nothing.
# Without a kernel the widgets' buttons do nothing.
nb_ipywidgets_js: dict[str, dict[str, str]] = {
    "widgets/require.js": {},
    "widgets/paths.js": {},
    "widgets/embed-amd.js": {},
}

# API pages: one per public name, from the docstrings (Google style: Args, Returns,
# Raises), the signature's annotations shown in the parameter list.
autosummary_generate = True
autosummary_ignore_module_all = False
autosummary_imported_members = True
autodoc_default_options = {"members": True, "show-inheritance": True}
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_preserve_defaults = True
typehints_use_signature = False
typehints_use_signature_return = False
always_document_param_types = False
typehints_fully_qualified = False
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False

html_theme = "sphinx_book_theme"
html_title = "tinax"
html_static_path = ["_static"]
html_css_files = ["widgets/page.css"]
html_theme_options = {
    "repository_url": "https://github.com/tinax/tinax",
    "use_repository_button": True,
    "path_to_docs": "docs",
    "show_toc_level": 2,
    # The sidebar lists the pages above and beside the one shown, not every page of
    # the site: drawn in full on each of ~190 pages (the API reference is one page per
    # name), it was half of each page's HTML and a third of the build's time.
    "collapse_navbar": True,
}
html_last_updated_fmt = None
