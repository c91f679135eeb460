"""report/layout.py: figures and typed names never cut, prose under the table, shortened names
never made to look alike."""

from __future__ import annotations

import io

from rich.console import Console

from dsv4opt.report.layout import Column, natural_width, print_table


def _render(width, columns, rows, **kw) -> list[str]:
    out = io.StringIO()
    print_table(Console(file=out, width=width, color_system=None), columns, rows, **kw)
    return out.getvalue().splitlines()


COLUMNS = [Column("name"), Column("share", right=True), Column("launches\n/step", right=True, optional=True),
           Column("risk", below=True)]
ROWS = [["grouped-moe *", "97.6%", "129", "new MoE kernels; bf16 rounding of the activation rows, routing unchanged"],
        ["fp8-weights", "0.2%", "619", "weight quantisation changes every logit"]]


def test_prose_goes_under_the_table_and_every_line_fits():
    lines = _render(40, COLUMNS, ROWS)
    assert all(len(line) <= 40 for line in lines)
    table = "\n".join(lines[: next(i for i, line in enumerate(lines) if "risk:" in line)])
    assert "grouped-moe *" in table and "97.6%" in table and "129" in table and "risk" not in table
    assert "routing" in "\n".join(lines) and "new MoE" not in table


def test_an_optional_column_moves_under_the_table_rather_than_be_squeezed():
    wide = natural_width(COLUMNS[:3], [r[:3] for r in ROWS])
    lines = _render(wide - 1, COLUMNS, ROWS)
    header = next(line for line in lines if "name" in line)
    notes = " ".join(line.strip() for line in lines[4:])
    assert "launches" not in header and "grouped-moe * launches/step: 129; risk: new" in notes
    assert "launches" in "\n".join(_render(wide, COLUMNS, ROWS)[:2])


def test_shortened_names_never_read_alike():
    columns = [Column("kernel", shrink=True), Column("after", right=True)]
    rows = [["elementwise_kernel<128, 2, gpu_kernel_impl_nocast>", "1.16 ms"],
            ["elementwise_kernel<128, 4, gpu_kernel_impl_nocast>", "471.7 µs"],
            ["reduce_kernel<512, 1, ReduceOp>", "426.7 µs"]]
    lines = _render(30, columns, rows)
    labels = [line.split("  ")[0].strip() for line in lines[2:] if line.strip()]
    assert len(set(labels)) == len(labels) == 3, labels  # cut, yet three different kernels read differently
    assert any("2," in x for x in labels) and any("4," in x for x in labels), labels
    assert "1.16 ms" in "\n".join(lines) and all(len(line) <= 30 for line in lines)
    # with room to tell them apart, each is cut once, with an ellipsis, on one line
    lines = _render(44, columns, rows)
    assert len(lines) == 5 and sum("…" in line for line in lines) == 2
