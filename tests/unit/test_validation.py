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
