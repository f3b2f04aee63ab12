"""Text from data, made safe where it is shown: on a terminal, and in a CSV file a spreadsheet opens.

A class name, a sample key, a path in a listing or an index comes from a stranger. Printed as it is, an
escape sequence in it clears or rewrites the screen, a bidi override shows its text reversed (a key that
reads as another), a line break forges a line of output, and rich markup (`[/circle]`) stops a rich table
with a traceback. In a CSV cell, text that starts with `=`, `+`, `-` or `@` is a formula to a spreadsheet
(OWASP "CSV injection"), which can fetch URLs or run commands when the file is opened.

`shown(text)` is what a terminal gets: each control character (C0, DEL, C1), line or paragraph separator,
bidi control and lone surrogate (a file name's byte that is no UTF-8) as a Python-style escape (`\\x1b`,
`\\n`, `\\u202e`, `\\udcff`), so the line stays one line and every character stays visible; `markup=True`
escapes rich markup too, for text that rich renders (a table cell, a progress bar's description, a metric name
in Lightning's table). `csv_cell` and `csv_value` are a CSV cell's way there and back: a leading quote (OWASP's
advice) on what a spreadsheet would run, taken off exactly when the project reads its own file back.
"""

from __future__ import annotations

import re
import reprlib
from typing import Any

from rich.markup import escape

# C0 (tab and line breaks included), DEL and C1 controls; U+061C, U+200E-F: bidi marks; U+2028-9: line and
# paragraph separators (splitlines() breaks there); U+202A-E, U+2066-9: bidi embeddings, overrides, isolates;
# U+D800-DFFF: lone surrogates, a file name's bytes that are no UTF-8 (`\udc9b` is a raw 0x9b, the 8-bit CSI,
# where stdout writes them back as bytes, and a UnicodeEncodeError where it is strict)
UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
# what starts a formula in Excel, LibreOffice or Google Sheets (OWASP), and the quote that marks our escape
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r", "\n")
QUOTE = "'"


def _escaped(match: re.Match[str]) -> str:
    character = match.group()
    if character in "\t\n\r":
        return {"\t": "\\t", "\n": "\\n", "\r": "\\r"}[character]
    code = ord(character)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def shown(text: object, *, markup: bool = False) -> str:
    """`text` as a terminal may show it: controls and bidi characters as escapes; with `markup`, rich markup
    escaped as well (for a string that rich renders on its own, where `[/x]` would be a tag). A backslash in
    the text is left as it is: a Windows path stays readable, at the cost of `\\x1b` typed out in a name
    looking like an escaped one."""
    safe = UNSAFE.sub(_escaped, str(text))
    if not markup:
        return safe
    escaped = escape(safe)
    # rich doubles a last backslash in case a tag follows; rendered on its own (a cell, a metric name) it
    # would show twice, so the string is escaped for rendering alone
    return escaped[:-1] if escaped.endswith("\\\\") and not safe.endswith("\\\\") else escaped


def csv_cell(value: object) -> object:
    """A CSV cell that a spreadsheet shows as text: a string starting as a formula (or with the quote that
    marks one) gets a leading `'`. Numbers and other values are written as they are."""
    if isinstance(value, str) and value.startswith((*FORMULA_STARTS, QUOTE)):
        return QUOTE + value
    return value


def csv_value(cell: str) -> str:
    """What `csv_cell` was given, from the cell it wrote: the one leading `'` it added is taken off. A cell
    it did not change (no `'` before a formula start or a quote) comes back as it is, so a file a person
    saved from a spreadsheet that dropped the quote reads the same."""
    if cell.startswith(QUOTE) and cell[1:].startswith((*FORMULA_STARTS, QUOTE)):
        return cell[1:]
    return cell


def abbreviated(value: Any, width: int = 60, levels: int = 3) -> str:
    """A stranger's value for a message, in at most `width` characters: reprlib's abbreviation (`levels` deep, 6
    items a level), as repr of a list nested 100,000 deep raises RecursionError, and of one whose items are one
    list twice, 100 deep, never ends."""
    short = reprlib.Repr()
    short.maxlevel, short.maxstring, short.maxother, short.maxlong = levels, width, width, width
    text = short.repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."
