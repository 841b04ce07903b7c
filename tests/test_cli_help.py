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
