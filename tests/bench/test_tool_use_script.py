"""benchmarks/tool_use.py's judge: what counts as a well-formed and a right answer to a held-out tool-use case."""
from __future__ import annotations

import json

from benchmark_scripts import load_benchmark

tool_use = load_benchmark("tool_use")
CATALOG = json.loads(tool_use.CASES.read_text(encoding="utf-8"))["tools"]
WEATHER = {"kind": "single", "tools": ["get_weather", "get_time"], "prompt": "?", "expect": ["get_weather"]}
NONE = {"kind": "none", "tools": ["get_weather"], "prompt": "?", "expect": []}


def answer(*calls: tuple[str, dict | str]) -> dict:
    return {"calls": [[n, a if isinstance(a, str) else json.dumps(a)] for n, a in calls], "content": ""}


def test_a_call_whose_arguments_follow_the_tools_schema_is_well_formed_and_right():
    assert tool_use.judge(WEATHER, answer(("get_weather", {"city": "Oslo"})), CATALOG) == {
        "parses": True, "well_formed": True, "right": True, "problems": []}


def test_well_formed_but_another_tool_is_not_right():
    verdict = tool_use.judge(WEATHER, answer(("get_time", {"timezone": "Europe/Oslo"})), CATALOG)
    assert verdict["well_formed"] and not verdict["right"]


def test_schema_violations_unknown_tools_bad_json_and_calls_when_none_was_needed_are_not_well_formed():
    cases = [(WEATHER, answer(("get_weather", {"unit": "kelvin"})), "get_weather arguments"),
             (WEATHER, answer(("send_email", {"to": "a"})), "unknown tool 'send_email'"),
             (WEATHER, answer(("get_weather", '{"city": "Oslo"')), "get_weather arguments"),
             (WEATHER, answer(), "no call"),
             (NONE, answer(("get_weather", {"city": "Oslo"})), "a call where none was needed")]
    for case, given, problem in cases:
        verdict = tool_use.judge(case, given, CATALOG)
        assert not verdict["well_formed"] and not verdict["right"]
        assert any(p.startswith(problem) for p in verdict["problems"]), verdict
        assert verdict["parses"] == (problem == "a call where none was needed")  # the call itself was fine


def test_every_held_out_case_names_tools_of_the_catalog_and_expects_calls_by_its_kind():
    for case in json.loads(tool_use.CASES.read_text(encoding="utf-8"))["cases"]:
        assert set(case["tools"]) <= set(CATALOG) and set(case["expect"]) <= set(case["tools"])
        assert len(case["expect"]) == {"single": 1, "two": 2, "none": 0}[case["kind"]], case["prompt"]
