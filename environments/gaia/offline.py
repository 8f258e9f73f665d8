"""GAIA's bundled offline set, generated here byte for byte (`python -m environments.gaia.data build-offline`).

Offline tasks use GAIA's format (`task_id`, `Question`, `Level`, `Final answer`,
`file_name`, `file_path`) and attachments of several kinds (csv, xlsx, json, txt, docx,
pdf, png). The binary formats are written with the standard library only, with fixed
timestamps, so the generator's output is identical on every machine. Answers come from
the attachments and/or the offline web corpus in tools/web/corpus.
"""

from __future__ import annotations

import csv
import io
import json
import struct
import zipfile
import zlib
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape

__all__ = ["OFFLINE_DIR", "offline_files", "offline_tasks", "write_offline_dataset"]

OFFLINE_DIR = Path(__file__).parents[1] / "data" / "gaia" / "offline"


# ---- attachment data (the single source of both the files and the answers) ------------------

REGIONS = ["North", "South", "East", "West"]
QUARTERS = ["Q1", "Q2", "Q3", "Q4"]
PRODUCTS = ["Lamps", "Rope", "Nets"]
SALES = [
    (region, quarter, product, 100 * ((ri * 7 + qi * 5 + pi * 3) % 11 + 4) + 25 * pi)
    for ri, region in enumerate(REGIONS)
    for qi, quarter in enumerate(QUARTERS)
    for pi, product in enumerate(PRODUCTS)
]

INVENTORY = [
    ("Copper Wire", "Aldermoor", 140),
    ("Copper Wire", "Lunsby", 12),
    ("Lamp Oil", "Aldermoor", 35),
    ("Lamp Oil", "Lunsby", 48),
    ("Tar Rope", "Aldermoor", 20),
    ("Tar Rope", "Lunsby", 19),
    ("Brass Hinges", "Aldermoor", 77),
    ("Brass Hinges", "Lunsby", 3),
    ("Sail Cloth", "Aldermoor", 64),
    ("Sail Cloth", "Lunsby", 90),
]

STAFF = [
    {"name": n, "department": d, "hired": h}
    for n, d, h in [
        ("Ada Brekke", "Engineering", "2016-03-01"),
        ("Bo Lind", "Sales", "2018-07-15"),
        ("Cora Dahl", "Engineering", "2019-11-30"),
        ("Dag Moe", "Engineering", "2020-01-02"),
        ("Eli Vik", "Support", "2015-05-20"),
        ("Fia Nes", "Engineering", "2017-09-09"),
        ("Gro Aas", "Engineering", "2021-04-12"),
        ("Hal Ruud", "Sales", "2019-02-28"),
        ("Ina Berg", "Engineering", "2012-06-18"),
        ("Jon Foss", "Engineering", "2023-08-01"),
    ]
]


def _log_lines() -> list[str]:
    lines = []
    for i in range(48):
        hour, minute = 8 + i // 12, (i * 5) % 60
        level = "ERROR" if i % 5 == 2 else ("WARN" if i % 7 == 3 else "INFO")
        lines.append(
            f"2024-03-05 {hour:02d}:{minute:02d}:00 {level} worker-{i % 3} job {1000 + i} {'failed' if level == 'ERROR' else 'ok'}"
        )
    return lines


MINUTES = [
    "Minutes of the annual general meeting of the Lunsby Rowing Club",
    "Held on 12 February 2024 in the boathouse. 23 members present.",
    "1. The chair, Oskar Lien, opened the meeting at 19:00.",
    "2. The accounts for 2023 were approved.",
    "3. Elections: Oskar Lien was re-elected chair. Marta Quist was elected treasurer. Nils Eide was elected secretary.",
    "4. The club will buy two new sculls before the summer.",
    "The meeting closed at 20:40.",
]

INVOICE_LINES = [("Rope, 50 m coil", 3, 89.50), ("Brass lantern", 2, 245.00), ("Sail repair (hours)", 6, 76.25)]
INVOICE_TOTAL = round(sum(q * p for _, q, p in INVOICE_LINES), 2)

