"""`kvsim run` at the command line: exit codes and one-line errors."""

from __future__ import annotations

from typer.testing import CliRunner

from sim.cli.main import app

runner = CliRunner()


def test_missing_scenario_is_one_line_and_exit_2(tmp_path):
    result = runner.invoke(app, ["run", str(tmp_path / "nope.yaml"), "--no-plots"])
    assert result.exit_code == 2
    assert result.output.strip() == f"error: {tmp_path / 'nope.yaml'}: no such file"


def test_error_text_with_brackets_is_not_eaten_as_markup(tmp_path):
    """Regression: rich markup swallowed "[calibrate]" in "pip install -e '.[calibrate]'"."""
    path = tmp_path / "scenario[1].yaml"
    result = runner.invoke(app, ["run", str(path), "--no-plots"])
    assert result.exit_code == 2
    assert "scenario[1].yaml: no such file" in result.output


def test_unknown_override_key_names_the_key(tmp_path):
    result = runner.invoke(
        app, ["run", "--set", "cache.bogus=1", "--no-plots", "-o", str(tmp_path)]
    )
    assert result.exit_code == 2
    assert "unknown key 'bogus' in 'cache'" in result.output
    assert "Traceback" not in result.output


def test_run_writes_tables_plots_and_the_scenario(tmp_path):
    out = tmp_path / "run"
    result = runner.invoke(app, ["run", "--set", "workload.first_n=30", "-o", str(out)])
    assert result.exit_code == 0, result.output
    for name in ("requests", "steps", "violations"):
        assert (out / f"{name}.parquet").exists() and (out / f"{name}.csv").exists()
    assert (out / "kv_timeline.png").stat().st_size > 1000
    again = runner.invoke(
        app, ["run", str(out / "scenario.yaml"), "--no-plots", "-o", str(tmp_path / "again")]
    )
    assert again.exit_code == 0, again.output
    assert (tmp_path / "again" / "requests.csv").read_bytes() == (out / "requests.csv").read_bytes()
