"""The worked examples (ReaderAids.worked_examples): invented passages, asked and answered in the
answer style, shown to the generator as earlier chat turns before the real question."""
from __future__ import annotations

# ReaderAids.worked_examples: demonstrations before the real question, as earlier chat turns
# (title, passage, question, short answer, sentence answer). Invented places and people, so the
# model cannot answer them from its weights and no evaluation question is copied: they show the
# task (read the passage, name the asked-for thing, not its neighbour; stop after the answer).
# Every doc's prompt opens with them, so the K rows share them as one prefix (`shared_prefix`).
WORKED_EXAMPLES = (
    ("Veltrania", "Veltrania is an island nation in the Coral Sea. Its capital is Port Amsel, a harbour town founded "
     "in 1812 by the navigator Ilse Marten, and its largest city is Brennholm. The island's main export is vanilla.",
     "What is the capital of Veltrania?", "Port Amsel", "The capital of Veltrania is Port Amsel."),
    ("Orlan Vesk", "Orlan Vesk was a Danubian composer and conductor. Born in Tallinburg in 1843, he studied in Vienna "
     "and is best known for his opera The Glass Harbour, first staged in 1889.",
     "When was The Glass Harbour first staged?", "1889", "The Glass Harbour was first staged in 1889."),
    # the answer is the passage's own subject (retrieval often finds the answer's article)
    ("Tomas Reyl", "Tomas Reyl (1709-1778) was an Estovian engineer and surveyor. He designed the Marrow Canal, the "
     "first waterway to link the river Sallen to the port of Kettering Bay, and built the stone bridge at Amsel.",
     "Who designed the Marrow Canal?", "Tomas Reyl", "The Marrow Canal was designed by Tomas Reyl."),
    # an attribute named once among others (the language, not the country or the currency)
    ("Kessaly", "Kessaly is a landlocked republic in the Vardan Highlands, bordered by Orvia to the north. Most of its "
     "four million people speak Kessalian, and its currency is the kessal mark. Tor Halden is its highest mountain.",
     "What language do people in Kessaly speak?", "Kessalian", "People in Kessaly speak Kessalian."),
)
# The invented names of each worked example (aligned with WORKED_EXAMPLES), with the parts the
# model writes alone or misspells after ("Reyl", "Tomas" as in "Tomas Rez.", "Kessal"). An answer
# naming one copied the demonstrations, not a passage or what the model knows, and cannot be
# right, so it is retried like an echo (echo.copies_example; a passage that holds the word still
# lends it, so a real "Tomas" read in a passage is kept). Closed-book, which reads the examples
# without any passage, is the mode that copies them ("who painted the mona lisa" -> "Tomas
# Reyl."; experiments/README.md).
EXAMPLE_NAMES = (
    ("Veltrania", "Port Amsel", "Ilse", "Marten", "Brennholm"),
    ("Orlan", "Vesk", "Tallinburg", "Glass Harbour"),
    ("Tomas", "Reyl", "Estovian", "Marrow Canal", "Sallen", "Kettering Bay"),
    ("Kessaly", "Kessal", "Kessalian", "Vardan", "Orvia", "Tor Halden"),
)
