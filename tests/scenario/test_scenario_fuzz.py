"""The scenario loader under fuzzing: documents generated from the schema itself (every section and key the
pydantic models declare, values near their bounds, quantities with and without units) and mutations of them
(unknown keys, wrong types, nulls). Loading either gives a Scenario or raises the one-line ScenarioError —
never another exception, never a multi-line message. A few of the valid documents the fuzzer finds, the ones
that enable the most mechanisms, then run end to end (slow)."""
from __future__ import annotations

import types
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import pytest
from hypothesis import HealthCheck, given, settings, target
from hypothesis import strategies as st
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from testbed import scenario
from testbed.spec_types import Quantity, ScenarioError

QUANTITIES = ["10mbit", "1gbit", "400gbit", "100kbit", "64KB", "1MB", "9000", "500us", "10ms", "1s", "2.5s",
              "1ns", 0, 1, 1500, -3, "fast", "10 parsecs", 1e30]
NAMES = ["h0", "h1", "h3", "h99", "leaf0", "leaf1", "spine0", "spine1", "core0", "x", "", "websearch"]
#: keys left out: a file the loader would read (every string is a missing file, which is one line anyway)
#: is fine, but a fabric split over a cluster or container hosts are checked against machines, not files
SKIP = {"placement"}
seen_valid: list[dict] = []


def _bounds(meta) -> list[int]:
    out = []
    for m in meta:
        for attr, d in (("ge", 0), ("gt", 1), ("le", 0), ("lt", -1)):
            v = getattr(m, attr, None)
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                out += [int(v) + d, int(v) + d + (1 if attr in ("ge", "gt") else -1)]
    return out


def value(tp: Any, meta: list = ()) -> st.SearchStrategy:
    """Values for a field of type ``tp`` (its constraints ``meta``): mostly of the declared type, some not."""
    origin = get_origin(tp)
    if origin is Annotated:
        base, *extra = get_args(tp)
        inner = [m for e in extra for m in (e.metadata if isinstance(e, FieldInfo) else [e])]
        return value(base, list(meta) + inner)
    if origin in (Union, types.UnionType):
        return st.one_of([value(a, meta) for a in get_args(tp)])
    if origin is Literal:
        return st.sampled_from(get_args(tp))
    if tp is type(None):
        return st.none()
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return document(tp)
    if origin in (list, tuple):
        args = [a for a in get_args(tp) if a is not Ellipsis] or [Any]
        if origin is tuple and len(args) > 1:
            return st.tuples(*(value(a) for a in args)).map(list)
        return st.lists(value(args[0]), max_size=3)
    if origin is dict:
        k, v = get_args(tp)
        return st.dictionaries(value(k), value(v), max_size=3)
    if tp is bool:
        return st.booleans()
    if tp is int:
        if any(isinstance(m, Quantity) or type(m).__name__ == "BeforeValidator" for m in meta):
            return st.sampled_from(QUANTITIES)
        return st.one_of(st.integers(-1, 6), st.sampled_from(_bounds(meta) or [0, 1, 2]))
    if tp is float:
        return st.one_of(st.floats(-1, 2, allow_nan=False), st.sampled_from(_bounds(meta) or [0.5]))
    if tp is str:
        return st.sampled_from(NAMES)
    return st.one_of(st.none(), st.integers(0, 3), st.sampled_from(NAMES))


def document(model: type[BaseModel]) -> st.SearchStrategy:
    """A mapping of some of ``model``'s keys (each present or not), values from ``value``."""
    fields = {n: f for n, f in model.model_fields.items() if n not in SKIP}
    return st.fixed_dictionaries({}, optional={n: value(f.annotation, f.metadata) for n, f in fields.items()})


JUNK = st.one_of(st.none(), st.integers(-5, 5), st.text(max_size=5), st.lists(st.integers(), max_size=2),
                 st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))


@st.composite
def mutated(draw, base: st.SearchStrategy) -> Any:
    """A generated document with one key path replaced by junk or one unknown key added."""
    doc = draw(base)
    node = doc
    while isinstance(node, dict) and node and draw(st.booleans()):
        key = draw(st.sampled_from(sorted(node, key=str)))
        if not isinstance(node[key], dict):
            break
        node = node[key]
    if isinstance(node, dict):
        if node and draw(st.booleans()):
            node[draw(st.sampled_from(sorted(node, key=str)))] = draw(JUNK)
        else:
            node[draw(st.sampled_from(["bogus", "spines2", "Rate", "pfc_", "1"]))] = draw(JUNK)
    return doc


DOCS = st.one_of(document(scenario.Scenario), mutated(document(scenario.Scenario)), JUNK)


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                    HealthCheck.data_too_large])
@given(DOCS)
def test_loading_any_document_gives_a_scenario_or_one_line(doc):
    try:
        scen = scenario.from_dict(doc)
    except ScenarioError as e:
        msg = str(e)
        assert msg and "\n" not in msg and len(msg) < 1000, msg
        return
    assert isinstance(scen, scenario.Scenario)
    seen_valid.append((changed(scen), doc))
    target(float(len(seen_valid[-1][0])), label="settings a valid document changes")   # richer valid ones


def _flat(d: Any, prefix: str = "") -> dict:
    if isinstance(d, dict):
        return {k: v for key, sub in d.items() for k, v in _flat(sub, f"{prefix}{key}.").items()}
    return {prefix.rstrip("."): d}


DEFAULTS = _flat(scenario.Scenario().model_dump(mode="json"))


def changed(scen: scenario.Scenario) -> frozenset:
    """The dotted keys whose resolved value differs from the defaults': what a document really turns on."""
    mine = _flat(scen.model_dump(mode="json"))
    return frozenset(k for k, v in mine.items() if DEFAULTS.get(k, object()) != v and not k.startswith(
        ("name", "seed", "topology", "duration", "capture", "failures", "time_dilation")))


@pytest.mark.e2e
@pytest.mark.slow
def test_the_most_interesting_valid_documents_run_end_to_end(tmp_path):
    """Up to three valid fuzzed documents (the most settings changed), cut to one small fabric and one second of traffic at
    a modest rate, run through `testbed run`'s path: each completes or stops with the one-line error of a
    missing kernel feature (rxe, netem here) — never a traceback."""
    from testbed import runner
    from testbed.errors import TestbedError
    if not seen_valid:
        test_loading_any_document_gives_a_scenario_or_one_line()
    picked, ran, tried = sorted(seen_valid, key=lambda cd: len(cd[0]), reverse=True), 0, set()
    for keys, doc in picked:
        if ran == 3:
            break
        small = dict(doc, duration="1s", topology={"spines": 2, "leaves": 2, "hosts_per_leaf": 2},
                     failures=[], capture=[], time_dilation=None)
        small.pop("hosts", None)
        small["traffic"] = {k: v for k, v in (doc.get("traffic") or {}).items()
                            if k not in ("pairs", "jobs", "incast", "replay", "rate", "flow_size")}
        small["traffic"]["rate"] = "2mbit"
        try:
            scen = scenario.from_dict(small)
        except ScenarioError:
            continue
        if changed(scen) in tried:        # one run per distinct set of settings
            continue
        tried.add(changed(scen))
        ran += 1
        print(f"[fuzz e2e] run {ran}: {', '.join(sorted(changed(scen)))}")
        try:
            runner.run(scen, tmp_path / f"run{ran}")
        except TestbedError as e:
            assert "\n" not in str(e), str(e)
            print(f"[fuzz e2e] run {ran}: {e}")
    assert ran >= 1, "no valid fuzzed document fits one small fabric"
