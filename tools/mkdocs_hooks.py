"""MkDocs hooks: the Python API page shows docstrings' cross-reference roles (``:func:`x```,
``:class:`~m.X```...) as the plain code they name, not as literal role markup; the command
line's reference marks its blocks of --help text to wrap (``docs/stylesheets/extra.css``)."""

from __future__ import annotations

import re
from typing import Any

ROLE = re.compile(r":(?:func|meth|class|attr|mod|data|obj|exc):<code>[.~]?")


WRAPPED_PAGES = ("reference/cli.md",)
"""Pages whose code blocks wrap at the page's edge: generated --help text, not code to copy."""


def on_page_content(html: str, page: Any = None, **kwargs: Any) -> str:
    """Strip the role prefix (and a leading ``.`` or ``~``) from every role in a page's HTML; on
    the pages of :data:`WRAPPED_PAGES`, mark each code block ``wrap``.

    Args:
        html: the page's rendered content.
        page: the page (its ``file.src_uri`` names it).
        **kwargs: what MkDocs passes besides (config, files).

    Returns:
        The content with each role shown as its code alone.
    """
    if page is not None and getattr(page.file, "src_uri", None) in WRAPPED_PAGES:
        html = html.replace('<div class="highlight">', '<div class="highlight wrap">')
    return ROLE.sub("<code>", html)
