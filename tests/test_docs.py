"""The README stays a page a newcomer reads, and the docs' table of cost terms is the code's."""

from pathlib import Path

from fixtures.scripts import load_script

ROOT = Path(__file__).resolve().parent.parent


def test_the_docs_table_of_terms_is_generated_from_the_code():
    table = load_script("terms_table")
    text = table.DOC.read_text()
    assert table.with_table(text) == text, "run: python scripts/terms_table.py --write"
    from planner.cost import costmodel

    for term in costmodel.TERMS:  # every row is there, by name
        assert f"| {term.name} |" in text


def test_the_readme_is_short_and_points_to_the_docs():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 260
    for doc in ("docs/commands.md", "docs/cost-model.md", "docs/exports.md", "docs/files-and-benchmarks.md"):
        assert doc in text and (ROOT / doc).exists()
