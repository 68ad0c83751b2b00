import hashlib
import os
import random

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest

from vanilla_transformer.data.builtin_task import (
    NP,
    NUM_DISTINCT,
    TEMPLATE_SIZES,
    _allocate,
    build_builtin_task,
    clause_pair,
    date_pair,
    english_number,
    generate_pairs,
    german_number,
    noun_phrase,
    template_pair,
)

SMALL = {"num_train": 600, "num_validation": 50, "num_test": 50}
# sha256 of generate_pairs(0, 2000), pinned so that a change in Python's random module, in iteration order
# or in the templates shows up. Update it when the task is changed on purpose.
PINNED_DIGEST = "d03422bcc42c82a8e30ed34897c37b57bf65f50268ee7f758aef285513a76850"


def pairs_of(dataset):
    return [(row["en"], row["de"]) for row in dataset["translation"]]


@pytest.mark.parametrize(
    "n, en, de",
    [
        (0, "zero", "null"),
        (1, "one", "eins"),
        (16, "sixteen", "sechzehn"),
        (17, "seventeen", "siebzehn"),
        (21, "twenty-one", "einundzwanzig"),
        (70, "seventy", "siebzig"),
        (77, "seventy-seven", "siebenundsiebzig"),
        (101, "one hundred one", "einhunderteins"),
        (321, "three hundred twenty-one", "dreihunderteinundzwanzig"),
        (1000, "one thousand", "eintausend"),
        (1001, "one thousand one", "eintausendeins"),
        (1999, "one thousand nine hundred ninety-nine", "eintausendneunhundertneunundneunzig"),
        (7341, "seven thousand three hundred forty-one", "siebentausenddreihunderteinundvierzig"),
        (9999, "nine thousand nine hundred ninety-nine", "neuntausendneunhundertneunundneunzig"),
    ],
)
def test_numbers(n, en, de):
    assert (english_number(n), german_number(n)) == (en, de)


@pytest.mark.parametrize(
    "date, words, en, de",
    [
        ((2021, 5, 3), False, "on the 3rd of May 2021", "am 3. Mai 2021"),
        ((1912, 3, 11), False, "on the 11th of March 1912", "am 11. März 1912"),
        ((2000, 2, 29), False, "on the 29th of February 2000", "am 29. Februar 2000"),
        ((1999, 5, 3), True, "on the third of May nineteen ninety-nine", "am dritten Mai neunzehnhundertneunundneunzig"),
        ((1905, 7, 1), True, "on the first of July nineteen oh five", "am ersten Juli neunzehnhundertfünf"),
        ((1800, 12, 7), True, "on the seventh of December eighteen hundred", "am siebten Dezember achtzehnhundert"),
        ((2001, 3, 20), True, "on the twentieth of March two thousand one", "am zwanzigsten März zweitausendeins"),
        ((2021, 10, 31), True, "on the thirty-first of October two thousand twenty-one",
         "am einunddreißigsten Oktober zweitausendeinundzwanzig"),
    ],
)
def test_dates(date, words, en, de):
    assert date_pair(*date, words=words) == (en, de)


@pytest.mark.parametrize(
    "args, en, de",
    [
        (("I", "see", NP("dog", "small")), "I see the small dog", "ich sehe den kleinen Hund"),
        ((NP("dog", "small"), "sleep"), "the small dog sleeps", "der kleine Hund schläft"),
        ((NP("dog", "small", "a"), "sleep"), "a small dog sleeps", "ein kleiner Hund schläft"),
        ((NP("dog", "small", plural=True), "sleep"), "the small dogs sleep", "die kleinen Hunde schlafen"),
        (("I", "see", NP("apple", "red", 21)), "I see twenty-one red apples", "ich sehe einundzwanzig rote Äpfel"),
        (("I", "see", NP("apple", "red", 1)), "I see one red apple", "ich sehe einen roten Apfel"),
        (("I", "see", NP("apple", None, "a")), "I see an apple", "ich sehe einen Apfel"),
        (("I", "see", NP("cat", None, 1)), "I see one cat", "ich sehe eine Katze"),
        (("I", "see", NP("house", "old", "a")), "I see an old house", "ich sehe ein altes Haus"),
        (("we", "buy", NP("key", "new", plural=True)), "we buy the new keys", "wir kaufen die neuen Schlüssel"),
        ((NP("dog"), "see", NP("ball", "red"), "today"), "today the dog sees the red ball",
         "heute sieht der Hund den roten Ball"),
        (("he", "wash", NP("cup", "blue", 3), "yesterday"), "yesterday he washed three blue cups",
         "gestern hat er drei blaue Tassen gewaschen"),
        ((NP("mouse", None, 2), "run", None, "yesterday"), "yesterday two mice ran",
         "gestern sind zwei Mäuse gelaufen"),
        ((NP("dog"), "see", NP("ball"), "know"), "I know that the dog sees the ball",
         "ich weiß, dass der Hund den Ball sieht"),
        (("they", "carry", NP("bird", "big", "a"), "says"), "she says that they carry a big bird",
         "sie sagt, dass sie einen großen Vogel tragen"),
    ],
)
def test_clauses(args, en, de):
    assert clause_pair(*args) == (en, de)


