"""The table of cost terms in docs/cost-model.md, generated from the code (planner/cost/terms.py).

    .venv/bin/python scripts/terms_table.py            # print it
    .venv/bin/python scripts/terms_table.py --write    # write it between the markers in docs/cost-model.md
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from planner.cost.terms import terms_markdown  # noqa: E402

DOC = ROOT / "docs" / "cost-model.md"
BEGIN, END = "<!-- terms:begin -->\n", "<!-- terms:end -->"


def with_table(text: str) -> str:
    """`text` with the generated table between its markers."""
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return head + BEGIN + terms_markdown() + END + tail


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"write the table into {DOC.relative_to(ROOT)}")
    args = parser.parse_args()
    if args.write:
        DOC.write_text(with_table(DOC.read_text()))
    else:
        print(terms_markdown(), end="")


if __name__ == "__main__":
    main()
