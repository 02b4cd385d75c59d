from __future__ import annotations

import json

import pytest

from jido.planner.catalog import DATA_PATH, CatalogError, load_catalog

REQUIRED = ("A10", "L4", "L40S", "A100-80G", "H100-SXM", "H200", "B200", "MI300X", "cpu-2core")


def test_catalog_holds_every_required_accelerator_with_sources(catalog):
    for name in REQUIRED:
        acc = catalog.accelerator(name)
        assert set(acc.source) >= {"tflops", "memory", "links", "price"}
        assert acc.price_per_hour > 0


def test_known_datasheet_figures(catalog):
    assert catalog.accelerator("A100-80G").tflops["bf16"] == 312.0
    assert catalog.accelerator("A100-80G").memory_tb_s == pytest.approx(2.039)
    assert catalog.accelerator("H100-SXM").tflops["fp8"] == 1979.0
    assert not catalog.accelerator("A100-80G").supports("fp8")
    assert catalog.accelerator("MI300X").memory_gb == 192.0


def test_cpu_entry_says_it_was_measured_on_this_machine(catalog):
    source = catalog.accelerator("cpu-2core").source
    assert "measured" in source["tflops"] and "measured" in source["memory"]
    assert catalog.accelerator("cpu-2core").max_tp == 1


def test_every_link_residency_and_wire_format_cites_a_source(catalog):
    for table in (catalog.links, catalog.residencies, catalog.wire_formats):
        assert all(entry.source for entry in table.values())


def test_price_override_replaces_only_that_accelerator(catalog):
    cheaper = catalog.with_prices({"H100-SXM": 1.0})
    assert cheaper.accelerator("H100-SXM").price_per_hour == 1.0
    assert cheaper.accelerator("A100-80G").price_per_hour == catalog.accelerator("A100-80G").price_per_hour


def test_unknown_accelerator_names_the_known_ones(catalog):
    with pytest.raises(CatalogError, match="unknown accelerator 'V100'; known: A10"):
        catalog.accelerator("V100")


def test_figure_without_a_source_is_rejected(tmp_path):
    raw = json.loads(DATA_PATH.read_text())
    del raw["accelerators"]["L4"]["source"]["price"]
    path = tmp_path / "hw.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(CatalogError, match=r"L4: every figure needs a source; missing \['price'\]"):
        load_catalog(path)
