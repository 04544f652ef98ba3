"""Configuration as each nucleus hands it over."""

from __future__ import annotations

from typing import Any


def lite_typed(doc: Any) -> Any:
    """`doc` as nucleus lite stores a recipe's DefaultConfiguration: every scalar a string (`"8"`,
    `"true"`, `"0.5"`), lists and maps kept."""
    if isinstance(doc, dict):
        return {key: lite_typed(value) for key, value in doc.items()}
    if isinstance(doc, list):
        return [lite_typed(value) for value in doc]
    if isinstance(doc, bool):
        return "true" if doc else "false"
    if isinstance(doc, (int, float)):
        return str(doc)
    return doc
