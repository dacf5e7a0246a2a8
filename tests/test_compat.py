"""docs/compatibility.md's SGLang table shows the SGLang versions of the matrix `rlkit doctor` reads."""

from __future__ import annotations

from pathlib import Path

from rlkit.core import compat

DOCS = Path(__file__).resolve().parents[1] / "docs" / "compatibility.md"


def _sglang_table() -> dict[str, dict[str, str]]:
    section = DOCS.read_text().split("## SGLang", 1)[1].split("\n## ", 1)[0]
    header, *rows = [line for line in section.splitlines() if line.startswith("| ") and "---" not in line]
    columns = [cell.strip() for cell in header.strip("|").split("|")]
    assert columns[:2] == ["setup", "sglang"]
    table = {}
    for row in rows:
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        if cells[0] not in compat.TESTED:
            break  # the next table (releases per torch) starts
        table[cells[0]] = dict(zip(columns[1:], cells[1:]))
    return table


def test_the_sglang_rows_show_the_tested_versions():
    table = _sglang_table()
    assert set(table) == set(compat.TESTED)
    for setup, tested in compat.TESTED.items():
        assert table[setup]["sglang"] == tested.get("sglang", "-"), setup
        assert table[setup]["torch"] == tested["torch"], setup
        assert table[setup]["python"] == tested["python"], setup
