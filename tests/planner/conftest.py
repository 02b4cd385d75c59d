"""Shared fixtures for planner tests: the catalog, small search spaces, fast plan settings."""

from __future__ import annotations

import pytest

from jido.planner.catalog import Catalog, load_catalog
from jido.planner.planner import PlanSettings


@pytest.fixture(scope="session")
def catalog() -> Catalog:
    return load_catalog()


@pytest.fixture
def fast_settings() -> PlanSettings:
    return PlanSettings(num_requests=120, num_finalists=2, max_ratio_tries=4)
