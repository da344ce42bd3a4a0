"""Reads SWORD zText Bible modules in pure Python and cleans their OSIS markup.

docs/formulas.md §5. A zText module stores each testament (`ot`, `nt`) in three files:

    <t>.bzs  [N_blocks] x (uint32 offset, uint32 size, uint32 raw_size)  into .bzz
    <t>.bzz  zlib-compressed blocks
    <t>.bzv  [N_slots]  x (uint32 block, uint32 offset, uint16 size)     into a raw block

all little-endian. Slots follow the versification order: slot 0 is the module
heading, slot 1 the testament heading, then for every book a book heading slot
and for every chapter a chapter heading slot followed by one slot per verse.
Both modules used here (`engKJV2006eb`, `spaRV1909eb`) declare
`Versification=KJV`, so slot i of one is slot i of the other.

The chapter/verse layout is recovered from the modules themselves (every
chapter heading slot opens with an OSIS `<chapter sID="Book.N"/>` milestone)
and checked against the KJV totals (66 books, 1,189 chapters, 31,102 verses),
so no versification table has to be copied in.

Shape glossary: N_slots verse slots per testament, N_blocks compressed blocks.
"""

from __future__ import annotations

import dataclasses
import html
import os
import re
import zlib
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from attention_jax.data import paths

__all__ = [
    "MODULES", "INSTALL_HINT", "SwordModuleError", "Verse", "VersePair",
    "default_search_paths", "find_sword_root", "module_dir", "read_ztext",
    "clean_osis", "read_module", "read_parallel",
]

# Language code -> SWORD module name (Debian packages sword-text-kjv / -sparv).
MODULES = {"en": "engKJV2006eb", "es": "spaRV1909eb"}
INSTALL_HINT = ("Install them with `sudo apt-get install sword-text-kjv sword-text-sparv` "
                "(system-wide, /usr/share/sword) or, without root, `make sword` "
                "(runs scripts/fetch_sword.sh, which unpacks the Debian packages "
                "into the cache folder).")

TESTAMENTS = ("ot", "nt")
# KJV versification totals used to validate the layout recovered from the markup.
_SLOTS = {"ot": 24_115, "nt": 8_246}
_BOOKS = {"ot": 39, "nt": 27}
_CHAPTERS = {"ot": 929, "nt": 260}
_VERSES = {"ot": 23_145, "nt": 7_957}

# OSIS book id -> English name used in verse references ('Genesis 1:1').
BOOK_NAMES = {
    "Gen": "Genesis", "Exod": "Exodus", "Lev": "Leviticus", "Num": "Numbers",
    "Deut": "Deuteronomy", "Josh": "Joshua", "Judg": "Judges", "Ruth": "Ruth",
    "1Sam": "1 Samuel", "2Sam": "2 Samuel", "1Kgs": "1 Kings", "2Kgs": "2 Kings",
    "1Chr": "1 Chronicles", "2Chr": "2 Chronicles", "Ezra": "Ezra",
    "Neh": "Nehemiah", "Esth": "Esther", "Job": "Job", "Ps": "Psalms",
    "Prov": "Proverbs", "Eccl": "Ecclesiastes", "Song": "Song of Solomon",
    "Isa": "Isaiah", "Jer": "Jeremiah", "Lam": "Lamentations", "Ezek": "Ezekiel",
    "Dan": "Daniel", "Hos": "Hosea", "Joel": "Joel", "Amos": "Amos",
    "Obad": "Obadiah", "Jonah": "Jonah", "Mic": "Micah", "Nah": "Nahum",
    "Hab": "Habakkuk", "Zeph": "Zephaniah", "Hag": "Haggai", "Zech": "Zechariah",
    "Mal": "Malachi",
    "Matt": "Matthew", "Mark": "Mark", "Luke": "Luke", "John": "John",
    "Acts": "Acts", "Rom": "Romans", "1Cor": "1 Corinthians",
    "2Cor": "2 Corinthians", "Gal": "Galatians", "Eph": "Ephesians",
    "Phil": "Philippians", "Col": "Colossians", "1Thess": "1 Thessalonians",
    "2Thess": "2 Thessalonians", "1Tim": "1 Timothy", "2Tim": "2 Timothy",
    "Titus": "Titus", "Phlm": "Philemon", "Heb": "Hebrews", "Jas": "James",
    "1Pet": "1 Peter", "2Pet": "2 Peter", "1John": "1 John", "2John": "2 John",
    "3John": "3 John", "Jude": "Jude", "Rev": "Revelation",
}

