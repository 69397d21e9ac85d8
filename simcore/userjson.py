"""JSON read the way users' files must be read: strictly, and without crashing on hostile input.

`json.loads` keeps the last of two equal keys without a word (a profile or config edited by hand
could then mean something else than it shows) and raises RecursionError, not a decode error, on
deeply nested input (ValueError naming an interpreter setting on an integer of thousands of
digits). `loads` turns each into `ValueError` with a short reason, so each reader can
name its file in its own error.
"""

from __future__ import annotations

import json
from typing import Any


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise ValueError(f"key {key!r} is given twice")
        obj[key] = value
    return obj


def loads(text: str) -> Any:
    """`json.loads`, but a repeated key or nesting too deep for the parser is a ValueError."""
    try:
        return json.loads(text, object_pairs_hook=_unique)
    except RecursionError:
        raise ValueError("nested too deeply") from None
    except json.JSONDecodeError:
        raise
    except ValueError as exc:  # Python's int() limit (4,300 digits): its text names an interpreter setting
        if "integer string conversion" not in str(exc):
            raise
        raise ValueError("an integer has thousands of digits") from None
