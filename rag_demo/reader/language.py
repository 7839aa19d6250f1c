"""Is a question written in English? Both stacks' models read English only, so a question in
another language gets a note on the page instead of a confident answer with no cue.

Questions name what they ask with a handful of function words: who, what, the, of in English;
qui, quel, la, de in French; wer, die, von in German; and so on. A question whose words hold more
of another language's function words than of English's is taken for that language. A question
with neither ("Mona Lisa painter") counts as English. A question mostly in letters of another
script (Cyrillic, Chinese, Arabic, ...) is named by its script.
"""
from __future__ import annotations

import re
import unicodedata

QUESTION_WORDS = frozenset("who whom whose what when where which why how".split())
ENGLISH = frozenset("""
who whom whose what when where which why how is are were did does do has have had can could will would
the of in on at to for from with by and name list tell give many much
""".split())
# Function words of the other languages a visitor is likely to try, leaving out those that are
# English words too ("a", "die", "hat", "was", "in", "is").
OTHER = {
    "French": "qui que quel quelle quels quelles est sont le la les du des une où quand comment pourquoi combien "
              "au aux avec dans pour sur",
    "German": "wer wann wo wie warum welche welcher welches ist sind der das den dem des von und im zu mit "
              "nach ein eine einer",
    "Spanish": "quién quien qué cuál cual cuándo cuando dónde donde cómo por es el la lo los las del en y con para "
               "una un",
    "Italian": "chi che quale quali quando dove come perché è il lo gli di del della ha sono con per una un",
    "Portuguese": "quem qual quais quando onde como porque é os as do da dos das em com para uma um foi",
    "Dutch": "wie wat waar wanneer hoe waarom welke welk de het een van en op met naar heeft zijn werd",
}
# Scripts other than Latin, by the first word of their letters' Unicode names.
SCRIPTS = {"CYRILLIC": "Cyrillic script", "CJK": "Chinese or Japanese script", "HIRAGANA": "Japanese script",
           "KATAKANA": "Japanese script", "HANGUL": "Korean script", "ARABIC": "Arabic script",
           "HEBREW": "Hebrew script", "GREEK": "Greek script", "DEVANAGARI": "Devanagari script", "THAI": "Thai script"}
OTHER_WORDS = {lang: frozenset(ws.split()) - ENGLISH for lang, ws in OTHER.items()}
_WORD = re.compile(r"[^\W\d_]+", re.UNICODE)


def language_of(question: str) -> str:
    """"English", or the language whose function words the question holds more of than English's. A
    question with an English question word is English ("who sang La Vie en rose")."""
    letters = [c for c in question if c.isalpha()]
    scripts = [unicodedata.name(c, "?").split()[0] for c in letters]
    if letters and sum(s != "LATIN" for s in scripts) * 2 > len(letters):
        top = max(set(scripts) - {"LATIN"}, key=scripts.count)
        return SCRIPTS.get(top, f"{top.title()} script")
    ws = [w.casefold() for w in _WORD.findall(question)]
    if any(w in QUESTION_WORDS for w in ws):
        return "English"
    english = sum(w in ENGLISH for w in ws)
    best, count = max(((lang, sum(w in words for w in ws)) for lang, words in OTHER_WORDS.items()),
                      key=lambda x: x[1])
    return best if count > english else "English"