_BZS = np.dtype([("offset", "<u4"), ("size", "<u4"), ("raw_size", "<u4")])
_BZV = np.dtype([("block", "<u4"), ("offset", "<u4"), ("size", "<u2")])


class SwordModuleError(ValueError):
  """A SWORD module is missing, unreadable or not laid out as expected."""


@dataclasses.dataclass(frozen=True)
class Verse:
  """One verse slot: `ref` like 'Genesis 1:1', `slot` its index in the testament."""
  testament: str
  slot: int
  book: str  # OSIS id, e.g. 'Gen'
  chapter: int
  verse: int

  @property
  def ref(self) -> str:
    return f"{BOOK_NAMES[self.book]} {self.chapter}:{self.verse}"


@dataclasses.dataclass(frozen=True)
class VersePair:
  ref: str
  en: str
  es: str


def default_search_paths() -> list[Path]:
  """SWORD roots tried when no path is given: system-wide, then the project cache."""
  return [Path("/usr/share/sword"), paths.cache_root() / "sword" / "usr" / "share" / "sword"]


def module_dir(root: str | os.PathLike, module: str) -> Path:
  """`<root>/modules/texts/ztext/<module>` (as in the .conf's DataPath), or the
  lower-cased folder name some packagings use, whichever exists."""
  base = Path(root) / "modules" / "texts" / "ztext"
  for name in (module, module.lower()):
    if (base / name).is_dir():
      return base / name
  return base / module


def _has_modules(root: Path, modules: Iterable[str]) -> bool:
  return all((module_dir(root, m) / "ot.bzz").is_file() for m in modules)


def find_sword_root(path: str | os.PathLike | None = None,
                    modules: Sequence[str] = tuple(MODULES.values())) -> Path:
  """Returns the first SWORD root holding every module in `modules`.

  Args:
    path: an explicit SWORD root (the folder holding `mods.d/` and `modules/`),
      e.g. from `--sword_path`. When given, only this path is tried.
    modules: module names that must all be present.

  Raises:
    SwordModuleError: naming every folder tried and the install command.
  """
  candidates = [Path(path).expanduser()] if path is not None else default_search_paths()
  for root in candidates:
    if _has_modules(root, modules):
      return root
  tried = ", ".join(str(c) for c in candidates)
  what = "the explicit path (`sword_path` / `--sword_path`)" if path is not None else "any of"
  raise SwordModuleError(
      f"SWORD modules {', '.join(modules)} not found in {what}: {tried}. {INSTALL_HINT}")


def _read_records(path: Path, dtype: np.dtype) -> np.ndarray:
  if not path.is_file():
    raise SwordModuleError(f"missing SWORD module file {path}. {INSTALL_HINT}")
  raw = path.read_bytes()
  if len(raw) % dtype.itemsize:
    raise SwordModuleError(
        f"corrupt SWORD module file {path}: {len(raw)} bytes is not a multiple of "
        f"the {dtype.itemsize}-byte record size. Reinstall the module. {INSTALL_HINT}")
  return np.frombuffer(raw, dtype=dtype)


