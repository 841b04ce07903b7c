"""The extractor the doc-running tests stand on: it finds every block, keeps
its language and line, honours a skip only with a reason, and refuses a
broken document rather than running part of it."""

import pytest

from tests.support.doc_blocks import DocBlockError, parse

DOC = """# Title

```sh
bkctl status
```

Some prose.

<!-- doc-test: skip (stays in the foreground) -->
```sh
make run
```

  ```python
  print("indented")
  ```
"""


def test_every_block_with_language_line_and_text():
    found = parse(DOC, "d.md")
    assert [(b.lang, b.line) for b in found] == [("sh", 3), ("sh", 10), ("python", 14)]
    assert found[0].text == "bkctl status\n"
    assert found[2].text == 'print("indented")\n'
    assert found[0].skip_reason is None
    assert found[1].skip_reason == "stays in the foreground"
    assert str(found[1]) == "d.md:10 (sh)"


def test_a_skip_without_a_reason_is_refused():
    with pytest.raises(DocBlockError, match="needs a reason"):
        parse("<!-- doc-test: skip -->\n```sh\nls\n```\n", "d.md")


def test_an_unclosed_block_is_refused():
    with pytest.raises(DocBlockError, match="d.md:2: code block never closed"):
        parse("text\n```python\nprint(1)\n", "d.md")
