import pytest

import tilewise


@pytest.mark.parametrize("name", sorted(tilewise._LAZY))
def test_every_public_name_resolves(name):
    assert callable(getattr(tilewise, name))


def test_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError):
        tilewise.no_such_op  # noqa: B018
