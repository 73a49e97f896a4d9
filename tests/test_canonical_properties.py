"""Properties of the canonical JSON hash (RFC 8785), over generated values.

``args_hash`` must be the same for the same arguments in any language and any key
order, and different whenever the arguments differ. Hypothesis generates JSON
values within api.md's limits (text without U+0000, integers within ±(2^53−1),
finite numbers) and checks that against references: ``json.loads`` (the canonical
form is JSON that reads back to the same value) and the value itself.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import unicodedata

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runs.canonical import NotCanonicalizable, args_hash, canonical_json

MAX_SAFE = 2**53 - 1

text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"))
scalars = (
    st.none()
    | st.booleans()
    | st.integers(-MAX_SAFE, MAX_SAFE)
    # api.md: numbers are finite, and integer values within ±(2^53−1) even when
    # written as floats (1e17 reads back as an integer RFC 8785 cannot hold).
    | st.floats(allow_nan=False, allow_infinity=False).filter(
        lambda x: not x.is_integer() or abs(x) <= MAX_SAFE
    )
    | text
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(text, inner, max_size=5),
    max_leaves=30,
)
objects = st.dictionaries(text, values, max_size=6)

PROPERTY = settings(max_examples=300, deadline=None)


def _shuffled(value, rng: random.Random):
    """The same value with every object's keys in another order."""
    if isinstance(value, dict):
        items = list(value.items())
        rng.shuffle(items)
        return {key: _shuffled(item, rng) for key, item in items}
    if isinstance(value, list):
        return [_shuffled(item, rng) for item in value]
    return value


def _same(a, b) -> bool:
    """Equal as JSON values: 1 == 1.0, -0.0 == 0, and bools are not numbers."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


@PROPERTY
@given(objects, st.randoms(use_true_random=False))
def test_key_order_never_changes_the_hash(value, rng):
    assert args_hash(_shuffled(value, rng)) == args_hash(value)


@PROPERTY
@given(objects)
def test_the_canonical_form_is_json_that_reads_back_to_the_same_value(value):
    encoded = canonical_json(value)
    assert _same(json.loads(encoded), value)
    # And it is a fixed point: canonicalising what it reads back gives the same bytes.
    assert canonical_json(json.loads(encoded)) == encoded


def _utf16(key: str) -> bytes:
    return key.encode("utf-16-be")


@PROPERTY
@given(objects)
def test_every_object_in_the_canonical_form_has_its_keys_sorted_by_utf16(value):
    def check(pairs):
        keys = [key for key, _ in pairs]
        assert keys == sorted(keys, key=_utf16)
        return dict(pairs)

    encoded = canonical_json(value)
    json.loads(encoded, object_pairs_hook=check)


@PROPERTY
@given(objects, objects)
def test_different_values_have_different_hashes(a, b):
    assert (args_hash(a) == args_hash(b)) == (canonical_json(a) == canonical_json(b))
    if not _same(a, b):
        assert args_hash(a) != args_hash(b)


@PROPERTY
@given(objects)
def test_the_hash_is_the_sha256_of_the_canonical_bytes(value):
    digest = args_hash(value)
    assert digest == hashlib.sha256(canonical_json(value)).hexdigest()
    assert len(digest) == 64 and digest == digest.lower()


@PROPERTY
@given(st.integers(-MAX_SAFE, MAX_SAFE))
def test_an_integer_and_the_same_float_hash_alike(n):
    # RFC 8785 serialises numbers as ECMAScript does: 1 and 1.0 are both "1".
    assert args_hash({"n": n}) == args_hash({"n": float(n)})


@PROPERTY
@given(text.filter(lambda s: unicodedata.normalize("NFC", s) != unicodedata.normalize("NFD", s)))
def test_nfc_and_nfd_are_different_strings_with_different_hashes(s):
    # No Unicode normalisation: the hash is of the code points sent, as RFC 8785 says.
    nfc, nfd = unicodedata.normalize("NFC", s), unicodedata.normalize("NFD", s)
    assert args_hash({"s": nfc}) != args_hash({"s": nfd})


@PROPERTY
@given(values)
def test_nesting_is_hashed_structurally(value):
    # Wrapping a value changes the hash; the same wrapping of equal values does not.
    assert args_hash({"a": value}) != args_hash({"a": [value]})
    assert args_hash({"a": {"b": value}}) == args_hash({"a": {"b": json.loads(json.dumps(value))}})


def test_known_vectors():
    # Fixed points any implementation must agree on.
    assert (
        canonical_json({"b": 1, "a": [True, None, "é"]}) == '{"a":[true,null,"é"],"b":1}'.encode()
    )
    assert canonical_json({"n": -0.0}) == b'{"n":0}'
    assert canonical_json({"n": 1e21}) == b'{"n":1e+21}'
    assert canonical_json({"n": 0.1 + 0.2}) == b'{"n":0.30000000000000004}'
    assert canonical_json({"\u20ac": "\u0007"}) == '{"€":"\\u0007"}'.encode()
    # Keys sort by UTF-16 code units, not by code points: U+1F600 (a surrogate pair,
    # D83D DE00) comes before U+FFFD, where code point order would put it after.
    assert canonical_json({"\ufffd": 2, "\U0001f600": 1}).startswith('{"\U0001f600"'.encode())


@pytest.mark.parametrize(
    "value",
    [
        {"n": math.nan},
        {"n": math.inf},
        {"n": 2**64},
        {"s": "\ud800"},
        {1: "non-string key"},
        {"x": {1, 2}},
    ],
    ids=["nan", "inf", "huge int", "lone surrogate", "int key", "set"],
)
def test_what_rfc_8785_cannot_hold_is_refused(value):
    with pytest.raises(NotCanonicalizable):
        args_hash(value)


def test_an_integral_float_beyond_2_53_does_not_read_back_canonically():
    # Why the API (and the console's forms) refuse it: stored, it would read back as
    # an integer that RFC 8785 cannot represent, and its hash could not be recomputed.
    encoded = canonical_json({"n": 1e17})
    assert encoded == b'{"n":100000000000000000}'
    with pytest.raises(NotCanonicalizable):
        canonical_json(json.loads(encoded))


def test_ten_thousand_levels_are_refused_not_crashed_on():
    deep: list = []
    for _ in range(10_000):
        deep = [deep]
    with pytest.raises(NotCanonicalizable):
        canonical_json({"deep": deep})
