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

from planner.cost.quantities import COMBINE, QUANTITY_DECLARATIONS  # noqa: E402
from planner.cost.terms import TERMS  # noqa: E402

DOC = ROOT / "docs" / "cost-model.md"
BEGIN, END = "<!-- terms:begin -->\n", "<!-- terms:end -->"


def terms_markdown() -> str:
    """The quantities and every term of planner/cost/terms.py as Markdown tables (docs/cost-model.md holds this
    text; tests/test_docs.py holds the two to each other)."""
    out = ["| quantity | combines as | what |", "|---|---|---|"]
    out += [f"| `{q.name}` | {q.combine}: {COMBINE[q.combine]} | {q.meaning} |" for q in QUANTITY_DECLARATIONS]
    out += ["", "| term | quantity | applies to | source |", "|---|---|---|---|"]
    places = {"layer": "each layer", "open": "the stage's first layer", "close": "the stage's last layer",
              "stage": "the stage's position"}
    out += [f"| {t.name} | `{t.quantity}` | {places[t.where]} | {t.source.replace('|', '/')} |" for t in TERMS]
    return "\n".join(out) + "\n"


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
