"""Text in, text out: a model trained on sentences translates a paragraph, a page or a list of lines one sentence at a
time, and the translations are put back in the text's own layout, as LibreTranslate and Argos do.

`split_text` cuts a text into lines (its line and paragraph breaks, blank lines included, are kept as they are) and
each line into sentences with pysbd, a rule-based segmenter that needs no model download and knows the abbreviations,
ordinals and numbers of English and German ("Dr. Smith", "am 3. Oktober", "3.5%"). `SplitText.join` puts one
translation per sentence back in their places, so nothing of the text is dropped or reordered.
"""

import re
from dataclasses import dataclass
from functools import lru_cache

# A text with none of these followed by a space holds one sentence per line, and skips the segmenter.
_POSSIBLE_BOUNDARY = re.compile(r"[.!?…]['\"‘’“”»«)\]]*\s+\S|[。！？]\S")


@lru_cache(maxsize=None)
def _segmenter(language: str):
    try:
        import pysbd
    except ImportError as error:
        raise ImportError("Splitting text into sentences needs pysbd: pip install 'vanilla-transformer[serve]' "
                          "(or: pip install pysbd)") from error
    try:
        return pysbd.Segmenter(language=language, clean=False)
    except ValueError:  # a language pysbd has no rules for gets its English rules (sentence punctuation is shared)
        return pysbd.Segmenter(language="en", clean=False)


@dataclass(frozen=True)
class SplitText:
    """A text as its `sentences` (what is translated) and its layout: per line, its leading and trailing
    whitespace and how many sentences it holds (0 for a blank line)."""

    sentences: list[str]
    lines: list[tuple[str, int, str]]

    def join(self, translations: list[str], separator: str = " ") -> str:
        """The text with each sentence replaced by its translation, in order, in the text's own lines; the sentences
        of a line are joined by `separator` (one space: the text's own spacing between them is not kept)."""
        if len(translations) != len(self.sentences):
            raise ValueError(f"{len(translations)} translations for {len(self.sentences)} sentences")
        parts, start = [], 0
        for leading, count, trailing in self.lines:
            parts.append(leading + separator.join(translations[start:start + count]) + trailing if count else
                         leading + trailing)
            start += count
        return "\n".join(parts)


def split_sentences(line: str, language: str = "en") -> list[str]:
    """The sentences of one line of text, stripped; none for a blank line."""
    line = line.strip()
    if not line:
        return []
    if not _POSSIBLE_BOUNDARY.search(line):
        return [line]
    return [sentence.strip() for sentence in _segmenter(language).segment(line) if sentence.strip()]


def split_text(text: str, language: str = "en") -> SplitText:
    """`text` as sentences and layout. Its line breaks ("\\r\\n", "\\r", "\\n") become "\\n"; nothing else breaks a
    line."""
    sentences, lines = [], []
    for line in text.replace("\r\n", "\n").replace("\r", "\n").split("\n"):
        found = split_sentences(line, language)
        stripped = line.strip()
        leading = line[:len(line) - len(line.lstrip())] if stripped else line
        trailing = line[len(line.rstrip()):] if stripped else ""
        sentences += found
        lines.append((leading, len(found), trailing))
    return SplitText(sentences, lines)


__all__ = ["SplitText", "split_text", "split_sentences"]
