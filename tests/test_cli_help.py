"""Every bkctl command answers --help, and every leaf command shows an example."""

from click.testing import CliRunner

from cli.main import cli


def _walk(group, path=()):
    for name, cmd in sorted(group.commands.items()):
        yield path + (name,), cmd
        if hasattr(cmd, "commands"):
            yield from _walk(cmd, path + (name,))


def test_top_level_help():
    result = CliRunner().invoke(cli, ["--help"])
    assert result.exit_code == 0, result.output
    assert "Usage:" in result.output


def test_every_command_has_help_with_example():
    runner = CliRunner()
    for path, cmd in _walk(cli):
        result = runner.invoke(cli, [*path, "--help"])
        assert result.exit_code == 0, (path, result.output)
        if not hasattr(cmd, "commands"):
            assert "Example" in result.output, f"bkctl {' '.join(path)} --help lacks an example"


def test_no_listed_summary_is_cut_off():
    """Every group's command list shows whole sentences: no summary ends in
    "...", also on a terminal narrower than 80 columns (click's 45)."""
    runner = CliRunner()
    for path, cmd in [((), cli), *_walk(cli)]:
        if not hasattr(cmd, "commands"):
            continue
        out = runner.invoke(cli, [*path, "--help"]).output
        listed = out.split("Commands:", 1)[1].splitlines()
        assert listed and not [row for row in listed if row.rstrip().endswith("...")], \
            (path, out)
        for name, sub in cmd.commands.items():
            summary = sub.get_short_help_str(limit=45)
            assert summary and not summary.endswith("..."), (path, name, summary)
