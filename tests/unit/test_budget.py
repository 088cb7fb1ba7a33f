import pytest

from sidecar.budget import Budget, format_size, parse_size
from sidecar.errors import InvalidArgument

GiB, MiB = 2**30, 2**20


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0", 0),
        ("512M", 512 * MiB),
        ("3G", 3 * GiB),
        ("3GiB", 3 * GiB),
        ("3gib", 3 * GiB),
        ("2.5G", int(2.5 * GiB)),
        (" 4 G ", 4 * GiB),
        ("1500MB", 1500 * 10**6),
        ("2GB", 2 * 10**9),
        ("1T", 2**40),
        ("0G", 0),
        ("64K", 64 * 1024),
        ("4096B", 4096),
        (".5G", GiB // 2),
    ],
)
def test_sizes_people_write_are_read(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize(
    "text", ["", "3", "abc", "-1G", "3X", "3 G B", "G", "1e3G", "nan", "inf", "3GiBs", "3..5G"]
)
def test_anything_else_is_refused_with_what_is_accepted(text: str) -> None:
    with pytest.raises(InvalidArgument) as e:
        parse_size(text)
    assert "512M" in str(e.value)


def test_a_size_larger_than_any_gpu_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="larger than any GPU"):
        parse_size("9999999T")


def test_bare_number_suggests_a_unit() -> None:
    with pytest.raises(InvalidArgument, match="did you mean 3G"):
        parse_size("3")


@pytest.mark.parametrize("n", [0, 512 * MiB, 3 * GiB, int(2.5 * GiB), 1536, 1 << 40])
def test_format_reads_back(n: int) -> None:
    assert abs(parse_size(format_size(n)) - n) <= n * 0.01


def test_budget_refuses_out_of_range() -> None:
    with pytest.raises(InvalidArgument):
        Budget(vram_bytes=-1)
    with pytest.raises(InvalidArgument):
        Budget(max_cpu_threads=-2)
    assert Budget(3 * GiB, 4).describe() == "VRAM 3G, CPU threads 4"