def test_noun_phrase_cases():
    assert noun_phrase(NP("horse", "white", "a"), "nom") == ("a white horse", "ein weißes Pferd")
    assert noun_phrase(NP("cow", "big"), "acc") == ("the big cow", "die große Kuh")
    assert noun_phrase(NP("bird", "old", "a"), "acc") == ("an old bird", "einen alten Vogel")


def test_templates_are_injective_and_disjoint():
    rng = random.Random(1)
    seen = set()
    for name, size in TEMPLATE_SIZES.items():
        indices = range(size) if size <= 10000 else rng.sample(range(size), 3000)
        english = {template_pair(name, i)[0] for i in indices}
        assert len(english) == len(indices), name
        assert not english & seen, name
        seen |= english


def test_sizes_disjoint_and_every_template_used():
    task = build_builtin_task()
    assert {split: len(task[split]) for split in task} == {"train": 40000, "validation": 1000, "test": 1000}
    sources = {split: {en for en, _ in pairs_of(task[split])} for split in task}
    assert sum(map(len, sources.values())) == 42000  # distinct within and across splits
    train = pairs_of(task["train"])
    assert all(len(en.split()) <= 15 and len(de.split()) <= 15 for en, de in train)
    assert all("  " not in en + de and "\n" not in en + de for en, de in train)
    assert any(en.startswith("on the 1") for en, _ in train) and any("dass" in de for _, de in train)


def test_deterministic():
    first, again = build_builtin_task(seed=3, **SMALL), build_builtin_task(seed=3, **SMALL)
    other = build_builtin_task(seed=4, **SMALL)
    for split in ("train", "validation", "test"):
        assert pairs_of(first[split]) == pairs_of(again[split])
        assert pairs_of(first[split]) != pairs_of(other[split])
    digest = hashlib.sha256("\n".join(f"{en}\t{de}" for en, de in generate_pairs(0, 2000)).encode()).hexdigest()
    assert digest == PINNED_DIGEST


def test_allocation_respects_template_sizes():
    quotas = _allocate(100_000)
    assert sum(quotas.values()) == 100_000 and quotas["number"] == TEMPLATE_SIZES["number"]
    assert _allocate(NUM_DISTINCT) == TEMPLATE_SIZES
    assert sum(_allocate(3).values()) == 3


def test_empty_split():
    task = build_builtin_task(num_train=10, num_validation=0, num_test=0)
    assert len(task["validation"]) == 0 and task["validation"].features == task["train"].features


@pytest.mark.parametrize(
    "kwargs, match, error",
    [
        ({"num_train": -1}, "num_train.*-1", ValueError),
        ({"num_validation": 1.5}, "num_validation.*1.5", TypeError),
        ({"num_test": True}, "num_test.*True", TypeError),
        ({"seed": -2}, "seed.*-2", ValueError),
        ({"num_train": NUM_DISTINCT}, str(NUM_DISTINCT + 2000), ValueError),
    ],
)
def test_build_rejects_bad_arguments(kwargs, match, error):
    with pytest.raises(error, match=match):
        build_builtin_task(**kwargs)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: english_number(10000), "10000"),
        (lambda: german_number(-1), "-1"),
        (lambda: date_pair(2021, 2, 29), "2021"),
        (lambda: date_pair(1799, 12, 31), "1799"),
        (lambda: noun_phrase(NP("unicorn"), "acc"), "unicorn"),
        (lambda: noun_phrase(NP("dog", "purple"), "acc"), "purple"),
        (lambda: noun_phrase(NP("dog", None, 101), "acc"), "101"),
        (lambda: noun_phrase(NP("dog", None, 0), "acc"), "0"),
        (lambda: noun_phrase(NP("dog"), "dat"), "dat"),
        (lambda: clause_pair("you", "see", NP("dog")), "you"),
        (lambda: clause_pair("I", "sleep", NP("dog")), "sleep"),
        (lambda: clause_pair("I", "see", NP("dog"), "tomorrow"), "tomorrow"),
        (lambda: template_pair("number", 10000), "10000"),
        (lambda: template_pair("poem", 0), "poem"),
    ],
)
def test_lower_level_functions_reject_bad_arguments(call, match):
    with pytest.raises(ValueError, match=match):
        call()
