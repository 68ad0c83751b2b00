"""A built-in English -> German translation task, generated deterministically, so the demo needs no download.

It is small enough for a tiny Transformer to learn on a CPU in minutes, yet it is correct German with the
structure that makes translation more than word-for-word lookup. Seven templates:

* ``number``: cardinals 0..9999. German writes them as one word with the units before the tens, so the
  model must reorder and merge ("three hundred twenty-one" -> "dreihunderteinundzwanzig"), and a final
  1 is "eins" but "ein" inside a compound ("one hundred one" -> "einhunderteins").
* ``date_digits`` and ``date_words``: days from 1800-01-01 to 2099-12-31, with digits copied
  ("on the 3rd of May 2021" -> "am 3. Mai 2021") or spelled out, with a dative ordinal and a year that
  English reads in pairs and German as one number ("on the third of May nineteen ninety-nine" ->
  "am dritten Mai neunzehnhundertneunundneunzig").
* ``counted``: a pronoun sees/buys/... 1..999 things, so adjectives take the strong plural ending and the
  noun its plural ("I see twenty-one red apples" -> "ich sehe einundzwanzig rote Äpfel"), except for one
  ("I see one red apple" -> "ich sehe einen roten Apfel").
* ``pronoun_transitive``, ``noun_transitive`` and ``intransitive``: short clauses whose noun phrases agree
  in gender, number and case (der/den/die/das, ein/einen/eine, weak and mixed adjective endings, plurals
  like Äpfel, Mäuse, Häuser, Schlüssel).

Every clause comes in one of five word orders: plain subject-verb-object; after "today", where the German
verb comes second ("heute sieht der Hund ..."); after "yesterday", in the perfect tense with the participle
last ("gestern hat der Hund ... gesehen", "gestern sind ... gelaufen"); and after "I know that"/"she says
that", where the German verb comes last ("ich weiß, dass der Hund den Ball sieht").

Like these examples, sentences start lowercase (except "I") and have no full stop, so the only casing the
model has to learn is German noun capitalization. Each template maps an index to a sentence injectively
and no two templates share an English sentence, so sampling distinct indices gives distinct source
sentences, hence disjoint splits. All randomness comes from one ``random.Random(seed)``.
"""

from __future__ import annotations

import datetime
import math
import random
from collections.abc import Callable
from typing import NamedTuple

from datasets import Dataset, DatasetDict, Features, Translation

from ..support_vanilla_transformer import check_int

SPLITS = ("train", "validation", "test")
MODES = ("plain", "today", "yesterday", "know", "says")

_EN_SMALL = ("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
             "sixteen seventeen eighteen nineteen").split()
