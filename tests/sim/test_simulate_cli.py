"""`venusrl simulate`: one progress line per finished run on stderr, the JSON alone on stdout."""

import json

from tests.sim.sim_helpers import small_spec
from typer.testing import CliRunner

from venusrl.cli import app
from venusrl.cli import simulate as simulate_cli
from venusrl.sim import scenarios

runner = CliRunner()


def tiny(quick, workload, extra_policy):
    yield scenarios.Case({"cell": "small"}, (small_spec("venus"), small_spec("slime")))


def test_each_finished_run_prints_one_line_and_stdout_stays_json(monkeypatch, tmp_path):
    monkeypatch.setitem(scenarios.SCENARIOS, "tiny", tiny)
    monkeypatch.setitem(simulate_cli.REFERENCES, "tiny", "venus")
    for jobs in ("1", "2"):
        result = runner.invoke(app, ["simulate", "--scenario", "tiny", "--seeds", "2", "--jobs", jobs,
                                     "--json", str(tmp_path / "out.json")])
        assert result.exit_code == 0, result.output
        lines = [line for line in result.stderr.splitlines() if " cell=small seed=" in line]
        assert len(lines) == 4, result.stderr
        assert sorted(line.split(" ", 1)[0] for line in lines) == ["1/4", "2/4", "3/4", "4/4"]
        assert {(line.split()[1], line.split("seed=")[1].split(":")[0]) for line in lines} == {
            (name, seed) for name in ("venus", "slime") for seed in ("0", "1")}
        out = json.loads(result.stdout)
        assert out == json.loads((tmp_path / "out.json").read_text())
        # results stay in the cases' order whatever order the runs finish in
        runs = out["cases"][0]["runs"]
        assert [(run["name"], run["seed"]) for run in runs] == [("venus", 0), ("slime", 0), ("venus", 1), ("slime", 1)]


def test_perturbations_rerun_each_seed_in_another_order_of_simultaneous_events(monkeypatch, tmp_path):
    monkeypatch.setitem(scenarios.SCENARIOS, "tiny", tiny)
    monkeypatch.setitem(simulate_cli.REFERENCES, "tiny", "venus")
    result = runner.invoke(app, ["simulate", "--scenario", "tiny", "--seeds", "2", "--perturbations", "3"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    runs = out["cases"][0]["runs"]
    assert [(run["name"], run["seed"], run["perturbation"]) for run in runs] == [
        (name, seed, k) for seed in (0, 1) for k in range(3) for name in ("venus", "slime")]
    (row,) = out["table"]
    assert row["seeds"] == 2 and row["perturbations"] == 3 and set(row["end_to_end_speedup_range"]) == {"venus", "slime"}
    assert sum(" perturbation=2:" in line for line in result.stderr.splitlines()) == 4


def test_scale_refuses_perturbations():
    result = runner.invoke(app, ["simulate", "--scenario", "scale", "--quick", "--perturbations", "2"])
    assert result.exit_code != 0 and "--perturbations" in result.output