def read_ztext(directory: str | os.PathLike, testament: str) -> list[str]:
  """Raw OSIS text of every slot of one testament, `''` for empty slots.

  Args:
    directory: the module folder holding `ot.bzs`, `ot.bzv`, `ot.bzz`, ...
    testament: 'ot' or 'nt'.

  Returns:
    A list of `N_slots` strings (UTF-8 decoded, markup untouched).
  """
  if testament not in TESTAMENTS:
    raise ValueError(f"`testament` must be one of {TESTAMENTS}, got {testament!r}.")
  directory = Path(directory)
  blocks = _read_records(directory / f"{testament}.bzs", _BZS)  # [N_blocks]
  slots = _read_records(directory / f"{testament}.bzv", _BZV)  # [N_slots]
  bzz_path = directory / f"{testament}.bzz"
  if not bzz_path.is_file():
    raise SwordModuleError(f"missing SWORD module file {bzz_path}. {INSTALL_HINT}")
  compressed = bzz_path.read_bytes()
  cache: dict[int, bytes] = {}

  def block(i: int) -> bytes:
    if i not in cache:
      if i >= len(blocks):
        raise SwordModuleError(
            f"corrupt SWORD module: {directory / (testament + '.bzv')} points at block "
            f"{i} but {directory / (testament + '.bzs')} lists {len(blocks)} blocks.")
      offset, size, raw_size = (int(v) for v in blocks[i])
      if offset + size > len(compressed):
        raise SwordModuleError(
            f"corrupt SWORD module file {bzz_path}: block {i} ends at byte "
            f"{offset + size}, the file has {len(compressed)} bytes.")
      try:
        data = zlib.decompress(compressed[offset:offset + size])
      except zlib.error as e:
        raise SwordModuleError(
            f"corrupt SWORD module file {bzz_path}: block {i} does not inflate ({e}).") from None
      if len(data) != raw_size:
        raise SwordModuleError(
            f"corrupt SWORD module file {bzz_path}: block {i} inflates to {len(data)} "
            f"bytes, {directory / (testament + '.bzs')} says {raw_size}.")
      cache[i] = data
    return cache[i]

  texts = []
  for b, offset, size in slots.tolist():
    if size == 0:
      texts.append("")
      continue
    data = block(b)
    if offset + size > len(data):
      raise SwordModuleError(
          f"corrupt SWORD module file {directory / (testament + '.bzv')}: a verse "
          f"runs past the end of block {b}.")
    try:
      texts.append(data[offset:offset + size].decode("utf-8"))
    except UnicodeDecodeError as e:
      raise SwordModuleError(
          f"corrupt SWORD module file {bzz_path}: verse bytes are not UTF-8 ({e}).") from None
  return texts


# --- OSIS cleaning ----------------------------------------------------------

# Notes and titles go with their contents (footnotes, Psalm superscriptions
# that KJV keeps in the chapter heading, section headings).
_DROP = re.compile(r"<(note|title)\b[^>]*(?<!/)>.*?</\1\s*>", re.S)
# Block-level and milestone tags separate words; inline ones (<w>, <transChange>,
# <divineName>, ...) sit inside running text and must vanish without a space.
_BREAK = re.compile(r"</?(?:l|lg|lb|div|milestone|chapter|p|q|verse|list|item)\b[^>]*>")
# spaRV1909eb has ~580 places where two inline elements touch with no space in
# between ('ejército</w><transChange>se llamaba'). Most are word boundaries;
# the rest split a verb from its enclitic pronoun ('díjo</w><w>le' = 'díjole').
_INLINE = r"(?:w|transChange|seg|foreign|divineName)"
_TOUCH = re.compile(rf"</{_INLINE}><{_INLINE}\b[^>]*>")
_WORD_BEFORE = re.compile(r"[^\s<>]*$")
_WORD_AFTER = re.compile(r"[^\s<>]*")
_ENCLITIC = re.compile(r"^(?:me|te|se|le|lo|la|nos|os|les|los|las)+[\W]*$", re.I)
_TAG = re.compile(r"<[^>]*>")
# Stray USFM character markers left by the converter (e.g. '\nd LORD').
_USFM = re.compile(r"\\\+?[a-z]+[0-9]*\*?\s?")
_ACCENTED = set("áéíóúÁÉÍÓÚ")


def _touching(match: re.Match) -> str:
  text = match.string
  before = _WORD_BEFORE.search(text, 0, match.start()).group()
  # The inner text of the element that comes next ('se' of 'se llamaba').
  after = _WORD_AFTER.match(text, match.end()).group()
  # Verb + enclitic: infinitive/imperative ('engastar|las', 'haced|lo') or a
  # stem that carries the esdrújula accent near its end ('díjo|le', 'viéndo|le').
  enclitic = bool(_ENCLITIC.match(after)) and bool(before) and (
      before[-1] in "rd" or (before[-1] in "aeiouáéíóú" and bool(_ACCENTED & set(before[-4:]))))
  close_end = text.index(">", match.start()) + 1
  return text[match.start():close_end] + ("" if enclitic else " ") + text[close_end:match.end()]


