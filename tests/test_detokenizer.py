"""The incremental `Detokenizer` gives, chunk by chunk, the text `decode` gives for the whole
output, on the tokenizer families whose decoding depends on context (byte-level BPE with
multi-byte characters split over tokens, SentencePiece-style leading spaces, word-level joins),
built offline with `tokenizers`; and a stop string is found however the text is chunked."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from realexec.engine.tokenizer import Detokenizer

CORPUS = ["naïve café déjà vu — 東京 tower, ünïcödé text 🙂 and plain words",
          "the quick brown fox jumps over the lazy dog", "héllo wörld 你好 世界 ok"] * 20


def _byte_level():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(
        vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    return PreTrainedTokenizerFast(tokenizer_object=tok)


def _metaspace():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Metaspace()])
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(
        vocab_size=200, special_tokens=["<unk>"] + [f"<0x{b:02X}>" for b in range(256)],
        show_progress=False))
    return PreTrainedTokenizerFast(tokenizer_object=tok)


TOKENIZERS = {"byte_level": _byte_level(), "metaspace": _metaspace()}


def _stream(det: Detokenizer, ids: list[int], cuts: list[int]) -> str:
    """What a stream sends: `ids` added in chunks of `cuts` tokens, the last chunk final."""
    out, at = [], 0
    for n in cuts:
        if at + n >= len(ids) or det.stopped:
            break
        out.append(det.add(ids[at:at + n]))
        at += n
    out.append(det.add(ids[at:], final=True))
    return "".join(out)


@pytest.mark.parametrize("name", sorted(TOKENIZERS))
@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_chunked_text_is_the_whole_decode(name, data):
    tok = TOKENIZERS[name]
    ids = data.draw(st.lists(st.integers(0, len(tok) - 1), max_size=40))
    cuts = data.draw(st.lists(st.integers(0, 4), max_size=40))
    seen = data.draw(st.integers(0, len(ids)))
    whole = tok.decode(ids, skip_special_tokens=True)
    det = Detokenizer(tok, [], seen=ids[:seen])
    text = det.text + _stream(det, ids[seen:], cuts)
    assert text == det.text
    if whole.endswith("\ufffd"):  # an unfinished character waits: a prefix of the whole
        assert whole.startswith(text)
    else:  # also when the tokens already out end inside a character
        assert text == whole


def test_a_leading_space_after_skipped_special_tokens_comes_out():
    """Found by the property above: text, then more special tokens than the context window
    holds, then a SentencePiece word boundary. The window's context decodes to nothing, so
    its boundary token was decoded as the text's first and lost its space; the context now
    reaches back to text."""
    tok = TOKENIZERS["metaspace"]
    unk, comma, space = tok.convert_tokens_to_ids(["<unk>", ",", "\u2581"])
    ids = [unk, unk, comma] + [unk] * (Detokenizer.CONTEXT_TOKENS + 2) + [space]
    whole = tok.decode(ids, skip_special_tokens=True)
    assert whole == ", "
    for seen in range(len(ids) + 1):
        for cuts in ([], [1] * len(ids), [2, 3, 1, 4]):
            det = Detokenizer(tok, [], seen=ids[:seen])
            assert det.text + _stream(det, ids[seen:], cuts) == whole


@pytest.mark.parametrize("name", sorted(TOKENIZERS))
def test_a_stop_string_is_cut_however_the_text_comes(name):
    tok = TOKENIZERS[name]
    ids = tok.encode("héllo wörld 你好 世界 ok the quick brown fox", add_special_tokens=False)
    whole = tok.decode(ids)
    for step in (1, 2, 3, len(ids)):
        det = Detokenizer(tok, ["世界", "zzz"])
        text = _stream(det, ids, [step] * len(ids))
        assert det.stopped and det.matched == "世界"
        assert text == det.text == whole[:whole.index("世界")]


@pytest.mark.parametrize("name", sorted(TOKENIZERS))
@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_a_stream_sends_no_part_of_a_stop_string_it_cuts(name, data):
    """Whatever the chunks, the text sent is the text kept: up to the first stop string that
    ends after the text already out, none of it sent before the cut is known."""
    tok = TOKENIZERS[name]
    words = data.draw(st.lists(st.sampled_from(CORPUS[0].split() + CORPUS[2].split()),
                               min_size=1, max_size=12))
    ids = tok.encode(" ".join(words), add_special_tokens=False)
    stop = data.draw(st.sampled_from(words))[:data.draw(st.integers(1, 3))]
    cuts = data.draw(st.lists(st.integers(0, 4), max_size=len(ids)))
    det = Detokenizer(tok, [stop, "\x00never"])
    sent = _stream(det, ids, cuts)
    whole = tok.decode(ids)
    assert sent == det.text
    if stop in whole:
        assert det.stopped and det.matched == stop and det.text == whole[:whole.index(stop)]
    else:
        assert not det.stopped and det.text == whole


def test_without_a_tokenizer_there_is_no_text():
    det = Detokenizer(None, [], seen=[5, 6])
    assert det.add([7]) == "" and det.add([8], final=True) == "" and det.text == ""
