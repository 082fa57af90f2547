import pytest

from engine import parse_size


@pytest.mark.parametrize(
    "text, size",
    [
        ("1GiB", 1 << 30),
        ("512MiB", 512 << 20),
        ("2G", 2 * 10**9),
        ("3kb", 3000),
        ("100", 100),
        (" 1.5 GiB ", 3 << 29),
        (4096, 4096),
    ],
)
def test_sizes(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "1ib", "GiB", "1 parsec", "-1GiB"])
def test_bad_sizes_name_the_input(text):
    with pytest.raises(ValueError, match="cannot read"):
        parse_size(text)