_EN_TENS = ("", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety")
_DE_SMALL = ("null eins zwei drei vier fünf sechs sieben acht neun zehn elf zwölf dreizehn vierzehn fünfzehn "
             "sechzehn siebzehn achtzehn neunzehn").split()
_DE_TENS = ("", "", "zwanzig", "dreißig", "vierzig", "fünfzig", "sechzig", "siebzig", "achtzig", "neunzig")
_EN_MONTHS = "January February March April May June July August September October November December".split()
_DE_MONTHS = "Januar Februar März April Mai Juni Juli August September Oktober November Dezember".split()


def _lookup(kind: str, table: dict, key: object):
    if key not in table:
        raise ValueError(f"unknown {kind} {key!r}; known: {', '.join(map(str, table))}")
    return table[key]


def _join(*words: str | None) -> str:
    return " ".join(word for word in words if word)


def english_number(n: int) -> str:
    """0..9999 in American English words, without "and": 1999 -> "one thousand nine hundred ninety-nine"."""
    check_int("n", n, 0, 9999)
    if n < 20:
        return _EN_SMALL[n]
    if n < 100:
        return _EN_TENS[n // 10] + (f"-{_EN_SMALL[n % 10]}" if n % 10 else "")
    big, unit, rest = (n // 1000, "thousand", n % 1000) if n >= 1000 else (n // 100, "hundred", n % 100)
    return _join(_EN_SMALL[big], unit, english_number(rest) if rest else None)


def german_number(n: int) -> str:
    """0..9999 as one German word: 21 -> "einundzwanzig", 101 -> "einhunderteins"."""
    check_int("n", n, 0, 9999)
    if n < 20:
        return _DE_SMALL[n]
    # Inside a compound 1 is "ein" (einhundert, einundzwanzig); only a final 1 is "eins".
    def prefix(digit: int) -> str:
        return "ein" if digit == 1 else _DE_SMALL[digit]

    if n < 100:
        return (f"{prefix(n % 10)}und" if n % 10 else "") + _DE_TENS[n // 10]
    big, unit, rest = (n // 1000, "tausend", n % 1000) if n >= 1000 else (n // 100, "hundert", n % 100)
    return prefix(big) + unit + (german_number(rest) if rest else "")


def _ordinals(day: int) -> tuple[str, str]:
    irregular = {1: "first", 2: "second", 3: "third", 5: "fifth", 8: "eighth", 9: "ninth", 12: "twelfth"}
    if day in irregular:
        en = irregular[day]
    elif day < 20:
        en = _EN_SMALL[day] + "th"
    elif day % 10 == 0:
        en = _EN_TENS[day // 10][:-1] + "ieth"  # twenty -> twentieth
    else:
        en = f"{_EN_TENS[day // 10]}-{_ordinals(day % 10)[0]}"
    # After "am" (dative) the ordinal has the weak ending -en: 1..19 add -ten, from 20 on -sten.
    de = {1: "ers", 3: "drit", 7: "sieb", 8: "ach"}.get(day, german_number(day)) + ("ten" if day < 20 else "sten")
    return en, de


def _years(year: int) -> tuple[str, str]:
    if year >= 2000:  # "two thousand twenty-one", "zweitausendeinundzwanzig"
        return english_number(year), german_number(year)
    # Before 2000 English reads the year in pairs ("nineteen oh five"), German in hundreds.
    century, rest = divmod(year, 100)
    en_rest = "hundred" if rest == 0 else f"oh {_EN_SMALL[rest]}" if rest < 10 else english_number(rest)
    return f"{english_number(century)} {en_rest}", german_number(century) + "hundert" + (
        german_number(rest) if rest else "")


_FIRST_DAY = datetime.date(1800, 1, 1)
_NUM_DAYS = datetime.date(2100, 1, 1).toordinal() - _FIRST_DAY.toordinal()


def date_pair(year: int, month: int, day: int, words: bool = False) -> tuple[str, str]:
    """("on the 3rd of May 2021", "am 3. Mai 2021") for 1800..2099; words=True spells out day and year."""
    check_int("year", year, 1800, 2099)
    try:
        datetime.date(year, month, day)
    except (TypeError, ValueError) as err:
        raise ValueError(f"not a valid date: {year!r}-{month!r}-{day!r} ({err})") from None
    en_month, de_month = _EN_MONTHS[month - 1], _DE_MONTHS[month - 1]
    if words:
        (en_day, de_day), (en_year, de_year) = _ordinals(day), _years(year)
        return f"on the {en_day} of {en_month} {en_year}", f"am {de_day} {de_month} {de_year}"
    suffix = "th" if 11 <= day <= 13 else {1: "st", 2: "nd", 3: "rd"}.get(day % 10, "th")
    return f"on the {day}{suffix} of {en_month} {year}", f"am {day}. {de_month} {year}"


class _Noun(NamedTuple):
    en_plural: str
    gender: str  # "m", "f" or "n"
    de: str
    de_plural: str
    animate: bool  # only animals are subjects, so sentences stay plausible


# Nouns whose English plural equals the singular (sheep, fish) are left out: their German would be ambiguous.
_NOUNS = {
    "dog": _Noun("dogs", "m", "Hund", "Hunde", True), "cat": _Noun("cats", "f", "Katze", "Katzen", True),
    "horse": _Noun("horses", "n", "Pferd", "Pferde", True), "bird": _Noun("birds", "m", "Vogel", "Vögel", True),
    "mouse": _Noun("mice", "f", "Maus", "Mäuse", True), "pig": _Noun("pigs", "n", "Schwein", "Schweine", True),
    "cow": _Noun("cows", "f", "Kuh", "Kühe", True), "apple": _Noun("apples", "m", "Apfel", "Äpfel", False),
    "house": _Noun("houses", "n", "Haus", "Häuser", False), "car": _Noun("cars", "n", "Auto", "Autos", False),
    "book": _Noun("books", "n", "Buch", "Bücher", False), "table": _Noun("tables", "m", "Tisch", "Tische", False),
    "ball": _Noun("balls", "m", "Ball", "Bälle", False), "flower": _Noun("flowers", "f", "Blume", "Blumen", False),
    "lamp": _Noun("lamps", "f", "Lampe", "Lampen", False), "cup": _Noun("cups", "f", "Tasse", "Tassen", False),
    "chair": _Noun("chairs", "m", "Stuhl", "Stühle", False),
    "key": _Noun("keys", "m", "Schlüssel", "Schlüssel", False),
    "shoe": _Noun("shoes", "m", "Schuh", "Schuhe", False),
    "bottle": _Noun("bottles", "f", "Flasche", "Flaschen", False),
}
# Stems that take endings unchanged (unlike "dunkel" -> "dunkle").
_ADJECTIVES = {"red": "rot", "blue": "blau", "green": "grün", "yellow": "gelb", "black": "schwarz",
               "white": "weiß", "small": "klein", "big": "groß", "old": "alt", "new": "neu"}
# (article, adjective ending) by (determiner, case, gender or "pl"): weak endings after der/die/das,
# mixed after ein, strong after a bare number.
_DECLENSION = {
    ("the", "nom", "m"): ("der", "e"), ("the", "nom", "f"): ("die", "e"), ("the", "nom", "n"): ("das", "e"),
    ("the", "acc", "m"): ("den", "en"), ("the", "acc", "f"): ("die", "e"), ("the", "acc", "n"): ("das", "e"),
    ("the", "nom", "pl"): ("die", "en"), ("the", "acc", "pl"): ("die", "en"),
    ("a", "nom", "m"): ("ein", "er"), ("a", "nom", "f"): ("eine", "e"), ("a", "nom", "n"): ("ein", "es"),
    ("a", "acc", "m"): ("einen", "en"), ("a", "acc", "f"): ("eine", "e"), ("a", "acc", "n"): ("ein", "es"),
    ("count", "nom", "pl"): ("", "e"), ("count", "acc", "pl"): ("", "e"),
}


class NP(NamedTuple):
    """A noun phrase. determiner is "the", "a" or a count; plural is only read with "the"."""

    noun: str
    adjective: str | None = None
    determiner: str | int = "the"
    plural: bool = False

    @property
    def is_plural(self) -> bool:
        return self.plural if self.determiner == "the" else self.determiner not in ("a", 1)


def noun_phrase(np: NP, case: str) -> tuple[str, str]:
    """("the small dog", "den kleinen Hund") for NP("dog", "small") and case "acc" (or "nom")."""
    noun, count = _lookup("noun", _NOUNS, np.noun), np.determiner
    de_adj = _lookup("adjective", _ADJECTIVES, np.adjective) if np.adjective is not None else None
    _lookup("case", dict.fromkeys(("nom", "acc")), case)
    if isinstance(count, int):
        # "hunderteins Äpfel" vs "hundertundein Apfel" is disputed German, so counts like 101 are refused.
        if check_int("count", count, 1, 9999) > 100 and count % 100 == 1:
            raise ValueError(f"count must not end in 01 above 100, got {count}")
        det = "a" if count == 1 else "count"  # "one red apple" declines like "a": "einen roten Apfel"
    else:
        det = _lookup("determiner", {"the": "the", "a": "a"}, count)
    article, ending = _DECLENSION[(det, case, "pl" if np.is_plural else noun.gender)]
    article = german_number(count) if det == "count" else article
    en_det = english_number(count) if isinstance(count, int) else count
    en_det = "an" if en_det == "a" and (np.adjective or np.noun)[0] in "aeiou" else en_det
    en = _join(en_det, np.adjective, noun.en_plural if np.is_plural else np.noun)
    return en, _join(article, de_adj and de_adj + ending, noun.de_plural if np.is_plural else noun.de)


class _Verb(NamedTuple):
    en_3sg: str
    en_past: str
    de: dict[str, str]  # present tense by person: "1sg", "3sg", "pl"
    participle: str
    aux: str  # perfect-tense auxiliary: "haben" or "sein"


def _verb(en_3sg: str, en_past: str, de_forms: str, participle: str, aux: str = "haben") -> _Verb:
    return _Verb(en_3sg, en_past, dict(zip(("1sg", "3sg", "pl"), de_forms.split())), participle, aux)


# Several verbs change their stem in the 3rd person singular (sieht, trägt, wäscht, schläft, läuft).
_TRANSITIVE = {
    "see": _verb("sees", "saw", "sehe sieht sehen", "gesehen"),
    "find": _verb("finds", "found", "finde findet finden", "gefunden"),
    "buy": _verb("buys", "bought", "kaufe kauft kaufen", "gekauft"),
    "carry": _verb("carries", "carried", "trage trägt tragen", "getragen"),
    "need": _verb("needs", "needed", "brauche braucht brauchen", "gebraucht"),
    "draw": _verb("draws", "drew", "zeichne zeichnet zeichnen", "gezeichnet"),
    "wash": _verb("washes", "washed", "wasche wäscht waschen", "gewaschen"),
}
_INTRANSITIVE = {
    "sleep": _verb("sleeps", "slept", "schlafe schläft schlafen", "geschlafen"),
    "run": _verb("runs", "ran", "laufe läuft laufen", "gelaufen", aux="sein"),
    "wait": _verb("waits", "waited", "warte wartet warten", "gewartet"),
    "play": _verb("plays", "played", "spiele spielt spielen", "gespielt"),
    "sing": _verb("sings", "sang", "singe singt singen", "gesungen"),
}
_AUX = {"haben": {"1sg": "habe", "3sg": "hat", "pl": "haben"}, "sein": {"1sg": "bin", "3sg": "ist", "pl": "sind"}}
_PRONOUNS = {"I": ("ich", "1sg"), "he": ("er", "3sg"), "she": ("sie", "3sg"), "we": ("wir", "pl"),
             "they": ("sie", "pl")}
_THAT = {"know": ("I know that", "ich weiß, dass"), "says": ("she says that", "sie sagt, dass")}


def clause_pair(subject: str | NP, verb: str, obj: NP | None = None, mode: str = "plain") -> tuple[str, str]:
    """A clause in one of MODES: ("yesterday I saw the dog", "gestern habe ich den Hund gesehen").

    subject is a pronoun ("I", "he", "she", "we", "they") or an NP; obj is an NP for a transitive verb
    and None for an intransitive one.
    """
    kind, table = ("transitive verb", _TRANSITIVE) if obj is not None else ("intransitive verb", _INTRANSITIVE)
    entry = _lookup(kind, table, verb)
    _lookup("mode", dict.fromkeys(MODES), mode)
    if isinstance(subject, NP):
        (en_subj, de_subj), person = noun_phrase(subject, "nom"), "pl" if subject.is_plural else "3sg"
    else:
        en_subj, (de_subj, person) = subject, _lookup("pronoun", _PRONOUNS, subject)
    en_obj, de_obj = noun_phrase(obj, "acc") if obj is not None else (None, None)
    en_verb, finite = (entry.en_3sg if person == "3sg" else verb), entry.de[person]
    if mode == "plain":
        return _join(en_subj, en_verb, en_obj), _join(de_subj, finite, de_obj)
    if mode == "today":  # the German finite verb stays second, so the subject moves after it
        return _join("today", en_subj, en_verb, en_obj), _join("heute", finite, de_subj, de_obj)
    if mode == "yesterday":  # the perfect tense brackets the object between auxiliary and participle
        return (_join("yesterday", en_subj, entry.en_past, en_obj),
                _join("gestern", _AUX[entry.aux][person], de_subj, de_obj, entry.participle))
    en_lead, de_lead = _THAT[mode]  # subordinate clauses put the finite verb last
    return _join(en_lead, en_subj, en_verb, en_obj), _join(de_lead, de_subj, de_obj, finite)


class _Template(NamedTuple):
    name: str
    weight: int  # share of the sampled pairs while the template has sentences left
    axes: tuple[int, ...]  # an index is a mixed-radix number with these digit ranges
    realize: Callable[..., tuple[str, str]]  # takes one digit per axis


def _day(index: int) -> tuple[int, int, int]:
    day = datetime.date.fromordinal(_FIRST_DAY.toordinal() + index)
    return day.year, day.month, day.day


_ANIMATE = [name for name, noun in _NOUNS.items() if noun.animate]
_NOUN_LIST, _ADJ_LIST = list(_NOUNS), [None, *_ADJECTIVES]  # no adjective is as likely as any one adjective
_ARTICLES = (("the", False), ("the", True), ("a", False))
_COUNTS = [n for n in range(1, 1000) if n <= 100 or n % 100 != 1]
_PRON_LIST, _TRANS_LIST, _INTRANS_LIST = list(_PRONOUNS), list(_TRANSITIVE), list(_INTRANSITIVE)
_N, _A, _M, _T = len(_NOUNS), len(_ADJ_LIST), len(MODES), len(_TRANSITIVE)


def _np(noun: str, adjective: int, det: int) -> NP:
    # det 0..2 picks an article, larger ones a count from 1: "twenty-one small dogs sleep".
    if det < len(_ARTICLES):
        return NP(noun, _ADJ_LIST[adjective], *_ARTICLES[det])
    return NP(noun, _ADJ_LIST[adjective], det - len(_ARTICLES) + 1)


_TEMPLATES = {
    "number": _Template("number", 15, (10000,), lambda n: (english_number(n), german_number(n))),
    "date_digits": _Template("date_digits", 8, (_NUM_DAYS,), lambda i: date_pair(*_day(i))),
    "date_words": _Template("date_words", 12, (_NUM_DAYS,), lambda i: date_pair(*_day(i), words=True)),
    "counted": _Template(
        "counted", 20, (_M, len(_PRONOUNS), _T, len(_COUNTS), _A, _N),
        lambda m, p, v, c, a, n: clause_pair(
            _PRON_LIST[p], _TRANS_LIST[v], NP(_NOUN_LIST[n], _ADJ_LIST[a], _COUNTS[c]), MODES[m])),
    "pronoun_transitive": _Template(
        "pronoun_transitive", 15, (_M, len(_PRONOUNS), _T, _N, _A, 3),
        lambda m, p, v, n, a, d: clause_pair(_PRON_LIST[p], _TRANS_LIST[v], _np(_NOUN_LIST[n], a, d), MODES[m])),
    "noun_transitive": _Template(
        "noun_transitive", 20, (_M, len(_ANIMATE), _A, 3, _T, _N, _A, 3),
        lambda m, sn, sa, sd, v, n, a, d: clause_pair(
            _np(_ANIMATE[sn], sa, sd), _TRANS_LIST[v], _np(_NOUN_LIST[n], a, d), MODES[m])),
    "intransitive": _Template(
        "intransitive", 10, (_M, len(_INTRANSITIVE), len(_ANIMATE), _A, len(_ARTICLES) + 99),
        lambda m, v, n, a, d: clause_pair(_np(_ANIMATE[n], a, d), _INTRANS_LIST[v], None, MODES[m])),
}
TEMPLATE_SIZES = {name: math.prod(template.axes) for name, template in _TEMPLATES.items()}
NUM_DISTINCT = sum(TEMPLATE_SIZES.values())  # distinct English sentences the generator can produce


def template_pair(name: str, index: int) -> tuple[str, str]:
    """Pair number `index` (0 <= index < TEMPLATE_SIZES[name]) of the template called `name`."""
    template = _lookup("template", _TEMPLATES, name)
    check_int("index", index, 0, TEMPLATE_SIZES[name] - 1)
    digits = []
    for radix in reversed(template.axes):
        index, digit = divmod(index, radix)
        digits.append(digit)
    return template.realize(*reversed(digits))


def _allocate(total: int) -> dict[str, int]:
    # Share `total` by weight without asking a template for more sentences than it has: what a full
    # template cannot take goes to the others. Every pass hands out at least one, so the loop ends.
    quotas = dict.fromkeys(_TEMPLATES, 0)
    remaining = total
    while remaining:
        open_ = [name for name in _TEMPLATES if quotas[name] < TEMPLATE_SIZES[name]]
        budget, weights = remaining, sum(_TEMPLATES[name].weight for name in open_)
        for name in open_:
            share = max(1, budget * _TEMPLATES[name].weight // weights)
            grant = min(share, TEMPLATE_SIZES[name] - quotas[name], remaining)
            quotas[name] += grant
            remaining -= grant
    return quotas


def generate_pairs(seed: int = 0, total: int = 42000) -> list[tuple[str, str]]:
    """`total` (en, de) pairs with distinct English sentences, in an order fixed by `seed`."""
    check_int("seed", seed, 0)  # random.Random(-s) is random.Random(s), so negative seeds would alias
    check_int("total", total, 0, NUM_DISTINCT)
    rng = random.Random(seed)
    pairs = []
    for name, quota in _allocate(total).items():
        pairs.extend(template_pair(name, i) for i in rng.sample(range(TEMPLATE_SIZES[name]), quota))
    rng.shuffle(pairs)  # mixes the templates, so every split gets the same blend
    return pairs


def build_builtin_task(
    seed: int = 0, num_train: int = 40000, num_validation: int = 1000, num_test: int = 1000
) -> DatasetDict:
    """Splits "train", "validation", "test" in the HF translation format, disjoint by English sentence."""
    sizes = {"train": num_train, "validation": num_validation, "test": num_test}
    for split, size in sizes.items():
        check_int(f"num_{split}", size, 0)
    if sum(sizes.values()) > NUM_DISTINCT:
        raise ValueError(f"num_train + num_validation + num_test = {sum(sizes.values())} is more than the "
                         f"{NUM_DISTINCT} distinct sentences the generator can produce")
    pairs = generate_pairs(seed, sum(sizes.values()))
    features = Features({"translation": Translation(languages=["en", "de"])})
    splits, start = {}, 0
    for split, size in sizes.items():
        rows = [{"en": en, "de": de} for en, de in pairs[start:start + size]]
        splits[split] = Dataset.from_dict({"translation": rows}, features=features)
        start += size
    return DatasetDict(splits)
