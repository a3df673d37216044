import pytest

from api_service.core import validation
from api_service.core.errors import InvalidInput
from api_service.settings import Limits


def test_tags_are_refused_with_a_trailing_newline() -> None:
    assert validation.tags("tags", ["a.b:c-d_1"], Limits()) == ["a.b:c-d_1"]
    with pytest.raises(InvalidInput):
        validation.tags("tags", ["tag\n"], Limits())


def test_ids_have_no_trailing_newline() -> None:
    assert validation.is_id("conv_abc")
    assert not validation.is_id("conv_abc\n")


@pytest.mark.parametrize("text", ["a\x00b", "\\\x00", "\x00\\u0000", {"\x00": 1}])
def test_metadata_with_a_nul_is_refused(text: str | dict[str, int]) -> None:
    with pytest.raises(InvalidInput, match="NUL"):
        validation.metadata("metadata", {"k": text}, Limits())


@pytest.mark.parametrize("text", ["\\u0000", "C:\\u0000\\x", "\\\\\\u0000"])
def test_metadata_may_hold_the_text_of_a_nul_escape(text: str) -> None:
    """A backslash followed by u0000 is six characters of text, not a NUL."""
    assert validation.metadata("metadata", {text: text}, Limits()) == {text: text}


def test_metadata_is_measured_as_compact_json() -> None:
    """16 KiB as a client sends it: no spaces after the separators, which JSON does not need
    and a client's encoder may leave out."""
    limit = Limits().metadata_bytes
    at_limit = {"a": "x" * (limit - len('{"a":""}'))}
    assert len(validation.json_text(at_limit).encode()) == limit
    assert validation.metadata("metadata", at_limit, Limits()) == at_limit
    with pytest.raises(InvalidInput, match=f"larger than {limit} bytes"):
        validation.metadata("metadata", {"a": at_limit["a"] + "x"}, Limits())
    assert validation.stored_bytes("ab", {"k": [1, 2]}) == len("ab") + len('{"k":[1,2]}')
