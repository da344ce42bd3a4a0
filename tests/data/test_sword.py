"""zText reader and OSIS cleaning (docs/formulas.md §5)."""

import re
import shutil
import statistics

import pytest

from attention_jax.data import sword


# --- cleaning (no modules needed) ------------------------------------------

@pytest.mark.parametrize("raw, clean", [
    # Inline tags vanish without leaving a space before punctuation.
    ('In the <w lemma="strong:H7225">beginning</w> God created the '
     '<w lemma="strong:H0776">earth</w>. ', "In the beginning God created the earth."),
    # Notes and titles go with their contents; a note inside a word gap leaves none.
    ('darkness.<note placement="foot"><reference>1.4 </reference>Heb. between</note> ',
     "darkness."),
    ('<title type="psalm">A Psalm of David.</title> Lord, how are they increased',
     "Lord, how are they increased"),
    # Milestones and poetry lines separate words.
    ('word<lb type="x-p"/>next<l level="1" sID="x"/>line', "word next line"),
    # Entities, pilcrow, whitespace.
    ("A &amp; B &lt;ok&gt; \u00b6 C\n\t D", "A & B <ok> C D"),
    # Stray USFM markers from the converter.
    ("the \\nd <w>LORD</w></divineName> and \\+nd*: or", "the LORD and : or"),
    # Touching inline elements: a word boundary ...
    ('<w lemma="x">ejército</w><transChange type="added">se llamaba</transChange>'
     '<w lemma="y">Sísara</w>,', "ejército se llamaba Sísara,"),
    # ... or a verb and its enclitic pronoun.
    ('<w lemma="x">díjo</w><w lemma="y">le</w> <w>Dios</w>', "díjole Dios"),
    ('<w lemma="x">haced</w><w lemma="y">lo</w>.', "hacedlo."),
])
def test_clean_osis(raw, clean):
  assert sword.clean_osis(raw) == clean


def test_search_paths_follow_the_cache_environment(monkeypatch, tmp_path):
  monkeypatch.setenv("ATTENTION_JAX_CACHE", str(tmp_path / "c"))
  assert sword.default_search_paths() == [
      sword.Path("/usr/share/sword"), tmp_path / "c" / "sword" / "usr" / "share" / "sword"]
  monkeypatch.delenv("ATTENTION_JAX_CACHE")
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
  assert sword.default_search_paths()[1] == (
      tmp_path / "x" / "attention_jax" / "sword" / "usr" / "share" / "sword")


def test_missing_modules_name_the_paths_and_the_install_command(tmp_path):
  with pytest.raises(sword.SwordModuleError) as info:
    sword.find_sword_root(tmp_path)
  message = str(info.value)
  for fragment in (str(tmp_path), "sudo apt-get install sword-text-kjv sword-text-sparv",
                   "make sword", "engKJV2006eb"):
    assert fragment in message


# --- the real modules ---------------------------------------------------------

@pytest.fixture(scope="module")
def pairs(sword_root):
  return sword.read_parallel(sword_root)


def test_slot_counts(sword_root):
  directory = sword.module_dir(sword_root, sword.MODULES["en"])
  assert len(sword.read_ztext(directory, "ot")) == 24_115
  assert len(sword.read_ztext(directory, "nt")) == 8_246


def test_pair_count_and_ends(pairs):
  assert len(pairs) == 31_084  # docs/formulas.md §5
  assert len({p.ref for p in pairs}) == len(pairs)
  first, last = pairs[0], pairs[-1]
  assert first.ref == "Genesis 1:1"
  assert first.en == "In the beginning God created the heaven and the earth."
  assert first.es == "EN el principio crió Dios los cielos y la tierra."
  assert last.ref == "Revelation 22:21"
  assert last.en == "The grace of our Lord Jesus Christ be with you all. Amen."
  assert last.es.startswith("La gracia de nuestro Señor Jesucristo sea con todos vosotros")


def test_versification_matches_kjv(sword_root):
  verses = [v for v, _ in sword.read_module(sword_root, sword.MODULES["en"])]
  assert len(verses) == 31_102
  by_chapter = {}
  for v in verses:
    by_chapter[(v.book, v.chapter)] = max(by_chapter.get((v.book, v.chapter), 0), v.verse)
  assert len(by_chapter) == 1_189
  assert by_chapter[("Ps", 119)] == 176
  assert by_chapter[("Ps", 117)] == 2
  assert by_chapter[("Gen", 50)] == 26
  assert by_chapter[("Rev", 22)] == 21
  assert len({v.book for v in verses}) == 66


def test_known_verse(pairs):
  john = {p.ref: p for p in pairs}["John 11:35"]
  assert john.en == "Jesus wept."


def test_no_markup_left(pairs):
  leftover = re.compile(r"[<>\\\u00b6]|&\w+;|\s{2}|\s[.,;:?!]")
  bad = [p for p in pairs if leftover.search(p.en) or leftover.search(p.es)
         or p.en != p.en.strip() or p.es != p.es.strip()]
  assert not bad, bad[:3]


def test_yield_matches_spec(pairs):
  words_en = [len(p.en.split()) for p in pairs]
  words_es = [len(p.es.split()) for p in pairs]
  assert 0.72e6 < sum(words_en) < 0.82e6  # SPEC: about 0.75M
  assert 0.66e6 < sum(words_es) < 0.74e6  # SPEC: about 0.70M
  assert 19 <= statistics.median(words_en + words_es) <= 25  # SPEC: about 22


# --- damaged modules ----------------------------------------------------------

@pytest.fixture
def module_copy(sword_root, tmp_path):
  for module in sword.MODULES.values():
    shutil.copytree(sword.module_dir(sword_root, module), sword.module_dir(tmp_path, module))
  return tmp_path


def test_missing_file_is_named(module_copy):
  victim = sword.module_dir(module_copy, sword.MODULES["es"]) / "nt.bzv"
  victim.unlink()
  with pytest.raises(sword.SwordModuleError, match=re.escape(str(victim))):
    sword.read_parallel(module_copy)


def test_truncated_index_is_named(module_copy):
  victim = sword.module_dir(module_copy, sword.MODULES["en"]) / "ot.bzv"
  victim.write_bytes(victim.read_bytes()[:-3])
  with pytest.raises(sword.SwordModuleError, match=r"corrupt.*ot\.bzv"):
    sword.read_parallel(module_copy)


def test_lost_slots_break_the_versification_check(module_copy):
  victim = sword.module_dir(module_copy, sword.MODULES["en"]) / "nt.bzv"
  victim.write_bytes(victim.read_bytes()[:-100])  # ten whole records gone
  with pytest.raises(sword.SwordModuleError, match="KJV versification"):
    sword.read_parallel(module_copy)


def test_corrupt_block_is_named(module_copy):
  victim = sword.module_dir(module_copy, sword.MODULES["en"]) / "ot.bzz"
  data = bytearray(victim.read_bytes())
  data[:64] = b"\xff" * 64  # the first zlib block header and payload
  victim.write_bytes(bytes(data))
  with pytest.raises(sword.SwordModuleError, match=r"corrupt.*ot\.bzz"):
    sword.read_parallel(module_copy)
