"""python/README.md's worked examples run as written: every ```python block, in order, in one
namespace (a failing example fails here, with the block's number)."""
import pathlib
import re

README = pathlib.Path(__file__).resolve().parents[2] / "python" / "README.md"


def test_readme_python_blocks_run():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert len(blocks) >= 8, "the README's worked examples are missing"
    ns = {}
    for i, code in enumerate(blocks):
        try:
            exec(compile(code, f"python/README.md block {i}", "exec"), ns)
        except Exception as e:
            raise AssertionError(f"python/README.md example {i} failed: {e!r}\n{code}") from e
