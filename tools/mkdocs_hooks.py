"""MkDocs hooks: the Python API page shows docstrings' cross-reference roles (``:func:`x```,
``:class:`~m.X```...) as the plain code they name, not as literal role markup."""

from __future__ import annotations

import re
from typing import Any

ROLE = re.compile(r":(?:func|meth|class|attr|mod|data|obj|exc):<code>[.~]?")


def on_page_content(html: str, **kwargs: Any) -> str:
    """Strip the role prefix (and a leading ``.`` or ``~``) from every role in a page's HTML.

    Args:
        html: the page's rendered content.
        **kwargs: what MkDocs passes besides (page, config, files).

    Returns:
        The content with each role shown as its code alone.
    """
    return ROLE.sub("<code>", html)
