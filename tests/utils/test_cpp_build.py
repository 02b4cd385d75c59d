"""The C++ build helper: what the kernels it compiles can rely on."""
import textwrap
from pathlib import Path

import pytest
import torch

from jido.utils import cpp_build

# A kernel that reports how many distinct threads at::parallel_for ran its chunks on.
PROBE = textwrap.dedent("""
    #include <ATen/ATen.h>
    #include <ATen/Parallel.h>
    #include <torch/library.h>
    #include <mutex>
    #include <set>
    int64_t threads_used(int64_t items) {
      std::mutex lock;
      std::set<int> seen;
      at::parallel_for(0, items, 1, [&](int64_t, int64_t) {
        std::lock_guard<std::mutex> guard(lock);
        seen.insert(at::get_thread_num());
      });
      return static_cast<int64_t>(seen.size());
    }
    TORCH_LIBRARY(jido_build_probe, m) { m.def("threads_used(int items) -> int", &threads_used); }
""")


@pytest.fixture(scope="module")
def probe_source(tmp_path_factory) -> Path:
    source = Path(tmp_path_factory.mktemp("probe")) / "probe.cpp"
    source.write_text(PROBE)
    return source


@pytest.fixture(scope="module")
def probe_ops(probe_source) -> object:
    if not cpp_build.load_ops_library("jido_build_probe", probe_source, "the build probe", "nothing"):
        pytest.skip("no C++ compiler here")
    return torch.ops.jido_build_probe


def test_parallel_for_in_a_built_kernel_uses_every_thread_torch_has(probe_ops) -> None:
    # Built without OpenMP, ATen's inline parallel_for runs every chunk on the calling thread.
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert probe_ops.threads_used(64) == 2
        torch.set_num_threads(1)
        assert probe_ops.threads_used(64) == 1
    finally:
        torch.set_num_threads(before)


def test_the_build_key_changes_with_the_compiler_flags(monkeypatch, tmp_path) -> None:
    source = tmp_path / "k.cpp"
    source.write_text("int x;")
    key = cpp_build.build_key("k", source, "avx2")
    monkeypatch.setattr(cpp_build, "COMMON_FLAGS", ["-O2"])
    assert cpp_build.build_key("k", source, "avx2") != key


def test_a_library_of_units_compiles_each_and_links_them(tmp_path) -> None:
    # int8_dot's layout: the ops in one unit, a kernel in another without ATen.
    ops_unit, kernel_unit = tmp_path / "ops.cpp", tmp_path / "kernel.cpp"
    ops_unit.write_text(textwrap.dedent("""
        #include <torch/library.h>
        int64_t twice(int64_t v);
        TORCH_LIBRARY(jido_build_units, m) { m.def("twice(int v) -> int", &twice); }
    """))
    kernel_unit.write_text("#include <cstdint>\nint64_t twice(int64_t v) { return 2 * v; }\n")
    if not cpp_build.load_ops_library("jido_build_units", [ops_unit, kernel_unit], "the units probe", "nothing"):
        pytest.skip("no C++ compiler here")
    assert torch.ops.jido_build_units.twice(21) == 42


def test_the_build_key_changes_with_any_unit_of_a_library(tmp_path) -> None:
    units = [tmp_path / "a.cpp", tmp_path / "b.cpp"]
    for unit in units:
        unit.write_text("int x;")
    key = cpp_build.build_key("k", units, "avx2")
    assert cpp_build.build_key("k", units[:1], "avx2") == cpp_build.build_key("k", units[0], "avx2")
    units[1].write_text("int y;")
    assert cpp_build.build_key("k", units, "avx2") != key


def test_the_build_key_changes_with_a_shared_header(monkeypatch, tmp_path) -> None:
    # A library that includes a shared header must rebuild when that header changes, not load a stale build.
    source, shared = tmp_path / "k.cpp", tmp_path / "shared"
    source.write_text('#include "common.h"')
    shared.mkdir()
    (shared / "common.h").write_text("inline int one() { return 1; }")
    monkeypatch.setattr(cpp_build, "SHARED_HEADERS", shared)
    key = cpp_build.build_key("k", source, "avx2")
    (shared / "common.h").write_text("inline int one() { return 2; }")
    assert cpp_build.build_key("k", source, "avx2") != key


def test_every_kernel_source_and_header_ships_in_the_package() -> None:
    # The builds run at first use from the installed package: a header left out of package-data breaks every
    # library that includes it outside an editable install.
    import tomllib

    root = Path(cpp_build.__file__).resolve().parents[2]
    package_data = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    missing = []
    for path in sorted((root / "jido").rglob("csrc/*")):
        package = ".".join(path.relative_to(root).parent.parent.parts)
        relative = path.relative_to(root / package.replace(".", "/"))
        if not any(relative.match(pattern) for pattern in package_data.get(package, [])):
            missing.append(str(path.relative_to(root)))
    assert not missing, f"not in [tool.setuptools.package-data]: {missing}"