def clean_osis(text: str) -> str:
  """Plain text of one OSIS verse: notes/titles dropped, tags stripped,
  entities unescaped, pilcrows removed, whitespace collapsed."""
  text = _DROP.sub("", text)
  text = _TOUCH.sub(_touching, text)
  text = _BREAK.sub(" ", text)
  text = _TAG.sub("", text)
  text = html.unescape(text)
  text = _USFM.sub("", text).replace("\u00b6", "")
  return " ".join(text.split())


# --- versification -----------------------------------------------------------

_CHAPTER = re.compile(r'<chapter\b[^>]*\bsID="([^".]+)\.(\d+)"')


def _layout(raw: list[str], testament: str, source: Path) -> list[Verse | None]:
  """Maps every slot to its Verse (None for heading slots), from the markup."""
  starts = []  # (slot, book, chapter)
  for i, text in enumerate(raw):
    m = _CHAPTER.search(text)
    if m:
      starts.append((i, m.group(1), int(m.group(2))))
  layout: list[Verse | None] = [None] * len(raw)
  books = []
  for k, (slot, book, chapter) in enumerate(starts):
    if not books or books[-1] != book:
      books.append(book)
    if k + 1 < len(starts):
      next_slot, next_book, _ = starts[k + 1]
      end = next_slot - (1 if next_book != book else 0)  # book heading slot
    else:
      end = len(raw)
    for v, s in enumerate(range(slot + 1, end), start=1):
      layout[s] = Verse(testament, s, book, chapter, v)
  n_verses = sum(v is not None for v in layout)
  unknown = [b for b in books if b not in BOOK_NAMES]
  expected = (_SLOTS[testament], _BOOKS[testament], _CHAPTERS[testament], _VERSES[testament])
  if (len(raw), len(books), len(starts), n_verses) != expected or unknown:
    raise SwordModuleError(
        f"SWORD module {source} ({testament}) does not follow the KJV versification: "
        f"found {len(raw)} slots, {len(books)} books, {len(starts)} chapters, "
        f"{n_verses} verses, expected {expected[0]}, {expected[1]}, {expected[2]}, "
        f"{expected[3]}" + (f"; unknown books {unknown}" if unknown else "") +
        f". The module may be corrupt or a different edition. {INSTALL_HINT}")
  return layout


def read_module(root: str | os.PathLike, module: str) -> list[tuple[Verse, str]]:
  """Every verse slot of `module` as (Verse, cleaned text), canonical order.

  Empty verses are kept as `''` so that two modules line up slot for slot.
  """
  directory = module_dir(Path(root), module)
  if not directory.is_dir():
    raise SwordModuleError(f"SWORD module folder {directory} does not exist. {INSTALL_HINT}")
  out = []
  for testament in TESTAMENTS:
    raw = read_ztext(directory, testament)
    for verse in _layout(raw, testament, directory):
      if verse is not None:
        out.append((verse, clean_osis(raw[verse.slot])))
  return out


def read_parallel(path: str | os.PathLike | None = None) -> list[VersePair]:
  """Non-empty aligned English/Spanish verse pairs in canonical order.

  Args:
    path: SWORD root; None searches `default_search_paths()`.

  Returns:
    31,084 `VersePair`s for the Debian modules (docs/formulas.md §5); filters by
    length are applied later (`bible.filter_pairs`).
  """
  root = find_sword_root(path)
  english = read_module(root, MODULES["en"])
  spanish = read_module(root, MODULES["es"])
  pairs = []
  for (v_en, en), (v_es, es) in zip(english, spanish):
    if (v_en.testament, v_en.slot) != (v_es.testament, v_es.slot) or v_en.ref != v_es.ref:
      raise SwordModuleError(
          f"modules under {root} disagree on the verse layout at {v_en.ref} / {v_es.ref}.")
    if en and es:
      pairs.append(VersePair(v_en.ref, en, es))
  return pairs
