"""The doc-block runner fails a block that does not do what its document
says (tests/support/doc_run.py): a python block that raises, a bkctl line
with a wrong option, an output other than the one a comment states, a
stated output nothing checks, a check the document no longer needs, a
config snippet the loader refuses, a block it cannot run.  No appliance:
each of these fails before one is needed."""

from __future__ import annotations

import click
import pytest

from tests.support.doc_blocks import parse
from tests.support.doc_run import DocRunError, DocRunner, ShLine, check_bench_block, sh_lines
from tests.support.launch import write_config


@pytest.fixture
def runner(tmp_path):
    return DocRunner(write_config(tmp_path, 1, quorums=(1, 1, 1)), tmp_path)


def _doc(tmp_path, text: str):
    path = tmp_path / "doc.md"
    path.write_text(text)
    return path


def test_a_python_block_that_raises_fails_naming_its_line(runner, tmp_path):
    doc = _doc(tmp_path, "# t\n\n```python\nraise RuntimeError('the doc is wrong')\n```\n")
    with pytest.raises(DocRunError, match=r"doc.md:3 \(python\).*RuntimeError: the doc is wrong"):
        runner.run_document(doc)


def test_a_python_block_runs_against_the_test_config(runner, tmp_path):
    doc = _doc(tmp_path, '```python\nimport pathlib\nprint(pathlib.Path("configs/local.toml")'
                         '.name)\n```\n')
    seen = []
    runner.checks["print("] = seen.append
    runner.run_document(doc)
    assert seen == ["appliance.toml\n"]  # the document's config replaced by the test's


def test_a_bkctl_line_with_a_wrong_option_fails(runner, tmp_path):
    doc = _doc(tmp_path, "```sh\nbkctl ledger list --no-such-option\n```\n")
    with pytest.raises(DocRunError, match=r"doc.md:2: 'bkctl ledger list --no-such-option' "
                                          r"exited 2: .*No such option"):
        runner.run_document(doc)


def test_an_output_other_than_the_stated_one_fails(runner):
    line = ShLine("doc.md:5", "bkctl ledger append -", "prints its id: 0")
    runner.check(line, "0\n")
    with pytest.raises(DocRunError, match="printed '7\\\\n'; the document says 0"):
        runner.check(line, "7\n")


def test_a_stated_output_nothing_checks_fails(runner):
    line = ShLine("doc.md:5", "bkctl ledger meta 0", "CLOSED, last entry 999")
    with pytest.raises(DocRunError, match="nothing checks it"):
        runner.check(line, "ledger 0: CLOSED")


def test_a_check_the_document_no_longer_needs_fails(runner, tmp_path):
    runner.checks["bkctl ledger meta 0"] = lambda out: None
    with pytest.raises(DocRunError, match="found nothing to check"):
        runner.run_document(_doc(tmp_path, "no blocks\n"))


def test_a_config_snippet_the_loader_refuses_fails(runner, tmp_path):
    doc = _doc(tmp_path, "```toml\n[cold_storage]\nuri = \"cold\"\nno_such_key = 1\n```\n")
    with pytest.raises(DocRunError, match="the config loader refuses it: .*no_such_key"):
        runner.run_document(doc)
    runner.run_document(_doc(tmp_path, "```toml\n[cold_storage]\nuri = \"cold\"\n```\n"))


def test_blocks_it_cannot_run_fail_unless_skipped_with_a_reason(runner, tmp_path):
    with pytest.raises(DocRunError, match="tag it sh, python or toml"):
        runner.run_document(_doc(tmp_path, "```\nbkctl bench log\n```\n"))
    with pytest.raises(DocRunError, match="cannot run 'rm -rf data'"):
        runner.run_document(_doc(tmp_path, "```sh\nrm -rf data\n```\n"))
    runner.run_document(_doc(tmp_path, "<!-- doc-test: skip (a benchmark) -->\n"
                                       "```\nbkctl bench log\n```\n"))
    assert runner.done == ["doc.md:2 (no language): not run here (a benchmark)".replace(
        "doc.md", str(tmp_path / "doc.md"))]


def test_lines_and_comments_of_an_sh_block():
    [block] = parse("```sh\nsource .venv/bin/activate\n\nseq 1 3 | bkctl ledger append -  "
                    "# prints its id: 0\nbkctl log read x --follow   # tails until Ctrl-C\n```\n",
                    "d.md")
    lines = sh_lines(block)
    assert [(x.where, x.command, x.comment) for x in lines] == [
        ("d.md:2", "source .venv/bin/activate", None),
        ("d.md:4", "seq 1 3 | bkctl ledger append -", "prints its id: 0"),
        ("d.md:5", "bkctl log read x --follow", "tails until Ctrl-C")]
    assert [x.runs_until_ctrl_c for x in lines] == [False, False, True]




def test_a_benchmark_block_left_unrun_must_still_parse_and_be_run_elsewhere(tmp_path):
    """check_bench_block: a wrong option, a bench no test runs, or a line
    that is not a bench fails it."""
    covered = tmp_path / "test_x.py"
    covered.write_text('invoke(cli, ["bench", "log", "--records", "10"])\n')

    def block(text):
        return parse(f"<!-- doc-test: skip (minutes) -->\n```sh\n{text}\n```\n", "d.md")[0]

    assert check_bench_block(block("bkctl bench log --producers 8 --json  # 8"), [covered]) \
        == ["log"]
    with pytest.raises(click.UsageError, match="no-such-option"):
        check_bench_block(block("bkctl bench log --no-such-option"), [covered])
    with pytest.raises(DocRunError, match="bench write is run by none of"):
        check_bench_block(block("bkctl bench write"), [covered])
    with pytest.raises(DocRunError, match="bkctl bench commands only"):
        check_bench_block(block("ls -l"), [covered])
