"""Elements of the HTML page and its SVG plots, written with every attribute and text escaped."""

from __future__ import annotations

from html import escape


def tag(name: str, *content: str, **attrs: object) -> str:
    """``<name attrs>content</name>``. ``content`` is markup already; attribute values are
    escaped; ``class_`` is ``class`` and any other ``_`` in a name is ``-`` (``data_value``)."""
    written = "".join(f' {_name(key)}="{escape(str(value))}"' for key, value in attrs.items())
    return f"<{name}{written}>{''.join(content)}</{name}>"


def text(value: object) -> str:
    """``value`` as text inside an element."""
    return escape(str(value), quote=False)


def _name(key: str) -> str:
    return key.rstrip("_").replace("_", "-")
