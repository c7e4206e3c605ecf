"""The incremental JSON reader against `json.loads`."""

from __future__ import annotations

import json
import random

import pytest

from mem1_core.webshop.stream import NotJSONError, iter_array, iter_object

# ---- the incremental reader -------------------------------------------------------------------


def _random_json(rng: random.Random, depth: int = 0):
    kind = rng.randrange(7 if depth < 3 else 4)
    if kind == 0:
        return rng.choice(
            [rng.randrange(-(10**9), 10**9), rng.random() * 10 ** rng.randrange(-30, 30)]
        )
    if kind == 1:
        return rng.choice([True, False, None])
    if kind in (2, 3):  # escapes, multi-byte and astral characters, control characters
        return "".join(rng.choice('ab\\"\n\t é€😀\u0001/') for _ in range(rng.randrange(12)))
    if kind == 4:
        return [_random_json(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {f"k{rng.randrange(5)}": _random_json(rng, depth + 1) for _ in range(rng.randrange(4))}


def test_stream_reads_what_json_loads_reads(tmp_path):
    rng = random.Random(0)
    path = tmp_path / "f.json"
    for _ in range(150):
        value = [_random_json(rng) for _ in range(rng.randrange(6))]
        obj = {f"asin{i}": _random_json(rng) for i in range(rng.randrange(6))}
        for data, read in ((value, iter_array), (obj, iter_object)):
            text = json.dumps(data, ensure_ascii=rng.random() < 0.5, indent=rng.choice([None, 2]))
            path.write_text(text, encoding="utf-8")
            for chunk in (1, 2, 5, 64, 1 << 20):  # values cut anywhere, or read whole
                got = list(read(path, chunk_bytes=chunk))
                expected = json.loads(text)
                if read is iter_array:
                    assert [v for v, _ in got] == expected
                    assert [n for _, n in got] == sorted(n for _, n in got)
                else:
                    assert dict(got) == expected and [k for k, _ in got] == list(expected)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("hello", r"f\.json: not JSON \(expected a list of products, found 'h', line 1\)"),
        ("", r"not JSON \(expected a list of products, found an empty file"),
        ('{"a": 1}', r"f\.json: expected a list of products, got an object"),
        ('[1,\n2,\n{"a": 1 "b"}]', r"not JSON \(Expecting ',' delimiter, line 3\)"),
        ("[1, 2", r"not JSON \(expected ',' or '\]' after a list element, found the end"),
        ("[1] [2]", r"not JSON \(extra data after the top-level value, line 1\)"),
    ],
)
def test_stream_refuses_what_is_not_a_json_list(tmp_path, text, message):
    path = tmp_path / "f.json"
    path.write_text(text)
    with pytest.raises(NotJSONError, match=message):
        list(iter_array(path, "products", chunk_bytes=3))