PALETTE = {"red": (220, 30, 30), "green": (30, 160, 60), "blue": (40, 70, 200), "white": (255, 255, 255)}
GRID = [[["red", "green", "blue", "white"][(r * 3 + c * 5 + (r * c) % 3) % 4] for c in range(8)] for r in range(8)]
CELL_PX = 10

VISITORS = [
    ("2023-%02d" % m, v)
    for m, v in enumerate([2100, 2350, 3020, 3680, 4410, 5590, 7240, 8160, 4930, 3110, 1840, 1390], 1)
]
LUNSBY_POPULATION = 23_910  # tools/web/corpus/wiki/lunsby.html
CALDWYN_KM = 412  # tools/web/corpus/wiki/caldwyn_river.html
PADDLING_SPEED_KMH = 8
ROUTE = {
    "trip": "source-to-sea",
    "river": "Caldwyn",
    "paddling_speed_kmh": PADDLING_SPEED_KMH,
    "notes": "no portages counted",
}


# ---- deterministic writers --------------------------------------------------------------------


def _zip(members: dict[str, str]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, text in members.items():
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            zf.writestr(info, text.encode())
    return buf.getvalue()


def _col(i: int) -> str:
    name = ""
    i += 1
    while i:
        i, rem = divmod(i - 1, 26)
        name = chr(65 + rem) + name
    return name


def make_xlsx(rows: list[list[Any]], sheet: str = "Sheet1") -> bytes:
    """A minimal valid Office Open XML workbook (inline strings, one sheet)."""
    xml_rows = []
    for r, row in enumerate(rows, 1):
        cells = []
        for c, value in enumerate(row):
            ref = f"{_col(c)}{r}"
            if isinstance(value, (int, float)):
                cells.append(f'<c r="{ref}"><v>{value}</v></c>')
            else:
                cells.append(f'<c r="{ref}" t="inlineStr"><is><t>{escape(str(value))}</t></is></c>')
        xml_rows.append(f'<row r="{r}">{"".join(cells)}</row>')
    ns = "http://schemas.openxmlformats.org"
    return _zip(
        {
            "[Content_Types].xml": (
                f'<?xml version="1.0" encoding="UTF-8" standalone="yes"?><Types xmlns="{ns}/package/2006/content-types">'
                '<Default Extension="rels" ContentType="application/vnd.openxmlformats-package.relationships+xml"/>'
                '<Default Extension="xml" ContentType="application/xml"/>'
                '<Override PartName="/xl/workbook.xml" ContentType="application/vnd.openxmlformats-officedocument.spreadsheetml.sheet.main+xml"/>'
                '<Override PartName="/xl/worksheets/sheet1.xml" ContentType="application/vnd.openxmlformats-officedocument.spreadsheetml.worksheet+xml"/>'
                "</Types>"
            ),
            "_rels/.rels": (
                f'<?xml version="1.0" encoding="UTF-8" standalone="yes"?><Relationships xmlns="{ns}/package/2006/relationships">'
                f'<Relationship Id="rId1" Type="{ns}/officeDocument/2006/relationships/officeDocument" Target="xl/workbook.xml"/>'
                "</Relationships>"
            ),
            "xl/workbook.xml": (
                f'<?xml version="1.0" encoding="UTF-8" standalone="yes"?><workbook xmlns="{ns}/spreadsheetml/2006/main" '
                f'xmlns:r="{ns}/officeDocument/2006/relationships"><sheets><sheet name="{escape(sheet)}" sheetId="1" r:id="rId1"/></sheets></workbook>'
            ),
            "xl/_rels/workbook.xml.rels": (
                f'<?xml version="1.0" encoding="UTF-8" standalone="yes"?><Relationships xmlns="{ns}/package/2006/relationships">'
                f'<Relationship Id="rId1" Type="{ns}/officeDocument/2006/relationships/worksheet" Target="worksheets/sheet1.xml"/>'
                "</Relationships>"
            ),
            "xl/worksheets/sheet1.xml": (
                f'<?xml version="1.0" encoding="UTF-8" standalone="yes"?><worksheet xmlns="{ns}/spreadsheetml/2006/main">'
                f"<sheetData>{''.join(xml_rows)}</sheetData></worksheet>"
            ),
        }
    )


def make_docx(paragraphs: list[str]) -> bytes:
    """A minimal valid WordprocessingML document."""
    ns = "http://schemas.openxmlformats.org"
    body = "".join(f'<w:p><w:r><w:t xml:space="preserve">{escape(p)}</w:t></w:r></w:p>' for p in paragraphs)
    return _zip(
        {
            "[Content_Types].xml": (
                f'<?xml version="1.0" encoding="UTF-8" standalone="yes"?><Types xmlns="{ns}/package/2006/content-types">'
                '<Default Extension="rels" ContentType="application/vnd.openxmlformats-package.relationships+xml"/>'
                '<Default Extension="xml" ContentType="application/xml"/>'
                '<Override PartName="/word/document.xml" ContentType="application/vnd.openxmlformats-officedocument.wordprocessingml.document.main+xml"/>'
                "</Types>"
            ),
            "_rels/.rels": (
                f'<?xml version="1.0" encoding="UTF-8" standalone="yes"?><Relationships xmlns="{ns}/package/2006/relationships">'
                f'<Relationship Id="rId1" Type="{ns}/officeDocument/2006/relationships/officeDocument" Target="word/document.xml"/>'
                "</Relationships>"
            ),
            "word/document.xml": (
                f'<?xml version="1.0" encoding="UTF-8" standalone="yes"?><w:document xmlns:w="{ns}/wordprocessingml/2006/main">'
                f"<w:body>{body}</w:body></w:document>"
            ),
        }
    )


def make_pdf(lines: list[str]) -> bytes:
    """A one-page PDF 1.4 with an uncompressed text stream (Helvetica) and a correct xref table."""

    def pdf_str(s: str) -> str:
        return s.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")

    ops = ["BT", "/F1 12 Tf", "72 760 Td", "16 TL"] + [f"({pdf_str(line)}) '" for line in lines] + ["ET"]
    stream = "\n".join(ops).encode("latin-1")
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R /Resources << /Font << /F1 5 0 R >> >> >>",
        b"<< /Length " + str(len(stream)).encode() + b" >>\nstream\n" + stream + b"\nendstream",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for i, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += f"{i} 0 obj\n".encode() + body + b"\nendobj\n"
    xref = len(out)
    out += f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode()
    out += b"".join(f"{o:010d} 00000 n \n".encode() for o in offsets)
    out += f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n".encode()
    return bytes(out)


def make_png(grid: list[list[str]], cell: int = CELL_PX) -> bytes:
    """An 8-bit RGB PNG of coloured square cells."""
    height, width = len(grid) * cell, len(grid[0]) * cell
    raw = bytearray()
    for y in range(height):
        raw.append(0)  # filter type: none
        for x in range(width):
            raw += bytes(PALETTE[grid[y // cell][x // cell]])

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(bytes(raw), 9))
        + chunk(b"IEND", b"")
    )


def _csv(rows: list[list[Any]]) -> bytes:
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(rows)
    return buf.getvalue().encode()


def offline_files() -> dict[str, bytes]:
    """Every attachment of the offline set, by file name."""
    return {
        "harbour_sales_2023.csv": _csv([["region", "quarter", "product", "revenue_usd"], *map(list, SALES)]),
        "warehouse_stock.xlsx": make_xlsx([["Item", "Warehouse", "Units in stock"], *map(list, INVENTORY)], "Stock"),
        "staff_directory.json": (
            json.dumps({"company": "Vellmar Marine Supply", "employees": STAFF}, indent=2) + "\n"
        ).encode(),
        "worker_log.txt": ("\n".join(_log_lines()) + "\n").encode(),
        "rowing_club_agm_2024.docx": make_docx(MINUTES),
        "invoice_4471.pdf": make_pdf(
            ["Vellmar Marine Supply - Invoice 4471", "Date: 2024-04-02", ""]
            + [f"{name}: {qty} x ${price:,.2f} = ${qty * price:,.2f}" for name, qty, price in INVOICE_LINES]
            + ["", f"Total due: ${INVOICE_TOTAL:,.2f}"]
        ),
        "colour_grid.png": make_png(GRID),
        "lunsby_visitors_2023.csv": _csv([["town", "month", "visitors"], *(["Lunsby", m, v] for m, v in VISITORS)]),
        "paddling_trip.json": (json.dumps(ROUTE, indent=2) + "\n").encode(),
    }


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def offline_tasks() -> list[dict[str, Any]]:
    """The offline tasks in GAIA's metadata format (file_path relative to the data dir)."""
    north_q3 = sum(r for reg, q, _, r in SALES if reg == "North" and q == "Q3")
    totals: dict[str, int] = {}
    for item, _, units in INVENTORY:
        totals[item] = totals.get(item, 0) + units
    early_engineers = sum(1 for s in STAFF if s["department"] == "Engineering" and s["hired"] < "2020-01-01")
    morning_errors = sum(1 for line in _log_lines() if " ERROR " in line and "10:00:00" <= line[11:19] <= "11:59:59")
    reds = sum(row.count("red") for row in GRID)
    visitors = sum(v for _, v in VISITORS)
    specs = [
        (
            "csv-sales",
            1,
            "harbour_sales_2023.csv",
            "The attached CSV lists 2023 sales by region, quarter and product. What was the total revenue, in US dollars, "
            "of the North region in Q3?",
            _num(north_q3),
        ),
        (
            "xlsx-stock",
            1,
            "warehouse_stock.xlsx",
            "The attached spreadsheet lists stock per item and warehouse. Which item has the smallest total number of "
            "units across all warehouses?",
            min(totals, key=totals.__getitem__),
        ),
        (
            "json-staff",
            1,
            "staff_directory.json",
            "According to the attached staff directory, how many employees of the Engineering department were hired "
            "before 2020?",
            _num(early_engineers),
        ),
        (
            "txt-log",
            1,
            "worker_log.txt",
            "How many ERROR entries in the attached log were written between 10:00 and 11:59 (inclusive)?",
            _num(morning_errors),
        ),
        (
            "docx-minutes",
            1,
            "rowing_club_agm_2024.docx",
            "Who was elected treasurer at the meeting recorded in the attached minutes? Give the full name.",
            "Marta Quist",
        ),
        (
            "pdf-invoice",
            1,
            "invoice_4471.pdf",
            "What is the total amount due on the attached invoice, in US dollars?",
            _num(INVOICE_TOTAL),
        ),
        (
            "png-grid",
            2,
            "colour_grid.png",
            "The attached image is a grid of coloured square cells, 8 by 8. How many of the cells are red?",
            _num(reds),
        ),
        ("web-lighthouse-year", 1, "", "In what year was the Halvorsen Point Lighthouse first lit?", "1887"),
        (
            "web-architect-town",
            2,
            "",
            "In which town was the architect of the Halvorsen Point Lighthouse born?",
            "Tromvik",
        ),
        (
            "web-orvane-moons",
            2,
            "",
            "List the known moons of the planet Orvane in alphabetical order, as a comma separated list.",
            "Aurel, Brin, Tessaly",
        ),
        (
            "json-web-paddling",
            3,
            "paddling_trip.json",
            "The attached file describes a paddling trip. Using the river's full length as given in the Vellmar "
            "Encyclopedia, how many hours does the trip take at the stated speed?",
            _num(CALDWYN_KM / PADDLING_SPEED_KMH),
        ),
        (
            "csv-web-visitors",
            3,
            "lunsby_visitors_2023.csv",
            "The attached file counts 2023 visitors to a town by month. Divide the year's total by the town's population "
            "at the 2021 census and round to two decimal places.",
            _num(round(visitors / LUNSBY_POPULATION, 2)),
        ),
    ]
    return [
        {
            "task_id": f"offline-{key}",
            "Question": q,
            "Level": level,
            "Final answer": answer,
            "file_name": name,
            "file_path": name,
        }
        for key, level, name, q, answer in specs
    ]


def write_offline_dataset(dest: Path = OFFLINE_DIR) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    for name, data in offline_files().items():
        (dest / name).write_bytes(data)
    lines = "".join(json.dumps(t, ensure_ascii=False) + "\n" for t in offline_tasks())
    (dest / "metadata.jsonl").write_text(lines, encoding="utf-8")
    return dest
