"""The question as the generator reads it (truecase.recase, RagSettings.recase_question)."""
from __future__ import annotations


from rag_demo.reader.truecase import phrase_forms, recase

EASTMAN = [("George Eastman", "George Eastman was an American entrepreneur who founded the Eastman Kodak "
                              "Company in Rochester. Eastman helped to bring roll film into the mainstream.")]
AFRICA = [("Cape Town", "Cape Town is the legislative capital of South Africa. The city lies on the coast, "
                        "south of the equator; Parliament sits there. War came to the city in 1795, and a war "
                        "memorial stands in the old town."),
          ("The Wall Street Journal", "The newspaper is owned by Dow Jones. It is known as The Wall Street Journal.")]


def test_lower_case_names_get_the_passages_casing():
    assert recase("what did george eastman make", EASTMAN) == "What did George Eastman make?"
    assert recase("who owns the wall street journal?", AFRICA) == "Who owns The Wall Street Journal?"


def test_a_phrase_is_recased_where_its_words_alone_would_not_be():
    # "south" is written in lower case in the passage ("south of the equator"): alone it stays,
    # inside the phrase the passages write only as "South Africa" it does not
    assert recase("where is the parliament in south africa", AFRICA) == "Where is the Parliament in South Africa?"
    assert recase("what lies south of cape town", AFRICA) == "What lies south of Cape Town?"


def test_a_word_the_passages_also_write_in_lower_case_is_kept():
    # "War" opens a sentence (not counted) and "war" appears mid-sentence: it stays lower case
    assert recase("which war came to cape town", AFRICA) == "Which war came to Cape Town?"
    assert phrase_forms(AFRICA)[("war",)] == {("war",): 1}  # the sentence-initial "War" is not counted


def test_question_words_and_typed_capitals_are_kept():
    forms = [("Who", "The band The Who. The Who played. Rock band The Who toured with What Else.")]
    assert recase("who were the who", forms) == "Who were The Who?"  # the phrase, as the passage writes it
    assert recase("when did who tour", forms) == "When did who tour?"  # a question word alone is not a name
    typed = "What did george Eastman make?"  # a capital after the first letter: the person's casing
    assert recase(typed, EASTMAN) == typed


def test_first_letter_and_question_mark_without_passages():
    assert recase("what is the capital of france") == "What is the capital of france?"
    assert recase("Name the capital of France.") == "Name the capital of France."
    assert recase('who wrote "the raven?"') == 'Who wrote "the raven?"'
    assert recase("  who   wrote  hamlet ") == "Who wrote hamlet?"

