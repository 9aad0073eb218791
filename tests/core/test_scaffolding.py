"""The proxy's own sentences are taken out of a text however it is cut into chunks; everything else is kept."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from pcp_core.directives.answers import AnswerGate
from pcp_core.prompt.document import SYSTEM_INSTRUCTIONS, USER_LINE
from pcp_core.prompt.scaffolding import SENTENCES, VOCABULARY, Scaffolding, without_scaffolding

ECHO = f'<PageContext version="0.1.0-alpha"> {SYSTEM_INSTRUCTIONS}\n2026-11-26T21:11 [d02fdaee] turn, allotment\nYour code is 5521.\n{USER_LINE}'
WORDS = st.text(alphabet=st.sampled_from(list("abcdefghij .;:\n-[]0123456789TYoueLinar_F")), max_size=60)


def fed(text: str, cuts: list[int]) -> str:
    scaffolding, out, start = Scaffolding(), [], 0
    for cut in sorted(set(cuts)):
        out.append(scaffolding.feed(text[start:cut]))
        start = cut
    return "".join(out) + scaffolding.feed(text[start:]) + scaffolding.flush()


@settings(max_examples=200)
@given(before=WORDS, after=WORDS, cuts=st.lists(st.integers(min_value=0, max_value=800), max_size=40))
def test_the_same_text_comes_out_whatever_the_chunks(before, after, cuts):
    text = before + SYSTEM_INSTRUCTIONS + after
    words = lambda said: "".join(said.split())  # noqa: E731  (a sentence taken out whole or clause by clause leaves other spaces)
    assert words(fed(text, cuts)) == words(without_scaffolding(text))
    assert not [sentence for sentence in SENTENCES if sentence in fed(text, cuts)]


@settings(max_examples=200)
@given(text=WORDS, cuts=st.lists(st.integers(min_value=0, max_value=60), max_size=10))
def test_text_that_is_not_the_proxys_goes_through_untouched(text, cuts):
    assert fed(text, cuts) == text


def test_an_echo_keeps_only_what_the_conversation_said():
    gate = AnswerGate(final=True)
    streamed = "".join(gate.feed(ECHO[i : i + 5]) for i in range(0, len(ECHO), 5)) + gate.close()
    assert streamed.strip() == "Your code is 5521."


@settings(max_examples=200)
@given(before=WORDS, after=WORDS, cuts=st.lists(st.integers(min_value=0, max_value=200), max_size=20))
def test_the_documents_names_never_reach_the_answer_whatever_the_chunks(before, after, cuts):
    """A small model writes the document's names as words ("The PagedContext is …", ``{"type": "PagedContext"}``)."""
    text = f'{before}The PagedContext is "2026-12-02T00:46"; {{"type": "Linear_Flow", "id": "CURRENT_TIME"}} ST-Node{after}'
    said = fed(text, cuts)
    assert not [name for name in VOCABULARY if name in said]
    assert "".join(said.split()) == "".join(without_scaffolding(text).split())
    assert '"2026-12-02T00:46"' in said and '"type": ""' in said  # the rest of what it wrote is its own


QUOTED = 'Gina said &lt;3 &amp; "always", Tom wrote &amp;lt;b&amp;gt; &amp'


@settings(max_examples=200)
@given(cuts=st.lists(st.integers(min_value=0, max_value=len(QUOTED)), max_size=12))
def test_an_answer_that_quotes_the_escaped_document_reaches_the_client_in_the_users_characters(cuts):
    gate, out, start = AnswerGate(final=True), [], 0
    for cut in sorted(set(cuts)):
        out.append(gate.feed(QUOTED[start:cut]))
        start = cut
    said = "".join(out) + gate.feed(QUOTED[start:]) + gate.close()
    # undone once, as the document did it once: what the user typed as "&lt;b&gt;" comes back as they typed it
    assert said == 'Gina said <3 & "always", Tom wrote &lt;b&gt; &amp'


def test_a_tag_that_unescaping_forms_is_markup_and_never_reaches_the_client():
    gate = AnswerGate(final=True)
    said = gate.feed("Here: &lt;Node id=&quot;a1&quot;&gt;&lt;Content&gt;5521&lt;/Content&gt;&lt;/Node&gt; done") + gate.close()
    assert said == "Here: 5521 done"
