"""Reading an older run's prompt-token stream (prompt_tokens.jsonl, records.tokens.load_tokens:
pyarrow's JSON reader, else orjson line by line) gives the mapping that json per line gives,
whatever the lines."""

import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kvscope.records.tokens import TOKENS_JSONL, load_tokens, narrowest_dtype


def by_json(text: str) -> dict[str, list[int]]:
    """The contract, line by line with json: a JSON object with a string request_uuid and a
    list of int64 integers as token_ids is read (the last line of a uuid wins); others are not."""
    out: dict[str, list[int]] = {}
    for line in text.split("\n"):
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if not isinstance(row, dict):
            continue
        uuid, ids = row.get("request_uuid"), row.get("token_ids")
        if not isinstance(uuid, str) or not isinstance(ids, list):
            continue
        if all(type(t) is int and -(2**63) <= t < 2**63 for t in ids):
            out[uuid] = ids
    return out


def compact(uuid: Any, ids: Any) -> str:
    """A line as records.base.JsonlWriter writes it."""
    return json.dumps({"request_uuid": uuid, "token_ids": ids}, separators=(",", ":"))


def spaced(uuid: Any, ids: Any) -> str:
    """A line as json.dumps writes it by default."""
    return json.dumps({"request_uuid": uuid, "token_ids": ids})


def read(tmp_path: Path, text: str) -> dict[str, np.ndarray]:
    (tmp_path / TOKENS_JSONL).write_text(text, encoding="utf-8")
    return load_tokens(tmp_path)


def check(tmp_path: Path, text: str) -> dict[str, np.ndarray]:
    """The reader's mapping is json's, in the same order, all arrays of the narrowest dtype
    holding every id."""
    got, want = read(tmp_path, text), by_json(text)
    assert list(got) == list(want)
    assert {u: a.tolist() for u, a in got.items()} == want
    ids = [t for v in want.values() for t in v]
    dtype = narrowest_dtype(min(ids, default=0), max(ids, default=0))
    assert {a.dtype for a in got.values()} <= {dtype}
    return got


# Lines of every kind load_tokens must read as json does: (name, line)
EDGES = [
    ("compact", compact("a", [1, 2, 3])),
    ("spaced", spaced("b", [4, 5])),
    ("key order", '{"token_ids": [3, 4], "request_uuid": "c"}'),
    ("extra key", '{"request_uuid": "d", "token_ids": [3], "x": 1}'),
    ("escaped uuid", '{"request_uuid": "e\\u00e9\\"q\\\\", "token_ids": [7]}'),
    ("escaped control", compact("f\tx", [7])),
    ("raw utf-8 uuid", '{"request_uuid":"gé","token_ids":[8]}'),
    ("float", compact("h", [1.5])),
    ("integral float", compact("i", [1.0, 2])),
    ("bool", compact("j", [True])),
    ("string id", compact("k", ["1"])),
    ("null id", compact("l", [None])),
    ("nested", compact("m", [[3]])),
    ("empty", compact("n", [])),
    ("empty spaced", spaced("o", [])),
    ("null ids", compact("p", None)),
    ("null uuid", compact(None, [3])),
    ("no uuid", '{"token_ids":[3]}'),
    ("int uuid", compact(5, [3])),
    ("not a list", compact("q", 3)),
    ("not an object", "[1, 2]"),
    ("blank", "   "),
    ("leading zero", '{"request_uuid":"r","token_ids":[01,2]}'),
    ("minus zero", '{"request_uuid":"s","token_ids":[-0,2]}'),
    ("plus", '{"request_uuid":"t","token_ids":[+1,2]}'),
    ("empty item", '{"request_uuid":"u","token_ids":[1,,2]}'),
    ("empty item spaced", '{"request_uuid": "v", "token_ids": [0, , 2]}'),
    ("empty first", '{"request_uuid":"w","token_ids":[,0]}'),
    ("empty last", '{"request_uuid":"x","token_ids":[0,]}'),
    ("trailing comma", '{"request_uuid":"x2","token_ids":[5,]}'),
    ("empty item, leading zero", '{"request_uuid": "v2", "token_ids": [1, , 02]}'),
    ("leading zero, empty last", '{"request_uuid": "v3", "token_ids": [00, ]}'),
    ("raw control in uuid", '{"request_uuid":"a\x01b","token_ids":[1]}'),
    ("DEL in uuid", '{"request_uuid":"a\x7fb","token_ids":[1]}'),
    ("whitespace", '{"request_uuid":"y","token_ids":[1 ,2,\t3]}'),
    ("trailing text", compact("z", [1]) + "x"),
    ("duplicate key", '{"request_uuid":"aa","token_ids":[1],"token_ids":[2]}'),
    ("zeros", compact("ab", [0, 0, 10, 0])),
    ("uint16 edge", compact("ac", [65535, 0])),
    ("wide", compact("ad", [65536, 2**31 - 1])),
    ("int32 wrap", compact("ae", [6_000_000_000, 4_294_967_297, 3])),
    ("int64 edge", compact("af", [2**63 - 1])),
    ("past int64", compact("ag", [2**63, 1])),
    ("far past int64", compact("ah", [10**30])),
    ("negative", compact("ai", [-3, 4])),
    ("crlf", compact("aj", [9]) + "\r"),
]
KINDS = [name for name, _ in EDGES]


