from sidecar.backend.text_stream import TextStream


def feed(stream: TextStream, pieces: list[bytes]) -> list[str]:
    out = []
    for i, piece in enumerate(pieces):
        chunk = stream.push(i, piece)
        out.append(chunk.text)
        if stream.stopped:
            return out
    out.append(stream.finish().text)
    return out


def test_a_character_split_across_tokens_is_sent_whole() -> None:
    dragon = "🐉".encode()  # four bytes
    chunks = feed(TextStream(), [b"A ", dragon[:1], dragon[1:3], dragon[3:], b"!"])
    assert chunks == ["A ", "", "", "🐉", "!", ""]
    assert "".join(chunks) == "A 🐉!"


def test_token_ids_travel_with_the_text_they_made() -> None:
    e_acute = "é".encode()
    s = TextStream()
    assert s.push(1, e_acute[:1]).token_ids == []
    done = s.push(2, e_acute[1:])
    assert (done.text, done.token_ids) == ("é", [1, 2])


def test_an_unfinished_character_becomes_a_replacement_at_the_end() -> None:
    s = TextStream()
    s.push(1, "€".encode()[:2])
    assert s.finish().text == "\ufffd"


def test_stop_string_across_tokens_is_cut_and_not_sent() -> None:
    chunks = feed(TextStream(stop=("\nPlayer:",)), [b"Hello", b" there", b"\nPl", b"ayer", b":", b" more"])
    assert "".join(chunks) == "Hello there"


def test_text_that_only_looked_like_a_stop_string_is_released() -> None:
    s = TextStream(stop=("END",))
    assert s.push(1, b"the EN").text == "the "
    assert s.push(2, b"TRY").text == "ENTRY"
    assert not s.stopped


def test_stop_string_inside_one_token() -> None:
    s = TextStream(stop=("###",))
    assert s.push(1, b"ok###rest").text == "ok"
    assert s.stopped


def test_control_token_without_text_keeps_its_id() -> None:
    s = TextStream()
    chunk = s.push(7, b"")
    assert (chunk.text, chunk.token_ids) == ("", [7])
