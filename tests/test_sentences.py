"""Text in, text out (vanilla_transformer.tools.sentences): a text is cut into the sentences a model translates and put
back together in its own lines and paragraphs, so that no sentence is dropped and no line break is lost."""

import pytest

from vanilla_transformer.tools.sentences import split_sentences, split_text

# English and German sentences whose abbreviations, ordinals, numbers and quotes a naive split on "." gets wrong.
SENTENCES = {
    "en": [["A man is riding a bike.", "Two dogs play in the snow.", "A woman sells fruit at a market."],
           ["Dr. Smith met Mr. Jones at 5 p.m. on Friday.", "They talked."],
           ["The price rose 3.5% in the U.S. last year.", "Analysts were surprised."],
           ["Is it raining?", "Yes!", "Take an umbrella."],
           ["She works at Acme Inc. in New York.", "It is big."],
           ["A dog runs"]],
    "de": [["Ein Mann fährt Fahrrad.", "Zwei Hunde spielen im Schnee.", "Eine Frau verkauft Obst."],
           ["Am 3. Oktober feiern wir.", "Das ist ein Feiertag."],
           ["Dr. Müller kommt z. B. um 9 Uhr.", "Er ist pünktlich."],
           ["Das war im 19. Jahrhundert.", "Lange her."],
           ["Er sagte: „Komm her.“", "Sie kam."]],
}


@pytest.mark.parametrize("language, sentences", [(language, case) for language, cases in SENTENCES.items()
                                                 for case in cases])
def test_a_line_is_cut_into_its_sentences(language, sentences):
    assert split_sentences(" ".join(sentences), language) == sentences


def test_line_breaks_paragraphs_and_the_text_around_them_are_kept():
    text = "  A man rides. A dog runs.\r\nA cat sleeps.\n\n\nThe end\n"
    split = split_text(text)
    assert split.sentences == ["A man rides.", "A dog runs.", "A cat sleeps.", "The end"]
    assert split.join(split.sentences) == text.replace("\r\n", "\n")
    assert split.join(["1", "2", "3", "4"]) == "  1 2\n3\n\n\n4\n"


def test_a_text_without_sentences_comes_back_as_it_was():
    for text in ("", "   ", "\n\n"):
        split = split_text(text)
        assert split.sentences == [] and split.join([]) == text


def test_joining_the_wrong_number_of_translations_is_refused():
    with pytest.raises(ValueError, match="1 translations for 2 sentences"):
        split_text("One. Two.").join(["Eins."])