@pytest.mark.parametrize("name", KINDS)
def test_each_kind_of_line_is_read_as_json_reads_it(tmp_path: Path, name: str) -> None:
    line = dict(EDGES)[name]
    for shape in (compact, spaced):  # among well-formed lines of either shape
        good = [shape(f"g{i}", [i, 10 * i, 65_000]) for i in range(3)]
        check(tmp_path, "\n".join([good[0], line, *good[1:]]) + "\n")
        check(tmp_path, "\n".join([*good, line]))  # last, without a newline


def test_all_kinds_together(tmp_path: Path) -> None:
    rng = random.Random(5)
    lines = [line for _, line in EDGES] + [compact("a", [9, 9]), compact("p", [1])]
    for _ in range(5):
        rng.shuffle(lines)
        check(tmp_path, "\n".join(lines) + "\n")


def test_a_torn_last_line_is_skipped(tmp_path: Path) -> None:
    text = compact("a", [1, 2]) + "\n" + compact("b", [3, 4])[:-5]
    got = check(tmp_path, text)
    assert list(got) == ["a"]


def test_the_last_line_of_a_uuid_wins_and_null_ids_change_nothing(tmp_path: Path) -> None:
    text = "\n".join(
        [compact("a", [1]), compact("b", [2]), compact("a", [3, 4]), compact("b", None)]
    )
    got = check(tmp_path, text)
    assert {u: a.tolist() for u, a in got.items()} == {"a": [3, 4], "b": [2]}


def test_the_dtype_is_the_narrowest_for_the_whole_stream(tmp_path: Path) -> None:
    small = [compact(f"s{i}", [i, 40_000]) for i in range(50)]
    assert read(tmp_path, "\n".join(small))["s3"].dtype == np.uint16
    # a wider id on a later line, or on a line pyarrow refuses, widens every array
    for wide in (compact("w", [70_000]), '{"token_ids": [-1], "request_uuid": "w"}'):
        got = check(tmp_path, "\n".join([*small, wide, *small[:3]]))
        assert got["s3"].dtype == np.int32 and got["s3"].tolist() == [3, 40_000]
    got = check(tmp_path, "\n".join([*small, compact("w", [2**40])]))
    assert got["s7"].dtype == np.int64 and got["w"].tolist() == [2**40]


def test_random_streams_match_json(tmp_path: Path) -> None:
    rng = random.Random(7)
    pieces: list[Callable[[int], str]] = [
        lambda i: compact(f"u{i % 40}", [rng.randrange(50_000) for _ in range(rng.randrange(9))]),
        lambda i: spaced(f"u{i % 40}", [rng.randrange(300) for _ in range(rng.randrange(5))]),
        lambda i: compact(f"u{i % 40}", [rng.randrange(2**34) for _ in range(3)]),
        lambda i: rng.choice(EDGES)[1],
        lambda i: compact(f"u{i}", [0, 1, 0])[: rng.randrange(30)],  # torn anywhere
    ]
    for _ in range(30):
        weights = [rng.random() for _ in pieces]
        lines = [rng.choices(pieces, weights)[0](i) for i in range(rng.randrange(1, 60))]
        check(tmp_path, "\n".join(lines) + rng.choice(["", "\n"]))


def test_load_tokens_reads_the_run_directory(tmp_path: Path) -> None:
    assert load_tokens(tmp_path) == {}
    (tmp_path / TOKENS_JSONL).write_text(compact("a", [5, 6]) + "\n")
    assert load_tokens(tmp_path)["a"].tolist() == [5, 6]
