"""The scenario keys of load-balancing plugins (switch.load_balancing: plugin, switch.plugin.source, .params):
one-line errors naming the key, the header found beside the scenario file, and what the datapath is handed
(testbed/lb/plugin.py for_datapath)."""
from pathlib import Path

import pytest

from conftest import ROOT

from testbed import scenario
from testbed.lb.plugin import for_datapath

TWO_CHOICES = ROOT / "examples" / "plugins" / "two_choices.h"


def refused(doc, *sets) -> str:
    with pytest.raises(scenario.ScenarioError) as e:
        scenario.from_dict(doc, sets)
    msg = str(e.value)
    assert "\n" not in msg
    return msg


def plugin(**kw):
    return {"switch": {"load_balancing": "plugin", "plugin": {"source": str(TWO_CHOICES), **kw}}}


def test_plugin_mode_needs_switch_plugin():
    assert refused({"switch": {"load_balancing": "plugin"}}).startswith(
        "switch.load_balancing: plugin needs switch.plugin")


def test_switch_plugin_needs_plugin_mode():
    msg = refused({"switch": {"load_balancing": "ecmp", "plugin": {"source": str(TWO_CHOICES)}}})
    assert msg == "switch.plugin: only with load_balancing: plugin (it is ecmp)"


def test_a_missing_header_names_the_key_and_the_path(tmp_path):
    msg = refused(plugin(source=str(tmp_path / "nope.h")))
    assert msg.startswith("switch.plugin.source: no such file") and "nope.h" in msg


@pytest.mark.parametrize("params, words", [
    ({"a b": 1}, "switch.plugin.params: 'a b' is not a parameter name"),
    ({"1st": 1}, "switch.plugin.params: '1st' is not a parameter name"),
    ({"gap": 1, "GAP": 2}, "are the same parameter (PLUGIN_PARAM_GAP)"),
    ({"gap": -1}, "switch.plugin.params.gap: an integer 0 .. 2^64 − 1"),
    ({"gap": "soon"}, "switch.plugin.params.gap: Input should be a valid integer"),
])
def test_bad_params_are_one_line(params, words):
    assert words in refused(plugin(params=params))


def test_unknown_plugin_key_is_refused():
    assert refused(plugin(parameters={"x": 1})).startswith("switch.plugin.parameters")


def test_the_header_is_read_beside_the_scenario_file(tmp_path):
    (tmp_path / "plugins").mkdir()
    h = tmp_path / "plugins" / "mine.h"
    h.write_text("/* a plugin */\n")
    f = tmp_path / "s.yaml"
    f.write_text("switch:\n  load_balancing: plugin\n  plugin: {source: plugins/mine.h, params: {k: 3}}\n")
    s = scenario.load(f)
    assert s.switch.plugin.source == str(h.resolve())
    # the shipped scenario finds its header from any working directory
    assert scenario.load(ROOT / "scenarios" / "two-choices.yaml").switch.plugin.source == str(TWO_CHOICES)


def test_a_missing_header_beside_the_scenario_is_an_error_naming_the_file(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text("switch:\n  load_balancing: plugin\n  plugin: {source: plugins/gone.h}\n")
    with pytest.raises(scenario.ScenarioError) as e:
        scenario.load(f)
    assert str(e.value).startswith(f"{f}: switch.plugin.source: no such file") and "\n" not in str(e.value)


def test_the_set_form_over_ecmp_collisions():
    s = scenario.load(ROOT / "scenarios" / "ecmp-collisions.yaml",
                      ("switch.load_balancing=plugin",
                       f"switch.plugin={{source: {TWO_CHOICES}, params: {{per_flowlet: 1}}}}"))
    assert s.switch.load_balancing == "plugin" and s.switch.plugin.params == {"per_flowlet": 1}


def test_the_datapath_gets_the_header_and_indexed_params():
    s = scenario.from_dict(plugin(params={"per_flowlet": 1, "salt": 7}))
    p = for_datapath(s.switch)
    assert p.source == Path(TWO_CHOICES) and p.values == (1, 7)
    assert p.defines == "#define PLUGIN_PARAM_PER_FLOWLET 0\n#define PLUGIN_PARAM_SALT 1\n#define PLUGIN_NPARAMS 2\n"
    assert for_datapath(scenario.from_dict({}).switch) is None


def test_the_scenario_round_trips():
    s = scenario.from_dict(plugin(params={"per_flowlet": 1}))
    again = scenario.from_dict(scenario.to_dict(s, roundtrip=True))
    assert again.switch.plugin == s.switch.plugin
