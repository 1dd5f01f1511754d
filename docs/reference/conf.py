"""The API reference, built from the docstrings (`python -m sphinx -W -b html
docs/reference build/reference`; CI builds it with warnings as errors)."""

project = "oddl"
extensions = ["sphinx.ext.autodoc"]
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_default_options = {"members": True, "undoc-members": False}
default_role = "code"  # `name` in a docstring is code, as the docstrings write it
html_theme = "alabaster"
exclude_patterns: list[str] = []
suppress_warnings = ["ref.python"]  # several classes of one name across modules
