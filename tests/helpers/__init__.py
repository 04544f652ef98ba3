"""Helpers shared by the tests, imported as `tests.helpers.<module>`."""

from __future__ import annotations

from pathlib import Path

from edgeinfer.bundle.build import find_project

PROJECT = find_project(Path(__file__).parent)  # the checkout under test