def test_a_build_leaves_the_flags_and_so_the_next_build_key_as_they_were(probe_ops, tmp_path) -> None:
    # torch's load() appends its -L/-l flags to the list it is given: given the module's own list, every later
    # library of the process got another key, and was compiled again in every process that loaded in another order.
    flags = (list(cpp_build.COMMON_FLAGS), list(cpp_build.LINK_FLAGS))
    source = tmp_path / "k.cpp"
    source.write_text("int x;")
    key = cpp_build.build_key("k", source, "avx2")
    second = tmp_path / "probe2.cpp"
    second.write_text(PROBE.replace("jido_build_probe", "jido_build_probe_two"))
    assert cpp_build.load_ops_library("jido_build_probe_two", second, "the second probe", "nothing")
    assert (list(cpp_build.COMMON_FLAGS), list(cpp_build.LINK_FLAGS)) == flags
    assert cpp_build.build_key("k", source, "avx2") == key


def test_a_failed_build_is_an_error_with_its_compiler_output_kept_and_its_outcome_recorded(
        probe_ops, tmp_path, monkeypatch, caplog) -> None:
    monkeypatch.setattr(cpp_build, "CACHE_ROOT", tmp_path / "extensions")
    source = tmp_path / "broken.cpp"
    source.write_text("int broken( { return undeclared_name; }\n")
    with caplog.at_level("ERROR", logger="jido.utils.cpp_build"):
        assert not cpp_build.load_ops_library("jido_broken_probe", source, "the broken probe", "the slow path")
    outcome = cpp_build.BUILDS["jido_broken_probe"]
    assert not outcome.loaded and outcome.fallback == "the slow path" and outcome.log.parent == tmp_path / "extensions"
    assert "undeclared_name" in outcome.log.read_text()  # the compiler's own words, kept
    (record,) = [r for r in caplog.records if "broken probe" in r.getMessage()]
    assert record.levelname == "ERROR" and "jido build-kernels" in record.getMessage()
    assert cpp_build.BUILDS["jido_build_probe"].loaded


def test_build_kernels_reports_each_library_and_fails_when_one_did_not_build(monkeypatch, capsys) -> None:
    from jido.tools import build_kernels

    def fake_loaders():
        def built():
            cpp_build.BUILDS["lib_ok"] = cpp_build.BuildOutcome("fast kernels", "slow path", loaded=True)

        def failed():
            cpp_build.BUILDS["lib_bad"] = cpp_build.BuildOutcome("other kernels", "ATen", loaded=False,
                                                                 reason="CalledProcessError: g++", log=Path("/x.log"))
        return [("lib_ok", built), ("lib_bad", failed), ("lib_unused", lambda: None)]

    monkeypatch.setattr(build_kernels, "_loaders", fake_loaders)
    assert build_kernels.build_kernels_main([]) == 1
    out = capsys.readouterr()
    assert "lib_ok             built: fast kernels" in out.out and "lib_unused         not used on this CPU" in out.out
    assert "lib_bad            FAILED: other kernels (CalledProcessError: g++); ATen runs instead" in out.out
    assert "1 of 3 libraries failed to build: lib_bad" in out.err
    del cpp_build.BUILDS["lib_ok"], cpp_build.BUILDS["lib_bad"]


def test_an_engine_reports_the_kernel_libraries_its_worker_could_not_build(tiny_model_folder, monkeypatch):
    from jido.engine.llm import LLM

    # This process's builds alone (other tests record failed builds of their own in BUILDS).
    monkeypatch.setattr(cpp_build, "BUILDS", {"jido_missing": cpp_build.BuildOutcome(
        "C++ missing kernels", "the PyTorch ops", loaded=False, reason="CalledProcessError: no compiler")})
    with LLM(model=str(tiny_model_folder), kv_cache_memory="4MiB") as llm:
        assert llm.llm_engine.kernel_fallbacks == {"jido_missing": "the PyTorch ops (CalledProcessError: no compiler)"}


def test_two_checkouts_of_one_source_share_one_build_and_the_second_compiles_nothing(probe_ops, probe_source,
                                                                                     tmp_path) -> None:
    # Built from copies inside the build folder: ninja's file names the same paths whichever checkout asks, so a
    # second checkout of the same code (a worktree, a benchmark's baseline) loads the first one's library as is.
    first = probe_source
    second = tmp_path / "another-checkout" / "probe.cpp"
    second.parent.mkdir()
    second.write_text(first.read_text())
    key = cpp_build.build_key("jido_build_probe", first, cpp_build.target_isa())
    assert cpp_build.build_key("jido_build_probe", second, cpp_build.target_isa()) == key
    library = next((cpp_build.CACHE_ROOT / key).glob("*.so"))
    built = library.stat().st_mtime_ns
    assert cpp_build.load_ops_library("jido_build_probe", second, "the build probe", "nothing")
    assert library.stat().st_mtime_ns == built
    assert probe_ops.threads_used(4) >= 1


def test_a_library_whose_files_share_a_name_is_refused_by_name(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(cpp_build, "CACHE_ROOT", tmp_path / "extensions")
    units = [tmp_path / "a" / "k.cpp", tmp_path / "b" / "k.cpp"]
    for unit in units:
        unit.parent.mkdir()
        unit.write_text("int x;\n")
    assert not cpp_build.load_ops_library("jido_build_clash", units, "the clash probe", "nothing")
    assert "one name twice among a library's files" in cpp_build.BUILDS["jido_build_clash"].reason
